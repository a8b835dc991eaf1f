"""Builds the ``mpirun`` argument list for a dlcomm job.

The launcher, the tests and the benchmarks all start ranks through this one function, so
the flags Open MPI needs on a given machine (root, oversubscription, yielding idle ranks)
are decided in one place.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

from dlcomm.comm.machine import local_core_count

# Environment variables forwarded to every rank with ``-x`` when set in the launcher's env.
FORWARDED_PREFIXES = ("DLCOMM_", "OMP_", "PYTHON", "OPENBLAS_", "MKL_", "CUDA_", "NCCL_",
                      "MALLOC_")
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "HOME", "GLIBC_TUNABLES")

# glibc's malloc for every rank unless the user set GLIBC_TUNABLES (empty keeps glibc's own
# defaults): buffers up to 32 MiB from the heap, and freed memory kept for reuse, not handed
# back to the kernel. By default glibc returns large freed blocks and maps fresh pages for
# the next allocation, so a training step's tensor-sized arrays fault their pages in again
# every step, which stalls the rank that does it and every rank waiting for it
# (docs/launcher.md: top-k on 4x1gbit 10-15% faster).
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"

# Thread pools sized per rank unless the user set them: OpenMP (torch's intra-op pool),
# OpenBLAS (numpy's matmul in the compressors) and MKL. OpenBLAS threads busy-wait, so with
# 4 ranks x 2 default threads on 2 cores ACP-SGD's matmuls ran 2.5x slower (measured, see
# docs/launcher.md); torchrun sets OMP_NUM_THREADS=1 for the same reason.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def threads_per_rank(ranks_on_machine: int, cores: int) -> int:
    """Cores each of ``ranks_on_machine`` ranks gets when they share ``cores`` (at least 1)."""
    return max(1, cores // max(1, ranks_on_machine))


def forwarded_env_names(env: Mapping[str, str]) -> list[str]:
    """Names of variables in ``env`` that ranks need to see (sorted, for stable commands)."""
    return sorted(
        k for k in env if k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES)
    )


def build_mpirun_command(
    np: int,
    command: Sequence[str],
    *,
    hosts: str | None = None,
    hostfile: str | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    mpirun: str = "mpirun",
    is_root: bool | None = None,
    cores: int | None = None,
    forward_env: Sequence[str] = (),
) -> list[str]:
    """Return the mpirun argv that runs ``command`` on ``np`` ranks.

    Root and oversubscription flags are added only when needed: ``--allow-run-as-root``
    when running as root, and ``--oversubscribe --bind-to none`` plus
    ``mpi_yield_when_idle`` when a local job has more ranks than cores (spinning idle
    ranks otherwise starve the busy ones).

    When every rank runs on this machine (no hosts, or an emulated cluster, which sets
    ``DLCOMM_EMULATE``), ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS``
    not set by the user are passed as ``cores // np`` (at least 1), so thread pools of
    several ranks do not oversubscribe the cores. ``GLIBC_TUNABLES`` not set by the user is
    passed as ``MALLOC_TUNABLES`` (malloc keeps its memory for reuse).

    ``forward_env`` holds the user's own ``-x`` entries (``NAME`` or ``NAME=VALUE``); they
    are passed after the automatic ones, and a name the user gave is not forwarded twice.
    ``extra_args`` come after the automatic flags, and an MCA parameter or ``--bind-to``
    given again there replaces the earlier one (``last_flag_wins``): mpirun refuses a
    parameter listed twice.
    """
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ValueError(f"np must be a positive integer, got {np!r}")
    if not command:
        raise ValueError("no command to run: give the program and its arguments")
    if isinstance(forward_env, str):
        raise TypeError("forward_env must be a list of 'NAME' or 'NAME=VALUE' strings")
    user_names = set()
    for entry in forward_env:
        if not isinstance(entry, str) or not entry.split("=", 1)[0]:
            raise ValueError(f"forward_env entry {entry!r} is not 'NAME' or 'NAME=VALUE'")
        user_names.add(entry.split("=", 1)[0])
    env = os.environ if env is None else env
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    cores = local_core_count() if cores is None else cores
    argv = [mpirun, "-np", str(np)]
    if is_root:
        argv.append("--allow-run-as-root")
    if hosts:
        argv += ["-H", hosts]
    if hostfile:
        argv += ["--hostfile", hostfile]
    local_only = not hosts and not hostfile
    if local_only and np > cores:
        argv += ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"]
    for name in forwarded_env_names(env):
        if name not in user_names:
            argv += ["-x", name]
    if "GLIBC_TUNABLES" not in env and "GLIBC_TUNABLES" not in user_names:
        argv += ["-x", f"GLIBC_TUNABLES={MALLOC_TUNABLES}"]
    if local_only or env.get("DLCOMM_EMULATE"):
        threads = threads_per_rank(np, cores)
        for name in THREAD_VARIABLES:
            if name not in env and name not in user_names:
                argv += ["-x", f"{name}={threads}"]
    for entry in forward_env:
        argv += ["-x", entry]
    argv += list(extra_args)
    return [*last_flag_wins(argv), *command]


_MCA_FLAGS = ("--mca", "-mca")
_BIND_FLAGS = ("--bind-to", "-bind-to")


def last_flag_wins(options: Sequence[str]) -> list[str]:
    """``options`` with each ``--mca NAME VALUE`` and ``--bind-to WHERE`` kept only at its
    last occurrence, so a flag of the user's (given later) replaces dlcomm's default
    instead of making mpirun refuse the command. Other tokens are kept in order."""
    groups: list[tuple[tuple[str, ...] | None, list[str]]] = []
    i = 0
    while i < len(options):
        token = options[i]
        if token in _MCA_FLAGS and i + 2 < len(options):
            groups.append((("mca", options[i + 1]), list(options[i:i + 3])))
            i += 3
        elif token in _BIND_FLAGS and i + 1 < len(options):
            groups.append((("bind-to",), list(options[i:i + 2])))
            i += 2
        else:
            groups.append((None, [token]))
            i += 1
    last = {key: n for n, (key, _) in enumerate(groups) if key is not None}
    return [t for n, (key, tokens) in enumerate(groups) if key is None or last[key] == n
            for t in tokens]


def mpirun_available(mpirun: str = "mpirun") -> bool:
    """True when an ``mpirun`` executable is on PATH."""
    return shutil.which(mpirun) is not None
