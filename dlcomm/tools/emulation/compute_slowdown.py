"""A compute-only straggler for the emulated cluster (``--heterogeneity compute=H:SPEED``).

``cpu=H:SPEED`` (``heterogeneity.py``) duty-cycles *every* process of host H with SIGSTOP,
dlcomm's engine thread included, so it stalls communication as much as computation, which no
batch size can fix. ``compute=H:SPEED[:JITTER]`` slows only the code a training script wraps:
``dlcommrun`` hands the items to the ranks in ``DLCOMM_EMULATE_COMPUTE`` and each rank builds

    slow = ComputeSlowdown.from_env()  # a no-op unless this rank's host is named
    for batch in loader:
        with slow:                     # forward + backward
            loss = loss_fn(model(x), y)
            loss.backward()
        opt.step()

Before each block the rank sleeps ``(1/speed - 1) x`` the CPU time the calling thread spent
in the previous block (``time.thread_time``; the sleep itself not counted), so its compute
takes ``1/speed`` times as long while its network and engine thread run at full speed. CPU
time, not wall time: on a machine whose cores the emulated hosts share, a block's wall time
also holds the time it waited for a core, and multiplying that too made the straggler slower
whenever the other ranks were busy (under LB-BSP) than when they were idle (under BSP). With
more than one intra-op thread, the other threads' work is not counted. The sleep comes
*before* the forward pass: with wait-free backpropagation the all-reduces start during
backward, so a delay after backward would hide behind communication instead of delaying it.
The first block runs at full speed (nothing measured yet). *Spread mode* (``spread_over`` in
``dlcomm.tools.emulation.torch_slowdown``, the demo's default) sleeps inside the block instead, at
ticks on every layer and gradient, each for the work since the last tick: the host then
computes throughout its block at ``speed``, as a slower processor would, instead of idling
first and computing at full speed after. With ``JITTER`` the speed of
block ``t`` is drawn uniformly from ``SPEED +- JITTER`` (clipped to [0.05, 1]) by a numpy
Generator seeded from ``(seed, host)``, so every run draws the same sequence
(``compute_speeds``).
"""
from __future__ import annotations

import math
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from dlcomm.tools.emulation.plan import NAME_PREFIX

ENV_VAR = "DLCOMM_EMULATE_COMPUTE"
MIN_SPEED = 0.05  # at most 20x slower: a jittered draw never stalls a rank outright
_STREAM = 3  # numpy seed stream; congestion uses 1 and cpu duty cycles 2 (heterogeneity.py)
_HOSTNAME_RE = re.compile(rf"^{re.escape(NAME_PREFIX)}h(\d+)$")
_warned = False


@dataclass(frozen=True)
class ComputeStraggler:
    """Emulated host ``host`` computes at ``speed`` (+- ``jitter``) of its normal rate."""

    host: int
    speed: float
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.host, bool) or not isinstance(self.host, int) or self.host < 0:
            raise ValueError(f"compute host must be an emulated host index >= 0, got "
                             f"{self.host!r}")
        if not (math.isfinite(self.speed) and MIN_SPEED <= self.speed <= 1):
            raise ValueError(f"compute speed must be in [{MIN_SPEED}, 1] (1 = full speed, "
                             f"{MIN_SPEED} = {1 / MIN_SPEED:g}x slower), got {self.speed!r}")
        if not (math.isfinite(self.jitter) and self.jitter >= 0):
            raise ValueError(f"compute jitter must be >= 0, got {self.jitter!r}")


def jittered_speeds(rng: np.random.Generator, speed: float, jitter: float, count: int,
                    minimum: float) -> np.ndarray:
    """``count`` speeds drawn uniformly from ``speed +- jitter``, clipped to
    ``[minimum, 1]`` (no draw at all without jitter, so the stream stays reproducible)."""
    draw = rng.uniform(-jitter, jitter, count) if jitter else np.zeros(count)
    return np.clip(speed + draw, minimum, 1.0)


def iter_compute_speeds(item: ComputeStraggler, seed: int) -> Iterator[float]:
    """Endless speeds of host ``item.host``, one per compute block (pure, seeded)."""
    rng = np.random.default_rng([int(seed), _STREAM, item.host])
    while True:
        yield from (float(s) for s in jittered_speeds(rng, item.speed, item.jitter, 1024,
                                                      MIN_SPEED))


def compute_speeds(item: ComputeStraggler, seed: int, steps: int) -> np.ndarray:
    """The first ``steps`` speeds of ``iter_compute_speeds`` (what a rank will use)."""
    it = iter_compute_speeds(item, seed)
    return np.array([next(it) for _ in range(steps)], dtype=np.float64)


def format_compute_env(items: Sequence[ComputeStraggler], seed: int) -> str:
    """The ``DLCOMM_EMULATE_COMPUTE`` value for ``items``: ``H:SPEED:JITTER,...,seed=N``."""
    parts = [f"{i.host}:{i.speed!r}:{i.jitter!r}" for i in items]
    return ",".join([*parts, f"seed={int(seed)}"])


def parse_compute_env(text: str) -> tuple[list[ComputeStraggler], int]:
    """Parse a ``DLCOMM_EMULATE_COMPUTE`` value into its items and seed."""
    items: list[ComputeStraggler] = []
    seed = 0
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            if part.startswith("seed="):
                seed = int(part[len("seed="):])
                continue
            fields = part.split(":")
            if not 2 <= len(fields) <= 3:
                raise ValueError("expected H:SPEED[:JITTER]")
            items.append(ComputeStraggler(int(fields[0]), float(fields[1]),
                                          float(fields[2]) if len(fields) == 3 else 0.0))
        except ValueError as exc:
            raise ValueError(f"bad {ENV_VAR} item {part!r} in {text!r}: {exc} (dlcommrun "
                             "--heterogeneity compute=H:SPEED[:JITTER] sets it)") from None
    hosts = [i.host for i in items]
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"bad {ENV_VAR} {text!r}: a host is named twice")
    return items, seed


def emulated_host_index(hostname: str) -> int | None:
    """Index ``i`` of an emulated host named ``dlc-h<i>``, else None."""
    match = _HOSTNAME_RE.match(hostname)
    return int(match.group(1)) if match else None


class ComputeSlowdown:
    """Context manager that makes the blocks it wraps take ``1/speed`` times as long.

    By default it sleeps once before each block; with ``spread`` set (``spread_over``) it
    sleeps at each ``tick()`` inside the block instead. ``item`` None is a no-op (nothing
    timed, nothing slept). ``clock`` and ``sleep`` are
    injectable for tests. ``slept_s`` (total sleep), ``blocks`` (blocks run) and
    ``last_compute_s`` (the last block's CPU time on the calling thread, by the default
    ``clock``; without the sleep) tell what it did.
    """

    def __init__(self, item: ComputeStraggler | None = None, seed: int = 0, *,
                 clock: Callable[[], float] = time.thread_time,
                 sleep: Callable[[float], Any] = time.sleep) -> None:
        if item is not None and not isinstance(item, ComputeStraggler):
            raise TypeError(f"item must be a ComputeStraggler or None, got {item!r}")
        self.item = item
        self.seed = int(seed)
        self._speeds = iter_compute_speeds(item, self.seed) if item is not None else None
        self._clock = clock
        self._sleep = sleep
        self._start: float | None = None
        self._mark = 0.0  # CPU clock at the last tick of the current block (spread mode)
        self._work = 0.0  # CPU seconds between the current block's ticks (spread mode)
        self.spread = False  # set by spread_over(): sleep at tick() inside the block instead
        self.speed = 1.0  # speed of the current (or last) block
        self.last_compute_s = 0.0
        self.slept_s = 0.0
        self.blocks = 0

    @property
    def active(self) -> bool:
        """True when this rank is slowed."""
        return self._speeds is not None

    def __repr__(self) -> str:
        if self.item is None:
            return "ComputeSlowdown(off)"
        i = self.item
        return (f"ComputeSlowdown(host {i.host} at {i.speed:g} +- {i.jitter:g}, seed "
                f"{self.seed}: {self.blocks} blocks, slept {self.slept_s:.3f} s)")

    def __enter__(self) -> ComputeSlowdown:
        if self._speeds is None:
            return self
        if self._start is not None:
            raise RuntimeError("ComputeSlowdown blocks cannot nest")
        self.speed = next(self._speeds)
        if not self.spread:
            self._delay(self.last_compute_s)
        self._work = 0.0
        self._start = self._mark = self._clock()
        return self

    def __exit__(self, *exc: object) -> bool:
        if self._start is not None:
            if self.spread:
                self.tick()
                self.last_compute_s = self._work
            else:
                self.last_compute_s = max(0.0, self._clock() - self._start)
            self._start = None
            self.blocks += 1
        return False

    def _delay(self, work_s: float) -> None:
        delay = (1.0 / self.speed - 1.0) * work_s
        if delay > 0:
            self._sleep(delay)
            self.slept_s += delay

    def tick(self) -> None:
        """In spread mode, sleep ``(1/speed - 1) x`` the CPU time spent since the last tick.

        Called from hooks inside the block (``dlcomm.tools.emulation.torch_slowdown.spread_over``
        registers them on a model's layers and gradients), so a slowed host computes for the
        whole of its block, as a slower processor would, and each gradient appears when a
        host at that speed would produce it. Outside a block, when inactive, or in block
        mode, a no-op.
        """
        if self._start is None or not self.spread:
            return
        work = max(0.0, self._clock() - self._mark)
        self._work += work
        self._delay(work)
        self._mark = self._clock()  # a clock that counts the sleep must not count it as work

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, hostname: str | None = None, *,
                 clock: Callable[[], float] = time.thread_time,
                 sleep: Callable[[float], Any] = time.sleep,
                 stderr: IO[str] | None = None) -> ComputeSlowdown:
        """This rank's slowdown from ``DLCOMM_EMULATE_COMPUTE`` and its hostname.

        A no-op when the variable is absent or empty, or this host is not named in it. When
        the variable is set but the hostname is not ``dlc-h<i>`` (not under ``dlcommrun
        --emulate``), a no-op too, said once per process on stderr. A malformed value
        raises ValueError.
        """
        global _warned
        env = os.environ if env is None else env
        text = env.get(ENV_VAR, "").strip()
        if not text:
            return cls(None)
        items, seed = parse_compute_env(text)
        hostname = socket.gethostname() if hostname is None else hostname
        index = emulated_host_index(hostname)
        if index is None:
            if not _warned:
                _warned = True
                print(f"dlcomm: {ENV_VAR} is set but host {hostname!r} is not an emulated "
                      f"host ({NAME_PREFIX}h<i>): no compute slowdown",
                      file=sys.stderr if stderr is None else stderr, flush=True)
            return cls(None)
        mine = [i for i in items if i.host == index]
        return cls(mine[0] if mine else None, seed, clock=clock, sleep=sleep)
