"""``dlcommrun --emulate SPEC [--heterogeneity SPEC]``: run a job on the emulated cluster.

dlcommrun finds this module by name (``dlcomm.launcher.dlcommrun.EMULATION_PLUGIN``) and calls
``run_emulated``; the module builds the cluster (network namespaces, shaped links), starts the
heterogeneity schedule, and hands the job back to dlcommrun's ``launch`` with the cluster's
hosts, mpirun arguments and command prefix.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from dlcomm.launcher.dlcommrun import EXIT_USAGE
from dlcomm.tools.emulation.heterogeneity import heterogeneity, parse_heterogeneity, rank_env

# Looked up by name when a job starts (tests swap in a fake cluster module).
CLUSTER_MODULE = "dlcomm.tools.emulation.cluster"


def _slots_in_hosts(hosts: str) -> int:
    """Total slots in an ``-H`` list such as ``h0:2,h1:2`` (a host without a count is 1)."""
    total = 0
    for entry in hosts.split(","):
        _, _, slots = entry.partition(":")
        total += int(slots) if slots.isdigit() else 1
    return total


def run_emulated(opts: Any, env: dict[str, str], launch: Callable[..., int],
                 error: Callable[[str, int], int]) -> int:
    """Run dlcommrun's job (``opts``: its ``LaunchOptions``) inside the emulated cluster, or
    tear emulation down for ``--emulate down``; returns the exit code. ``launch(opts, env,
    hosts=, extra_args=, prefix=)`` starts mpirun; ``error(message, code)`` reports a failure."""
    emulate = importlib.import_module(CLUSTER_MODULE)
    error_type = getattr(emulate, "EmulationError", RuntimeError)
    try:
        if opts.emulate == "down":
            emulate.teardown_all()
            return 0
        if opts.hosts or opts.hostfile:
            return error("--emulate places the ranks itself: drop -H/--hostfile", EXIT_USAGE)
        spec = emulate.parse_spec(opts.emulate)
        ranks_env: dict[str, str] = {}
        if opts.heterogeneity:  # validate before building the cluster
            ranks_env = rank_env(parse_heterogeneity(opts.heterogeneity, spec.hosts))
        with emulate.emulated_cluster(spec, opts.slots_per_host,
                                      pin_hosts=opts.pin_hosts) as cluster:
            if opts.np is None:
                opts.np = _slots_in_hosts(cluster.hosts_arg)
            env.update(cluster.env)
            env.update(ranks_env)  # compute= stragglers are run by the ranks themselves
            job = dict(hosts=cluster.hosts_arg,
                       extra_args=[*cluster.mpirun_args, *opts.mpirun_args],
                       prefix=list(cluster.mpirun_prefix))
            if opts.heterogeneity:
                with heterogeneity(opts.heterogeneity, cluster):
                    return launch(opts, env, **job)
            return launch(opts, env, **job)
    except error_type as exc:
        return error(f"emulation failed: {exc}", 1)
