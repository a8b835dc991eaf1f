"""The faults ``dlcomm faults`` injects: a worker process killed, a whole emulated host
killed (every process in its network namespace), or a host's link cut (its interface down,
so its peers hear nothing: no reset, no FIN)."""
from __future__ import annotations

import os
import signal

from dlcomm.tools.emulation.netns import namespace_pids, run_command
from dlcomm.tools.emulation.plan import HOST_INTERFACE

KINDS = ("process", "host", "link")


def kill_process(pid: int) -> None:
    """SIGKILL one worker (no chance to say goodbye: its sockets are reset by the kernel)."""
    os.kill(pid, signal.SIGKILL)


def kill_host(namespace: str) -> list[int]:
    """SIGKILL every process on emulated host ``namespace``; the pids killed."""
    pids = namespace_pids(namespace)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def cut_link(namespace: str) -> None:
    """Take emulated host ``namespace``'s interface down: its processes live on, unheard."""
    run_command(["ip", "-n", namespace, "link", "set", HOST_INTERFACE, "down"])


def inject(kind: str, pid: int, host: str) -> str:
    """Inject fault ``kind`` on the worker ``pid`` running on emulated host ``host``; a line
    saying what was done."""
    if kind == "process":
        kill_process(pid)
        return f"killed worker pid {pid} on {host}"
    if kind == "host":
        return f"killed host {host} (pids {kill_host(host)})"
    if kind == "link":
        cut_link(host)
        return f"cut the link of host {host}"
    raise ValueError(f"fault kind must be one of {', '.join(KINDS)}, got {kind!r}")
