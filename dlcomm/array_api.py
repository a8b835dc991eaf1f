"""Array-namespace dispatch: one code path for numpy and CuPy arrays.

``array_namespace(x)`` returns the module that owns ``x`` (numpy or cupy), so compressors
write ``xp = array_namespace(x)`` once and call ``xp.abs``, ``xp.argpartition``, ... on it.
Random numbers that must agree across ranks are drawn on the host with numpy from a seed
derived from the tensor name (``name_seed``), then moved to the array's device.
"""
from __future__ import annotations

import types
import zlib

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def array_namespace(x: object) -> types.ModuleType:
    """Return ``numpy`` or ``cupy`` for an array ``x``; TypeError for anything else."""
    if isinstance(x, np.ndarray):
        return np
    module = type(x).__module__.split(".")[0]
    if module == "cupy":
        import cupy  # noqa: PLC0415 - optional, only for CuPy arrays

        return cupy
    raise TypeError(
        f"expected a numpy.ndarray or cupy.ndarray, got {type(x).__name__}; convert framework "
        "tensors to arrays (zero copy via DLPack) before compressing"
    )


def to_host(x: object) -> np.ndarray:
    """Return ``x`` as a numpy array (a device-to-host copy for CuPy, no copy for numpy)."""
    xp = array_namespace(x)
    return x if xp is np else xp.asnumpy(x)


def from_host(host: np.ndarray, like: object) -> object:
    """Return the numpy array ``host`` on the device of ``like`` (no copy when numpy)."""
    xp = array_namespace(like)
    return host if xp is np else xp.asarray(host)


def name_seed(seed: int, name: str, *extra: int) -> np.random.Generator:
    """A host RNG that is the same on every rank for the same (seed, tensor name, extra...).

    Python's ``hash`` is salted per process, so the name is hashed with CRC-32 instead.
    """
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), *map(int, extra)])


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype maths runs in: float32 for float16 inputs (precision, speed), else ``dtype``."""
    return np.dtype(np.float32) if np.dtype(dtype) == np.float16 else np.dtype(dtype)


def scale_into(src: object, factor: float, out: object) -> None:
    """``out[...] = src * factor``, computed as Horovod scales on the CPU: float16 in float32,
    integers in float64, then rounded (integers truncated) once into ``out``'s dtype."""
    xp = array_namespace(out)
    kind = np.dtype(src.dtype).kind  # type: ignore[attr-defined]
    dtype = (np.float32 if np.dtype(src.dtype) == np.float16  # type: ignore[attr-defined]
             else np.float64 if kind in "iub" else None)
    xp.multiply(src, factor, out=out, dtype=dtype, casting="unsafe")
