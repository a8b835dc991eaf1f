"""Side effects of the emulated cluster: run ip/tc, find what exists, take it all down.

Only objects named ``dlc-*`` are ever touched: namespaces, root-namespace links,
``/etc/netns/dlc-*`` (the per-host /etc/hosts that ``ip netns exec`` binds in) and the
``dlc-emulate-*`` script folders, plus processes still running inside ``dlc-*`` namespaces
(ranks of a crashed or interrupted job), which would otherwise keep a namespace alive.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from dlcomm.tools.emulation.plan import NAME_PREFIX, teardown_commands

NEEDS_ROOT_MESSAGE = "--emulate needs root and iproute2; run as root or with sudo"
NETNS_ETC = Path("/etc/netns")
WORKDIR_PREFIX = "dlc-emulate-"
COMMAND_TIMEOUT_S = 30.0
LOCK_PATH = Path("/run/dlc-emulate.lock")


class EmulationError(RuntimeError):
    """The emulated cluster could not be built or used (privileges, tools, a failed command)."""


def require_privileges() -> None:
    """Raise EmulationError unless we are root and ip, tc and unshare are installed."""
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        detail = f" (missing: {', '.join(missing)})" if missing else " (not root)"
        raise EmulationError(NEEDS_ROOT_MESSAGE + detail)


def run_command(cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run one ip/tc command under a timeout; with ``check`` a failure raises EmulationError."""
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except FileNotFoundError as exc:
        raise EmulationError(f"{NEEDS_ROOT_MESSAGE} ({exc.filename} not found)") from exc
    except subprocess.TimeoutExpired as exc:
        raise EmulationError(f"{' '.join(cmd)} did not finish in {COMMAND_TIMEOUT_S}s") from exc
    if check and proc.returncode != 0:
        raise EmulationError(
            f"emulated cluster setup failed: `{' '.join(cmd)}` exited {proc.returncode}: "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc


def run_commands(cmds: Sequence[Sequence[str]]) -> None:
    """Run commands in order, stopping at the first failure (EmulationError)."""
    for cmd in cmds:
        run_command(cmd)


def list_namespaces() -> list[str]:
    """Names of existing ``dlc-*`` network namespaces."""
    proc = run_command(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(NAME_PREFIX))


def list_root_links() -> list[str]:
    """Names of ``dlc-*`` links in the root namespace (none unless something went astray)."""
    proc = run_command(["ip", "-o", "link", "show"], check=False)
    links = []
    for line in proc.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(NAME_PREFIX):
                links.append(name)
    return sorted(links)


def namespace_pids(namespace: str) -> list[int]:
    """Processes running inside ``namespace`` (``ip netns pids``)."""
    proc = run_command(["ip", "netns", "pids", namespace], check=False)
    return [int(tok) for tok in proc.stdout.split() if tok.isdigit() and int(tok) != os.getpid()]


def kill_namespace_processes(namespaces: Sequence[str], grace_s: float = 2.0) -> None:
    """SIGTERM every process left in ``namespaces``, then SIGKILL those still alive after grace."""
    pids = [pid for ns in namespaces for pid in namespace_pids(ns)]
    if not pids:
        return
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    _signal_all([p for p in pids if _alive(p)], signal.SIGKILL)


def _signal_all(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child counts as gone: it holds no namespace resources.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


@contextmanager
def emulation_lock(wait_s: float = 0.0) -> Iterator[None]:
    """Hold the machine-wide lock of the emulated cluster (names are fixed: one at a time).

    Waits up to ``wait_s`` seconds for another emulation to finish, then raises
    EmulationError naming the holder. The kernel drops the lock when its holder dies, so a
    crashed run never blocks the next one.
    """
    if wait_s < 0:
        raise ValueError(f"wait_s must be >= 0, got {wait_s}")
    handle = open(LOCK_PATH, "a+")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "unknown"
                    raise EmulationError(
                        f"another emulated cluster is running (pid {holder}); wait for it to "
                        "finish, or remove it with `dlcommrun --emulate down`"
                    ) from exc
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield
    finally:
        handle.close()


def write_netns_hosts(namespaces: Sequence[str], text: str) -> None:
    """Write ``/etc/netns/<ns>/hosts`` so ``ip netns exec`` shows ``text`` as /etc/hosts."""
    for ns in namespaces:
        if not ns.startswith(NAME_PREFIX):
            raise ValueError(f"refusing to write /etc/netns/{ns}: only {NAME_PREFIX}* is ours")
        folder = NETNS_ETC / ns
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "hosts").write_text(text)


def make_workdir() -> str:
    """A fresh temp folder for the agent scripts, named so teardown finds it."""
    return tempfile.mkdtemp(prefix=WORKDIR_PREFIX)


def teardown_everything() -> None:
    """Remove every ``dlc-*`` namespace, root link, /etc/netns entry and script folder.

    Idempotent: safe with nothing to remove, and after a crashed run. Failures of single
    deletions are ignored so that one odd leftover does not block removing the rest.
    """
    namespaces = list_namespaces()
    kill_namespace_processes(namespaces)
    for cmd in teardown_commands(namespaces, list_root_links()):
        run_command(cmd, check=False)
    if NETNS_ETC.is_dir():
        for entry in NETNS_ETC.glob(NAME_PREFIX + "*"):
            shutil.rmtree(entry, ignore_errors=True)
    for entry in Path(tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        shutil.rmtree(entry, ignore_errors=True)
