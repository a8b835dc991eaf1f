"""dlcomm's C++ kernels (``native/*.cpp``, built by setup.py as ``dlcomm._native``) for numpy.

Each function here equals a numpy reference bit for bit (``tests/unit/test_kernels.py``) and runs
the reference itself when the library is not built, was disabled with ``DLCOMM_NATIVE=0``, or
is given arrays it does not handle. So callers need no branch of their own; ``available()``
tells whether the kernels are in use. ``DLCOMM_NATIVE_THREADS`` (or ``set_num_threads``) sets
the OpenMP threads of the kernels (default: the cores divided among the host's MPI ranks, all
cores outside MPI); workers sleep when idle (OMP_WAIT_POLICY=PASSIVE unless set). Loaded
with ctypes from the extension's file: no Python objects cross its C ABI.

``python -m dlcomm.tools.bench.kernels bench`` prints numpy vs native (vs torch) GB/s; see
docs/native.md.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from typing import Any

import numpy as np

from dlcomm import array_api
from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits

ABI_VERSION = 1
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
SIGN_DTYPES = {np.dtype(np.float16): 0, np.dtype(np.float32): 1, np.dtype(np.float64): 2}
_VOID_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURES = {
    "dlc_abi_version": (_INT, []),
    "dlc_set_num_threads": (None, [_INT]),
    "dlc_get_num_threads": (_INT, []),
    "dlc_simd_available": (_INT, []),
    "dlc_set_simd": (None, [_INT]),
    "dlc_f32_to_f16": (None, [_VOID_P, _VOID_P, _I64]),
    "dlc_f16_to_f32": (None, [_VOID_P, _VOID_P, _I64]),
    "dlc_f16_add_inplace": (None, [_VOID_P, _VOID_P, _I64]),
    "dlc_f32_to_bf16": (None, [_VOID_P, _VOID_P, _I64]),
    "dlc_bf16_to_f32": (None, [_VOID_P, _VOID_P, _I64]),
    "dlc_bf16_add_inplace": (None, [_VOID_P, _VOID_P, _I64]),
    "dlc_sign_pack": (None, [_VOID_P, _INT, _VOID_P, _I64]),
    "dlc_sign_unpack": (None, [_VOID_P, _I64, _INT, _VOID_P, _VOID_P, _VOID_P]),
    "dlc_count_above_f32": (_I64, [_VOID_P, _VOID_P, _I64, ctypes.c_float]),
    "dlc_count_above_f64": (_I64, [_VOID_P, _VOID_P, _I64, ctypes.c_double]),
    "dlc_ef_select_f32": (_I64, [_VOID_P, _VOID_P, _I64, ctypes.c_float, _VOID_P, _VOID_P,
                                 _INT, _VOID_P]),
    "dlc_ef_select_f64": (_I64, [_VOID_P, _VOID_P, _I64, ctypes.c_double, _VOID_P, _VOID_P,
                                 _INT, _VOID_P]),
    "dlc_momentum_count_above_f32": (_I64, [_VOID_P, _VOID_P, ctypes.c_float, _VOID_P, _I64,
                                            ctypes.c_float]),
    "dlc_momentum_count_above_f64": (_I64, [_VOID_P, _VOID_P, ctypes.c_double, _VOID_P, _I64,
                                            ctypes.c_double]),
    "dlc_scatter_add_f32": (_I64, [_VOID_P, _I64, _VOID_P, _VOID_P, _INT, _I64]),
    "dlc_scatter_add_f64": (_I64, [_VOID_P, _I64, _VOID_P, _VOID_P, _INT, _I64]),
    "dlc_velocity_step_f32": (None, [_VOID_P, _VOID_P, _I64, ctypes.c_float]),
    "dlc_velocity_step_f64": (None, [_VOID_P, _VOID_P, _I64, ctypes.c_double]),
}


def _load() -> tuple[Any, str | None, str | None]:
    """(library, its path, why it is not loaded); never raises."""
    if os.environ.get("DLCOMM_NATIVE", "1") == "0":
        return None, None, "disabled by DLCOMM_NATIVE=0"
    try:
        spec = importlib.util.find_spec("dlcomm._native")
    except (ImportError, ValueError) as exc:
        return None, None, f"cannot locate dlcomm._native: {exc}"
    if spec is None or not spec.origin:
        return None, None, ("dlcomm._native is not built (reinstall with g++ present: "
                            "pip install -e .)")
    # Sleeping, not spinning, OpenMP workers: MPI ranks often share the cores (before libgomp
    # loads; a process that already loaded it keeps its setting).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        lib = ctypes.CDLL(spec.origin)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as exc:
        return None, spec.origin, f"cannot load {spec.origin}: {exc}"
    if lib.dlc_abi_version() != ABI_VERSION:
        return None, spec.origin, (f"{spec.origin} has ABI {lib.dlc_abi_version()}, expected "
                                   f"{ABI_VERSION}: rebuild with pip install -e .")
    lib.dlc_set_num_threads(_default_threads())
    return lib, spec.origin, None


def _default_threads() -> int:
    """DLCOMM_NATIVE_THREADS, else OMP_NUM_THREADS (dlcommrun sets it to each rank's share of
    the cores, emulated hosts included), else the cores shared among this host's MPI ranks
    (0: OpenMP's own default)."""
    for variable in ("DLCOMM_NATIVE_THREADS", "OMP_NUM_THREADS"):
        threads = os.environ.get(variable, "").strip()
        if threads.isdigit():
            return int(threads)
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "").strip()
    if local.isdigit() and int(local) > 0:
        return max(1, (os.cpu_count() or 1) // int(local))
    return 0


_LIB, _PATH, _ERROR = _load()


# ---- status and controls -------------------------------------------------------------------
def available() -> bool:
    """True when the native library is loaded and its kernels are used."""
    return _LIB is not None


def library_path() -> str | None:
    """Path of the loaded (or unloadable) library file; None when not built."""
    return _PATH


def load_error() -> str | None:
    """Why the library is not in use (None when it is)."""
    return _ERROR


def set_num_threads(n: int) -> None:
    """OpenMP threads for kernels on large arrays; 0 restores OpenMP's default."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an int >= 0, got {n!r}")
    if _LIB is not None:
        _LIB.dlc_set_num_threads(int(n))


def num_threads() -> int:
    """Threads the kernels use on large arrays (1 without the library)."""
    return int(_LIB.dlc_get_num_threads()) if _LIB is not None else 1


def simd_available() -> bool:
    """Whether the AVX2/F16C paths exist and this CPU runs them."""
    return bool(_LIB is not None and _LIB.dlc_simd_available())


def set_simd(enabled: bool) -> None:
    """Use (True) or bypass (False) the AVX2/F16C paths; tests check both against numpy."""
    if _LIB is not None:
        _LIB.dlc_set_simd(int(bool(enabled)))


# ---- argument checks ------------------------------------------------------------------------
def _check(x: object, what: str, dtypes: tuple) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{what} must have dtype {' or '.join(str(np.dtype(d)) for d in dtypes)}, "
                        f"got {x.dtype}")
    return x


def _native_ok(*arrays: np.ndarray) -> bool:
    return _LIB is not None and all(a.flags.c_contiguous for a in arrays)


def _out(out: np.ndarray | None, like: np.ndarray, dtype: Any, what: str = "out") -> np.ndarray:
    if out is None:
        return np.empty(like.shape, dtype=dtype)
    _check(out, what, (np.dtype(dtype),))
    if out.shape != like.shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{what} must be a writeable C-contiguous array of shape {like.shape}, "
                         f"got shape {out.shape}")
    return out


def _same_shape(a: np.ndarray, b: np.ndarray, what: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{what}: shapes differ, {a.shape} vs {b.shape}")


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


# ---- float16 -----------------------------------------------------------------------------------
def float32_to_float16(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``x.astype(np.float16)`` for float32 ``x`` (nearest even, NaN payloads as numpy)."""
    _check(x, "x", (np.dtype(np.float32),))
    out = _out(out, x, np.float16)
    if _native_ok(x):
        _LIB.dlc_f32_to_f16(_ptr(x), _ptr(out), x.size)
    else:
        np.copyto(out, x, casting="same_kind")
    return out


def float16_to_float32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``x.astype(np.float32)`` for float16 ``x`` (exact)."""
    _check(x, "x", (np.dtype(np.float16),))
    out = _out(out, x, np.float32)
    if _native_ok(x):
        _LIB.dlc_f16_to_f32(_ptr(x), _ptr(out), x.size)
    else:
        np.copyto(out, x)
    return out


def float16_add_(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.add(a, b, out=b)`` on float16 (b updated in place and returned)."""
    _check(a, "a", (np.dtype(np.float16),))
    _check(b, "b", (np.dtype(np.float16),))
    _same_shape(a, b, "float16_add_")
    if _native_ok(a, b) and b.flags.writeable:
        _LIB.dlc_f16_add_inplace(_ptr(a), _ptr(b), b.size)
    else:
        np.add(a, b, out=b)
    return b


_SCALE_BLOCK = 1 << 18  # float16 elements converted per float32 staging block (1 MiB)


def scale_into(src: Any, factor: float, out: Any) -> None:
    """``array_api.scale_into`` (``out = src * factor``, float16 computed in float32 and
    rounded once), with float16 numpy arrays converted by the native kernels block by
    block: numpy's own float16 casts made scaling a 19 MB gradient cost 100-270 ms."""
    if (isinstance(src, np.ndarray) and isinstance(out, np.ndarray) and _LIB is not None
            and src.dtype == np.float16 and out.dtype == np.float16
            and src.shape == out.shape and src.flags.c_contiguous and out.flags.c_contiguous
            and out.flags.writeable
            and (src.ctypes.data == out.ctypes.data or not np.shares_memory(src, out))):
        flat_src, flat_out = src.reshape(-1), out.reshape(-1)
        f = np.float32(factor)
        staging = np.empty(min(flat_src.size, _SCALE_BLOCK), dtype=np.float32)
        for lo in range(0, flat_src.size, _SCALE_BLOCK):
            hi = min(lo + _SCALE_BLOCK, flat_src.size)
            block = staging[:hi - lo]
            _LIB.dlc_f16_to_f32(_ptr(flat_src[lo:hi]), _ptr(block), hi - lo)
            np.multiply(block, f, out=block)
            _LIB.dlc_f32_to_f16(_ptr(block), _ptr(flat_out[lo:hi]), hi - lo)
        return
    array_api.scale_into(src, factor, out)


# ---- bfloat16 (uint16 bit patterns) --------------------------------------------------------
def float32_to_bf16_bits(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``dlcomm.bfloat16.float_to_bf16_bits`` for a float32 array, same shape."""
    _check(x, "x", (np.dtype(np.float32),))
    if not _native_ok(x):
        ref = float_to_bf16_bits(x).reshape(x.shape)
        if out is None:
            return ref
        out = _out(out, x, np.uint16)
        out[...] = ref
        return out
    out = _out(out, x, np.uint16)
    _LIB.dlc_f32_to_bf16(_ptr(x), _ptr(out), x.size)
    return out


def bf16_bits_to_float32(bits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``dlcomm.bfloat16.bf16_bits_to_float`` (exact widening), same shape."""
    _check(bits, "bits", (np.dtype(np.uint16),))
    out = _out(out, bits, np.float32)
    if _native_ok(bits):
        _LIB.dlc_bf16_to_f32(_ptr(bits), _ptr(out), bits.size)
    else:
        out.view(np.uint32)[...] = bits.astype(np.uint32) << 16
    return out


def bf16_add_(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``b = bf16(float(a) + float(b))`` on uint16 bfloat16 bits, in place; returns b."""
    _check(a, "a", (np.dtype(np.uint16),))
    _check(b, "b", (np.dtype(np.uint16),))
    _same_shape(a, b, "bf16_add_")
    if _native_ok(a, b) and b.flags.writeable:
        _LIB.dlc_bf16_add_inplace(_ptr(a), _ptr(b), b.size)
        return b
    total = bf16_bits_to_float(a.reshape(-1)) + bf16_bits_to_float(b.reshape(-1))
    b[...] = float_to_bf16_bits(total).reshape(b.shape)
    return b


# ---- 1-bit signs -----------------------------------------------------------------------------
def pack_signs(flat: np.ndarray) -> np.ndarray:
    """``np.packbits(flat >= 0)`` for a 1-D float16/32/64 array (NaN packs as 0)."""
    _check(flat, "flat", tuple(SIGN_DTYPES))
    if flat.ndim != 1:
        raise ValueError(f"flat must be 1-D, got shape {flat.shape}")
    if not _native_ok(flat):
        return np.packbits(flat >= 0)
    out = np.empty((flat.size + 7) // 8, dtype=np.uint8)
    _LIB.dlc_sign_pack(_ptr(flat), SIGN_DTYPES[flat.dtype], _ptr(out), flat.size)
    return out


def unpack_signs(packed: np.ndarray, n: int, dtype: Any, scale: Any = None) -> np.ndarray:
    """``(np.unpackbits(packed)[:n].astype(dtype) * 2 - 1) * scale`` (scale None: no product).

    ``scale`` is a number or 1-element array, first cast to ``dtype`` (as EFSignSGD does).
    """
    _check(packed, "packed", (np.dtype(np.uint8),))
    dtype = np.dtype(dtype)
    if dtype not in SIGN_DTYPES:
        raise TypeError(f"dtype must be float16, float32 or float64, got {dtype}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= 8 * packed.size:
        raise ValueError(f"n must be an int in [0, {8 * packed.size}], got {n!r}")
    ones = np.array([1, -1], dtype=dtype)
    if scale is not None:
        ones = ones * np.asarray(scale).reshape(-1)[:1].astype(dtype)
    if not _native_ok(packed):
        signs = np.unpackbits(packed)[:n].astype(dtype) * 2 - 1
        return signs if scale is None else signs * ones[:1]
    out = np.empty(int(n), dtype=dtype)
    _LIB.dlc_sign_unpack(_ptr(packed), int(n), dtype.itemsize, _ptr(ones[0:1]), _ptr(ones[1:2]),
                         _ptr(out))
    return out


# ---- threshold selection with error feedback ---------------------------------------------
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _check_pair(grad: np.ndarray, residual: np.ndarray | None) -> None:
    _check(grad, "grad", _FLOATS)
    if residual is not None:
        _check(residual, "residual", (grad.dtype,))
        _same_shape(grad, residual, "grad and residual")


def _threshold(threshold: Any, dtype: np.dtype) -> Any:
    value = np.asarray(threshold)
    if value.size != 1 or value.dtype.kind not in "fiu":
        raise TypeError(f"threshold must be a real number, got {threshold!r}")
    return dtype.type(value.reshape(()))


def count_above(grad: np.ndarray, threshold: Any, residual: np.ndarray | None = None) -> int:
    """``count_nonzero(abs(grad + residual) >= threshold)``; residual None means zero."""
    _check_pair(grad, residual)
    thr = _threshold(threshold, grad.dtype)
    arrays = (grad,) if residual is None else (grad, residual)
    if not _native_ok(*arrays):
        acc = grad if residual is None else grad + residual
        return int(np.count_nonzero(np.abs(acc) >= thr))
    fn = _LIB.dlc_count_above_f32 if grad.dtype == np.float32 else _LIB.dlc_count_above_f64
    return int(fn(_ptr(grad), None if residual is None else _ptr(residual), grad.size, thr))


def momentum_update_(velocity: Any, grad: Any, momentum: float) -> None:
    """``velocity *= m; velocity += grad`` in place (any array library): the update that
    ``momentum_count_above_`` folds into its count."""
    velocity *= velocity.dtype.type(momentum)
    velocity += grad


def momentum_count_above_(velocity: np.ndarray, grad: np.ndarray, momentum: float,
                          threshold: Any, residual: np.ndarray | None = None) -> int:
    """``velocity *= m; velocity += grad`` in place, then ``count_above(velocity, threshold,
    residual)``: the same bits and count, in one pass instead of three."""
    _check_pair(velocity, residual)
    _check_pair(velocity, grad)
    thr = _threshold(threshold, velocity.dtype)
    arrays = (velocity, grad) if residual is None else (velocity, grad, residual)
    if not _native_ok(*arrays) or not velocity.flags.writeable:
        momentum_update_(velocity, grad, momentum)
        return count_above(velocity, threshold, residual)
    fn = (_LIB.dlc_momentum_count_above_f32 if velocity.dtype == np.float32
          else _LIB.dlc_momentum_count_above_f64)
    return int(fn(_ptr(velocity), _ptr(grad), momentum,
                  None if residual is None else _ptr(residual), velocity.size, thr))


_SCRATCH = threading.local()


def _scratch(dtype: np.dtype, n: int) -> np.ndarray:
    """A 1-D buffer of at least ``n`` elements of ``dtype``, kept per thread and reused.

    ``ef_select``'s picks land at each thread's chunk offset, so its output buffers span the
    whole tensor although few elements are written: fresh ones fault their touched pages in
    on every call, which can be slow (docs/compression.md); reused ones stay mapped."""
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    key = np.dtype(dtype)
    buf = buffers.get(key)
    if buf is None or buf.size < n:
        buf = buffers[key] = np.empty(n, dtype=key)
    return buf[:n]


def ef_select(
    grad: np.ndarray, threshold: Any, residual: np.ndarray | None = None,
    index_dtype: Any = np.int32,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, flat indices, new residual) of ``acc = grad + residual`` at |acc| >= threshold.

    Equal to ``idx = flatnonzero(abs(acc) >= threshold)``, ``acc.flat[idx]``, and
    ``acc - scatter(acc.flat[idx])`` reshaped like ``grad``; one pass with the library.
    """
    _check_pair(grad, residual)
    thr = _threshold(threshold, grad.dtype)
    index_dtype = np.dtype(index_dtype)
    if index_dtype not in INDEX_DTYPES:
        raise TypeError(f"index_dtype must be int32 or int64, got {index_dtype}")
    if index_dtype == np.int32 and grad.size >= 2**31:
        raise ValueError(f"{grad.size} elements need int64 indices")
    arrays = (grad,) if residual is None else (grad, residual)
    if not _native_ok(*arrays):
        acc = grad.copy() if residual is None else grad + residual
        flat = acc.reshape(-1)
        idx = np.flatnonzero(np.abs(flat) >= thr)
        values = flat[idx]
        estimate = np.zeros_like(flat)
        estimate[idx] = values
        return values, idx.astype(index_dtype), np.subtract(flat, estimate).reshape(grad.shape)
    n = grad.size
    values = _scratch(grad.dtype, n)
    indices = _scratch(index_dtype, n)
    new_residual = np.empty(grad.shape, dtype=grad.dtype)
    fn = _LIB.dlc_ef_select_f32 if grad.dtype == np.float32 else _LIB.dlc_ef_select_f64
    count = fn(_ptr(grad), None if residual is None else _ptr(residual), n, thr, _ptr(values),
               _ptr(indices), index_dtype.itemsize, _ptr(new_residual))
    return values[:count].copy(), indices[:count].copy(), new_residual


# ---- sparse into dense, and momentum correction's step -------------------------------------
def scatter_add_(out: Any, indices: Any, values: Any) -> None:
    """``out.reshape(-1)[indices] += values`` in place (numpy's semantics: a repeated index
    keeps its last sum), one pass over the indices where numpy converts and gathers them."""
    flat = out.reshape(-1) if isinstance(out, np.ndarray) and out.flags.c_contiguous else None
    if (flat is None or _LIB is None or flat.dtype not in _FLOATS
            or not isinstance(values, np.ndarray) or values.dtype != flat.dtype
            or not isinstance(indices, np.ndarray) or indices.dtype not in INDEX_DTYPES
            or values.ndim != 1 or indices.shape != values.shape
            or not values.flags.c_contiguous or not indices.flags.c_contiguous
            or not flat.flags.writeable):
        out.reshape(-1)[indices] += values
        return
    fn = _LIB.dlc_scatter_add_f32 if flat.dtype == np.float32 else _LIB.dlc_scatter_add_f64
    if fn(_ptr(flat), flat.size, _ptr(values), _ptr(indices), indices.dtype.itemsize,
          indices.size) != 0:
        flat[indices] += values  # an index outside [0, n): numpy wraps or raises


def velocity_step_(result: Any, kept: Any, momentum: float) -> None:
    """Momentum correction's step, in place: ``result`` becomes ``kept * -momentum + result``
    (``kept *= -m; kept += result``'s bits) and ``kept`` becomes the old ``result``."""
    if (isinstance(result, np.ndarray) and isinstance(kept, np.ndarray) and _LIB is not None
            and result.dtype in _FLOATS and kept.dtype == result.dtype
            and result.shape == kept.shape and result.flags.c_contiguous
            and kept.flags.c_contiguous and result.flags.writeable and kept.flags.writeable
            and not np.shares_memory(result, kept)):
        fn = (_LIB.dlc_velocity_step_f32 if result.dtype == np.float32
              else _LIB.dlc_velocity_step_f64)
        fn(_ptr(result), _ptr(kept), result.size, -momentum)
        return
    xp = array_api.array_namespace(result)
    old = xp.asarray(result).copy()
    kept *= kept.dtype.type(-momentum)
    kept += result
    result[...] = kept
    kept[...] = old
