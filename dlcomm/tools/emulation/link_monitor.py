"""Bytes and queue of one emulated host's link, read from its two tbf shapers while a job runs.

Each emulated host's link is shaped twice (``emulate_plan.setup_commands``): its outgoing
traffic by the tbf on ``dlc-eth0`` inside its namespace, its incoming traffic by the tbf on
its bridge port ``dlc-p<H>``. ``tc -s qdisc show`` reports, for each, the bytes sent so far
and the bytes queued (backlog). Sampling both during a benchmark tells how many bytes a step
puts through a (congested) link, how fast the link actually ran, and how long its queue got,
which is what the DLCP analysis in docs/heterogeneity.md needed to check.
"""
from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dlcomm.tools.emulation.plan import (
    BRIDGE_NAMESPACE,
    HOST_INTERFACE,
    bridge_port,
    host_namespace,
)

_SENT_RE = re.compile(r"Sent (\d+) bytes")
_BACKLOG_RE = re.compile(r"backlog (\d+)([KMG]?)b")
# iproute2 prints a size with a K/M/G suffix (powers of 1024) only when it divides exactly
_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


@dataclass(frozen=True)
class LinkSample:
    """One reading of host ``H``'s shapers at wall-clock time ``t`` (``time.time()``)."""

    t: float
    out_sent: int
    out_backlog: int
    in_sent: int
    in_backlog: int


def parse_tbf_stats(text: str) -> tuple[int, int]:
    """(bytes sent, bytes queued) from ``tc -s qdisc show dev D`` output."""
    sent, backlog = _SENT_RE.search(text), _BACKLOG_RE.search(text)
    if sent is None or backlog is None:
        raise ValueError(f"no 'Sent N bytes' and 'backlog Nb' in tc output: {text[:200]!r}")
    return int(sent.group(1)), int(backlog.group(1)) * _UNIT[backlog.group(2)]


def shaper_commands(host: int) -> tuple[list[str], list[str]]:
    """The ``tc`` commands reading host ``host``'s outgoing and incoming shapers."""
    if isinstance(host, bool) or not isinstance(host, int) or host < 0:
        raise ValueError(f"host must be an emulated host index >= 0, got {host!r}")
    return (["tc", "-s", "-n", host_namespace(host), "qdisc", "show", "dev", HOST_INTERFACE],
            ["tc", "-s", "-n", BRIDGE_NAMESPACE, "qdisc", "show", "dev", bridge_port(host)])


def read_link(host: int) -> LinkSample:
    """Read host ``host``'s two shapers once (needs the emulated cluster and root)."""
    t = time.time()
    values = []
    for cmd in shaper_commands(host):
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({res.stderr.strip()}): is this job "
                               f"running under dlcommrun --emulate with a host {host}?")
        values += parse_tbf_stats(res.stdout)
    return LinkSample(t, values[0], values[1], values[2], values[3])


class LinkMonitor:
    """Samples host ``host``'s link every ``interval`` seconds in a background thread
    (each sample runs two ``tc`` processes, a few ms of CPU) between ``start`` and ``stop``."""

    def __init__(self, host: int, interval: float = 0.005) -> None:
        shaper_commands(host)  # validates host
        if not interval > 0:
            raise ValueError(f"interval must be > 0, got {interval!r}")
        self.host, self.interval = host, float(interval)
        self.samples: list[LinkSample] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LinkMonitor:
        """Take a first sample (so a bad host fails here) and sample on until ``stop``."""
        self.samples.append(read_link(self.host))
        self._thread = threading.Thread(target=self._run, name="dlcomm-link-monitor",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self.samples.append(read_link(self.host))
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> list[LinkSample]:
        """Stop sampling; re-raise what went wrong in the thread, if anything."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"link monitor of host {self.host} failed: {self.error}")
        return self.samples


def summarize_window(samples: Sequence[LinkSample], start: float, end: float,
                     steps: int) -> dict[str, float]:
    """What host H's link did between wall-clock ``start`` and ``end`` (``steps`` steps):
    megabytes per step and Mbit/s each way (from the first and last sample inside the
    window), and the peak backlog in kB. Needs two samples inside the window."""
    inside = [s for s in samples if start <= s.t <= end]
    if len(inside) < 2 or steps < 1:
        raise ValueError(f"need >= 2 samples inside the window and steps >= 1, got "
                         f"{len(inside)} samples, {steps} steps")
    first, last = inside[0], inside[-1]
    span = last.t - first.t
    scale = (end - start) / span / steps  # bytes between the samples -> bytes per step
    return {
        "out_mb_per_step": (last.out_sent - first.out_sent) * scale / 1e6,
        "in_mb_per_step": (last.in_sent - first.in_sent) * scale / 1e6,
        "out_mbit_s": (last.out_sent - first.out_sent) * 8 / span / 1e6,
        "in_mbit_s": (last.in_sent - first.in_sent) * 8 / span / 1e6,
        "peak_out_backlog_kb": max(s.out_backlog for s in inside) / 1e3,
        "peak_in_backlog_kb": max(s.in_backlog for s in inside) / 1e3,
    }
