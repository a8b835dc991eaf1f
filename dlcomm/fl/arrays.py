"""Named arrays: a model's weights (or an update, or a client's state) as an ordered mapping
from a name to a numpy array, the one currency of ``dlcomm.fl``.

The core never sees a framework tensor; an adapter turns a module into named arrays and back.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

NamedArrays = dict[str, np.ndarray]


def check_named_arrays(arrays: object, what: str) -> NamedArrays:
    """``arrays`` as a dict of numpy arrays keyed by non-empty str names, in its own order;
    a TypeError or ValueError names ``what`` and the offending entry."""
    if not isinstance(arrays, Mapping):
        raise TypeError(f"{what} must be a mapping from names to numpy arrays, "
                        f"got {type(arrays).__name__}")
    if not arrays:
        raise ValueError(f"{what} is empty: give at least one named array")
    out: NamedArrays = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"{what}: names must be non-empty str, got {name!r}")
        if not isinstance(value, np.ndarray):
            raise TypeError(f"{what}[{name!r}] must be a numpy array, got {type(value).__name__}")
        if value.dtype.kind != "f":
            raise TypeError(f"{what}[{name!r}] must hold floats, got dtype {value.dtype}")
        out[name] = value
    return out


def check_same_layout(arrays: Mapping[str, np.ndarray], like: Mapping[str, np.ndarray],
                      what: str) -> None:
    """Raise ValueError unless ``arrays`` has exactly ``like``'s names and shapes."""
    missing = [n for n in like if n not in arrays]
    extra = [n for n in arrays if n not in like]
    if missing or extra:
        raise ValueError(f"{what} must have the model's names: missing {missing}, "
                         f"unexpected {extra}")
    for name, ref in like.items():
        if np.shape(arrays[name]) != ref.shape:
            raise ValueError(f"{what}[{name!r}] has shape {np.shape(arrays[name])}, "
                             f"the model's is {ref.shape}")


def copy_arrays(arrays: Mapping[str, np.ndarray], dtype: np.dtype | None = None) -> NamedArrays:
    """A deep copy (optionally cast to ``dtype``), so callers may keep or change it."""
    return {n: np.array(a, dtype=dtype or a.dtype, copy=True) for n, a in arrays.items()}


def zeros_like(arrays: Mapping[str, np.ndarray], dtype: np.dtype = np.float64) -> NamedArrays:
    """Zero arrays of the same names and shapes (float64 by default: sums accumulate there)."""
    return {n: np.zeros(a.shape, dtype=dtype) for n, a in arrays.items()}


def nbytes(arrays: Mapping[str, np.ndarray]) -> int:
    """Bytes held by the arrays."""
    return int(sum(a.nbytes for a in arrays.values()))
