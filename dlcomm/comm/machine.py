"""Which ranks share a machine's cores.

Where a machine runs more ranks than it has cores (a laptop, this project's 2-core VM, the
emulated cluster, whose hosts are network namespaces of one kernel), a rank that spends CPU
waiting takes it from the ranks it waits for. The launcher sizes thread pools by the core
count. Where such ranks also reach each other over a network, MPI moves their bytes only
inside the tests of a waiting rank: the engine and ``auto`` then use the TCP mesh, whose
waits sleep in the kernel.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def machine_id() -> str:
    """The running kernel's boot id: the same for every process on one machine, also across
    containers and network namespaces (the emulated cluster's hosts), which share its cores;
    the host name where there is none."""
    try:
        return BOOT_ID.read_text().strip() or socket.gethostname()
    except OSError:  # pragma: no cover - non-Linux
        return socket.gethostname()


def usable_cpus() -> tuple[int, ...]:
    """The CPU numbers this process may run on."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return tuple(range(os.cpu_count() or 1))


def local_core_count() -> int:
    """Cores this process may run on (affinity-aware), at least 1."""
    return max(1, len(usable_cpus()))


def oversubscribed(ranks: Iterable[tuple[str, Sequence[int]]]) -> bool:
    """True if some machine runs more ranks than the cores they may use together, given
    each rank's ``(machine_id(), usable_cpus())``."""
    ranks_per_machine: dict[str, int] = {}
    cpus_per_machine: dict[str, set[int]] = {}
    for machine, cpus in ranks:
        ranks_per_machine[machine] = ranks_per_machine.get(machine, 0) + 1
        cpus_per_machine.setdefault(machine, set()).update(cpus)
    return any(count > max(1, len(cpus_per_machine[machine]))
               for machine, count in ranks_per_machine.items())


def oversubscribed_across_hosts(ranks: Sequence[tuple[str, Sequence[int], str]]) -> bool:
    """True if some machine runs more ranks than its cores and the ranks span several hosts
    (host names), given each rank's ``(machine_id(), usable_cpus(), host name)``."""
    return (len({host for _, _, host in ranks}) > 1
            and oversubscribed((machine, cpus) for machine, cpus, _ in ranks))


def crowded_across_hosts(comm: Any) -> bool:
    """``oversubscribed_across_hosts`` for the ranks of ``comm``: where the TCP mesh pays
    (on one crowded host MPI's shared memory does better; docs/collectives.md). Collective
    (an all-gather); every rank gets the same answer."""
    return oversubscribed_across_hosts(
        comm.allgather((machine_id(), usable_cpus(), socket.gethostname())))
