"""How a flat buffer is cut into per-rank blocks: counts as equal as possible, and offsets."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def equal_counts(total: int, parts: int) -> list[int]:
    """Split ``total`` elements into ``parts`` counts that differ by at most one.

    The first ``total % parts`` blocks get the extra element, so every rank computes the
    same split from ``total`` alone.
    """
    if not isinstance(total, (int, np.integer)) or total < 0:
        raise ValueError(f"total must be a non-negative integer, got {total!r}")
    if not isinstance(parts, (int, np.integer)) or parts < 1:
        raise ValueError(f"parts must be a positive integer, got {parts!r}")
    base, extra = divmod(int(total), int(parts))
    return [base + 1 if i < extra else base for i in range(int(parts))]


def displacements(counts: Sequence[int]) -> list[int]:
    """Offsets of each block and the end: ``len(counts) + 1`` values starting at 0."""
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + int(count))
    return offsets


def validate_counts(counts: object, size: int) -> list[int]:
    """Check that ``counts`` has one non-negative integer per rank; return it as a list."""
    if isinstance(counts, (str, bytes)) or not hasattr(counts, "__len__"):
        raise TypeError(f"counts must be a sequence of integers, got {type(counts).__name__}")
    values = list(counts)  # type: ignore[call-overload]
    if len(values) != size:
        raise ValueError(
            f"counts has {len(values)} entries but the communicator has {size} ranks; "
            "give one count per rank"
        )
    for i, count in enumerate(values):
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
            raise TypeError(f"counts[{i}] must be an integer, got {count!r}")
        if count < 0:
            raise ValueError(f"counts[{i}] must be >= 0, got {count}")
    return [int(c) for c in values]
