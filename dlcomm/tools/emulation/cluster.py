"""``dlcommrun --emulate HOSTSxRATE``: run a job on emulated hosts joined by a shaped network.

``emulated_cluster(spec)`` builds one network namespace per host (own hostname, own
/etc/hosts), a bridge in a namespace of its own, and a tbf-shaped veth per host in both
directions; it yields the ``Cluster`` arguments that make ``mpirun`` place ranks there and
keep their traffic on the emulated links, and tears everything down on exit, on exceptions,
on Ctrl-C and on SIGTERM. ``teardown_all()`` is ``dlcommrun --emulate down``.
See docs/emulated_cluster.md for the layout and measured behaviour.
"""
from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from dlcomm.comm.machine import local_core_count
from dlcomm.tools.emulation.agent import write_agent_scripts
from dlcomm.tools.emulation.netns import (
    EmulationError,
    emulation_lock,
    make_workdir,
    require_privileges,
    run_commands,
    teardown_everything,
    write_netns_hosts,
)
from dlcomm.tools.emulation.plan import (
    EmulationSpec,
    host_address,
    host_core_sets,
    host_names,
    hosts_arg,
    hosts_file_text,
    mpirun_args,
    parse_spec,
    setup_commands,
)

__all__ = [
    "Cluster",
    "EmulationError",
    "EmulationSpec",
    "emulated_cluster",
    "parse_spec",
    "teardown_all",
]


@dataclass(frozen=True)
class Cluster:
    """What a launcher needs to run ``mpirun`` on the emulated hosts.

    Run ``[*mpirun_prefix, *mpirun_argv]`` with ``env`` merged into the environment, where
    the mpirun argv carries ``-H hosts_arg`` and ``mpirun_args``. ``mpirun`` itself runs on
    host 0 (its namespace and hostname), since the root namespace has no route to the
    emulated network. ``exec_prefix(i)`` runs any other command on host ``i``.
    """

    spec: EmulationSpec
    slots_per_host: int
    hosts_arg: str
    mpirun_args: list[str]
    env: dict[str, str]
    mpirun_prefix: list[str]
    host_names: list[str] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    nsrun_path: str = ""
    core_sets: list[list[int]] = field(default_factory=list)  # per host; empty: unpinned

    def exec_prefix(self, index: int) -> list[str]:
        """argv prefix that runs a command on emulated host ``index``."""
        if not isinstance(index, int) or not 0 <= index < len(self.host_names):
            raise ValueError(f"host index must be 0..{len(self.host_names) - 1}, got {index!r}")
        return [self.nsrun_path, self.host_names[index]]


def teardown_all() -> None:
    """Remove every namespace, bridge, veth and file this module could have created.

    Idempotent; also kills processes left inside ``dlc-*`` namespaces by a crashed job.
    """
    require_privileges()
    teardown_everything()


class _Terminated(BaseException):
    """Raised in the main thread on SIGTERM/SIGHUP so that ``finally`` blocks tear down."""


@contextmanager
def _signals_unwind() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception while the cluster exists (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise _Terminated(f"received signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def emulated_cluster(
    spec: EmulationSpec, slots_per_host: int = 1, *, wait_s: float = 0.0,
    pin_hosts: bool = False,
) -> Iterator[Cluster]:
    """Build the emulated cluster for ``spec``, yield its ``Cluster``, always tear it down.

    Only one emulated cluster can exist per machine: with another one running this waits up
    to ``wait_s`` seconds, then raises EmulationError. A leftover emulation from a crashed
    run is removed first. Raises EmulationError when not
    root, when ip/tc are missing or when a setup command fails (after tearing down).
    SIGTERM and SIGHUP inside the block end it like an exception (after teardown the
    process exits by re-raising, status 1); Ctrl-C raises KeyboardInterrupt as usual.

    ``pin_hosts`` gives each host its own cores (``host_core_sets``: every process of host
    i, ranks and their threads included, runs on its set only), so that emulated hosts stop
    competing for the same cores as separate machines would not; EmulationError when there
    are fewer usable cores than hosts or ``taskset`` is missing.
    """
    if not isinstance(spec, EmulationSpec):
        raise TypeError(f"expected an EmulationSpec (use parse_spec), got {type(spec).__name__}")
    cores = local_core_count()
    names = host_names(spec)
    args_check = hosts_arg(spec, slots_per_host)  # validates slots_per_host before any change
    core_sets: list[list[int]] = []
    if pin_hosts:
        try:
            core_sets = host_core_sets(spec.hosts, sorted(os.sched_getaffinity(0)))
        except ValueError as exc:
            raise EmulationError(str(exc)) from None
        if shutil.which("taskset") is None:
            raise EmulationError("--pin-hosts needs taskset (Debian package util-linux)")
    require_privileges()
    with _signals_unwind(), emulation_lock(wait_s):
        teardown_everything()
        try:
            workdir = make_workdir()
            nsrun, rsh = write_agent_scripts(workdir, core_sets)
            write_netns_hosts(names, hosts_file_text(spec))
            run_commands(setup_commands(spec))
            yield Cluster(
                spec=spec,
                slots_per_host=slots_per_host,
                hosts_arg=args_check,
                mpirun_args=mpirun_args(spec, slots_per_host, rsh, cores),
                env={"DLCOMM_EMULATE": f"{spec.hosts}x{spec.rate_text}"},
                mpirun_prefix=[nsrun, names[0]],
                host_names=names,
                addresses=[host_address(i) for i in range(spec.hosts)],
                nsrun_path=nsrun,
                core_sets=core_sets,
            )
        finally:
            teardown_everything()
