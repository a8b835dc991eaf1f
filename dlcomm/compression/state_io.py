"""A compressor's ``state_dict`` as flat named arrays, for checkpoint formats that store only
arrays under string keys (Keras' weights stores, MXNet's ``.params`` files).

``pack_state(state)`` returns ``{key: array}``: under ``key`` a uint8 array holding the JSON
of the nested structure (dicts with any keys, lists, tuples, numbers, strings, None) in which
every array (and numpy scalar) is replaced by a reference, and under ``key.<i>`` those
arrays. ``unpack_state(arrays, key)`` rebuilds the state exactly: dtypes, shapes, tuples and
non-string keys included, numbers bit for bit (floats through ``repr``).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

DEFAULT_KEY = "dlcomm_compression"


def _host(array: Any) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array.copy()
    if hasattr(array, "get"):  # CuPy: copy to the host
        return np.asarray(array.get())
    return np.array(array)


def pack_state(state: Any, key: str = DEFAULT_KEY) -> dict[str, np.ndarray]:
    """``state`` (nested dicts/lists/tuples of arrays, numbers, strings) as flat arrays."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty str, got {key!r}")
    arrays: list[np.ndarray] = []

    def encode(value: Any) -> Any:
        if isinstance(value, dict):
            return {"d": [[encode(k), encode(v)] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"t": [encode(v) for v in value]}
        if isinstance(value, list):
            return {"l": [encode(v) for v in value]}
        if isinstance(value, np.generic):
            arrays.append(np.asarray(value))
            return {"s": len(arrays) - 1}
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            arrays.append(_host(value))
            return {"a": len(arrays) - 1}
        if value is None or isinstance(value, (bool, int, str)):
            return {"v": value}
        if isinstance(value, float):
            return {"f": repr(value)}
        raise TypeError(f"compression state holds a {type(value).__name__}, which a "
                        "checkpoint cannot carry")

    text = json.dumps(encode(state))
    out = {key: np.frombuffer(text.encode(), dtype=np.uint8).copy()}
    out.update({f"{key}.{i}": a for i, a in enumerate(arrays)})
    return out


def unpack_state(arrays: Mapping[str, Any], key: str = DEFAULT_KEY) -> Any:
    """The state ``pack_state`` flattened under ``key``; ``KeyError`` when it is absent."""
    text = bytes(np.asarray(arrays[key], dtype=np.uint8)).decode()

    def array(i: int) -> np.ndarray:
        name = f"{key}.{i}"
        if name not in arrays:
            raise ValueError(f"the checkpoint's compression state lacks its array {name!r}")
        return np.array(arrays[name])

    def decode(node: dict) -> Any:
        (kind, value), = node.items()
        if kind == "d":
            return {_hashable(decode(k)): decode(v) for k, v in value}
        if kind == "t":
            return tuple(decode(v) for v in value)
        if kind == "l":
            return [decode(v) for v in value]
        if kind == "s":
            return array(value)[()]
        if kind == "a":
            return array(value)
        if kind == "f":
            return float(value)
        if kind == "v":
            return value
        raise ValueError(f"unknown entry {kind!r} in the checkpoint's compression state")

    return decode(json.loads(text))


def _hashable(value: Any) -> Any:
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else value


def state_keys(keys: Any, key: str = DEFAULT_KEY) -> list[str]:
    """Which of ``keys`` belong to a state packed under ``key``."""
    return [k for k in keys if k == key or k.startswith(key + ".")]
