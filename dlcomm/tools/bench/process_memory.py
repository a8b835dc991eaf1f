"""Peak memory of a whole process tree, read from /proc while it runs (Linux).

A benchmark side may be many processes (MPI ranks under mpirun; Ray's driver, raylet, GCS and
workers), so ``TreeMemorySampler`` polls every process in the started process's session or
below it and keeps the peak of their summed resident set (RSS, which counts shared pages once
per process) and proportional set (PSS, which splits shared pages among their users).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id) of ``pid``, or None if it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the command may contain spaces
    return int(rest[1]), int(rest[3])


def _kib_field(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_bytes(pid: int) -> int:
    return _kib_field(PROC / str(pid) / "status", "VmRSS:")


def pss_bytes(pid: int) -> int:
    return _kib_field(PROC / str(pid) / "smaps_rollup", "Pss:")


def peak_rss_of_self() -> int:
    """This process's own peak resident memory (VmHWM)."""
    return _kib_field(PROC / "self" / "status", "VmHWM:")


def tree_pids(root: int) -> list[int]:
    """``root``, its descendants, and every process in ``root``'s session."""
    parents: dict[int, int] = {}
    sessions: dict[int, int] = {}
    for entry in os.listdir(PROC):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                parents[int(entry)], sessions[int(entry)] = fields
    if root not in parents:
        return []
    found = {root} | {p for p, s in sessions.items() if s == sessions[root]}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(found)


class TreeMemorySampler:
    """Polls the process tree of ``root`` every ``interval`` seconds in a thread; the peak
    sums are in ``peak_rss`` and ``peak_pss`` (bytes), the most processes in ``peak_count``."""

    def __init__(self, root: int, interval: float = 0.2) -> None:
        self.root = root
        self.interval = interval
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def sample(self) -> None:
        pids = tree_pids(self.root)
        self.peak_rss = max(self.peak_rss, sum(rss_bytes(p) for p in pids))
        self.peak_pss = max(self.peak_pss, sum(pss_bytes(p) for p in pids))
        self.peak_count = max(self.peak_count, len(pids))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
