"""Sizes and bandwidths as the benchmarks read and print them.

Sizes come from the command line as ``8``, ``1K``, ``4M``, ``64M`` (powers of 1024, as
nccl-tests reads them); bandwidths follow nccl-tests: ``algbw = bytes / time`` and
``busbw = algbw x factor``, where the factor makes the figure comparable to the link's
speed whatever the collective and the number of ranks.
"""
from __future__ import annotations

import numbers
import re

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)

# Collectives the benchmarks know; the bus factor of each, as a function of the rank count.
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall")


def parse_size(text: str) -> int:
    """Parse a positive byte count: ``8``, ``1K``, ``4M``, ``64M``, ``2G`` (also ``4MiB``)."""
    if isinstance(text, bool) or not isinstance(text, (str, numbers.Integral)):
        raise TypeError(f"a size must be a string such as '4M' or an int, got "
                        f"{type(text).__name__}")
    match = _SIZE_RE.match(str(text))
    if match is None:
        raise ValueError(f"bad size {text!r}: use a whole number of bytes with an optional "
                         "suffix K, M or G (powers of 1024), e.g. 8, 1K, 4M, 64M")
    value = int(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if value < 1:
        raise ValueError(f"bad size {text!r}: must be at least 1 byte")
    return value


def parse_size_list(text: str) -> list[int]:
    """Parse a comma-separated list of sizes, e.g. ``4K,64M``."""
    if not isinstance(text, str):
        raise TypeError(f"a size list must be a string such as '4K,64M', got "
                        f"{type(text).__name__}")
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("empty size list: give sizes such as 4K,64M")
    return [parse_size(p) for p in parts]


def size_range(begin: int, end: int, factor: int) -> list[int]:
    """Sizes ``begin, begin*factor, ...`` up to and including ``end`` (as nccl-tests -b -e -f)."""
    for name, value in (("begin", begin), ("end", end), ("factor", factor)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if begin < 1:
        raise ValueError(f"the smallest size (-b) must be at least 1 byte, got {begin}")
    if end < begin:
        raise ValueError(f"the largest size (-e, {end} B) is smaller than the smallest "
                         f"(-b, {begin} B)")
    if factor < 2:
        if begin != end:
            raise ValueError(f"the size factor (-f) must be at least 2, got {factor}")
        return [begin]
    sizes = []
    size = begin
    while size <= end:
        sizes.append(size)
        size *= factor
    return sizes


def format_size(nbytes: int) -> str:
    """A byte count the way a reader says it: ``512B``, ``4KiB``, ``1.5MiB``, ``64MiB``."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
        raise ValueError(f"expected a non-negative whole number of bytes, got {nbytes!r}")
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{nbytes}B"


def bus_factor(collective: str, ranks: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth.

    all-reduce ``2(n-1)/n``; all-gather, reduce-scatter and all-to-all ``(n-1)/n``;
    broadcast ``1``.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if isinstance(ranks, bool) or not isinstance(ranks, numbers.Integral) or ranks < 1:
        raise ValueError(f"ranks must be a positive int, got {ranks!r}")
    if collective == "allreduce":
        return 2 * (ranks - 1) / ranks
    if collective == "broadcast":
        return 1.0
    return (ranks - 1) / ranks


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second): ``nbytes / seconds``."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return nbytes / seconds / 1e9


def busbw(collective: str, nbytes: int, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s: ``algbw x bus_factor(collective, ranks)``."""
    return algbw(nbytes, seconds) * bus_factor(collective, ranks)
