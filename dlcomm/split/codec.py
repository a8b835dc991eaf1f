"""What a split codec is: an array in, a few smaller arrays and some integers out, and back.

Split fine-tuning sends one activation edge -> cloud and its gradient cloud -> edge each step.
A ``Codec`` turns that array into an ``Encoded`` (``parts``: the arrays that travel, ``meta``:
integers that travel with them, beginning with the original dtype and shape) and rebuilds an
approximation on the other side. Codecs are written once against the array API (numpy here,
CuPy alike). ``relative_error_bound`` states how far ``decode(encode(x))`` may be from ``x``
(Frobenius norm, relative to ``||x||``); the unit tests hold every codec to it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace

# Element types that may cross the link, by the small code the protocol sends.
DTYPE_CODES: dict[np.dtype, int] = {
    np.dtype(t): code for code, t in enumerate(
        (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16,
         np.int32, np.int64, np.bool_), start=1)
}
CODE_DTYPES: dict[int, np.dtype] = {code: dt for dt, code in DTYPE_CODES.items()}
FLOAT16_UNIT = 2.0 ** -11  # float16's unit roundoff
FLOAT16_SUBNORMAL = 2.0 ** -25  # half of float16's smallest subnormal, relative to a max of 1
FACTOR_DTYPES = ("float32", "float16")


def dtype_code(dtype: Any) -> int:
    """The protocol's code of ``dtype``; ValueError for a type that cannot cross."""
    dt = np.dtype(dtype)
    if dt not in DTYPE_CODES:
        raise ValueError(f"arrays of dtype {dt} cannot cross the split; supported: "
                         f"{sorted(str(d) for d in DTYPE_CODES)}")
    return DTYPE_CODES[dt]


def code_dtype(code: int) -> np.dtype:
    """The dtype of protocol code ``code``; ValueError for an unknown code."""
    if code not in CODE_DTYPES:
        raise ValueError(f"unknown dtype code {code} in a split message")
    return CODE_DTYPES[code]


def tensor_meta(x: Any) -> tuple[int, ...]:
    """``(dtype code, ndim, *shape)``: how every codec's ``meta`` begins."""
    return (dtype_code(x.dtype), x.ndim, *map(int, x.shape))


def read_tensor_meta(meta: tuple[int, ...]) -> tuple[np.dtype, tuple[int, ...], tuple[int, ...]]:
    """Split ``meta`` into (dtype, shape, the codec's own integers)."""
    if len(meta) < 2 or meta[1] < 0 or len(meta) < 2 + meta[1]:
        raise ValueError(f"malformed codec meta {meta!r}")
    ndim = meta[1]
    return code_dtype(meta[0]), tuple(meta[2:2 + ndim]), tuple(meta[2 + ndim:])


@dataclasses.dataclass(frozen=True)
class Encoded:
    """What crosses the link for one array: ``parts`` (arrays) and ``meta`` (ints)."""

    parts: tuple[Any, ...]
    meta: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the parts (the protocol adds its layout words)."""
        return int(sum(p.nbytes for p in self.parts))


def check_array(x: Any, what: str = "x") -> Any:
    """``x`` if it is a numpy/CuPy array of a type that can cross; TypeError/ValueError else."""
    array_namespace(x)  # TypeError for anything but numpy / CuPy
    dtype_code(x.dtype)
    return x


def check_factor_dtype(dtype: Any) -> np.dtype:
    """``float32`` or ``float16``: the element type of factors and values that travel."""
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in FACTOR_DTYPES:
        raise ValueError(f"dtype must be one of {list(FACTOR_DTYPES)}, got {dtype!r}")
    return np.dtype(name)


def scaled_float16(values: Any, axis: int | None = None) -> tuple[Any, Any]:
    """``values`` divided by their largest magnitude (per column with ``axis=0``) as float16,
    and the float32 scales: the largest element becomes 1, so nothing overflows and only
    elements below 2^-24 of the largest fall into float16's subnormals."""
    xp = array_namespace(values)
    big = xp.max(xp.abs(values), axis=axis, keepdims=axis is not None) if values.size else \
        xp.zeros((1,) * values.ndim if axis is not None else (), dtype=np.float32)
    scale = xp.where(big > 0, big, 1).astype(np.float32)
    return (values / scale).astype(np.float16), xp.reshape(scale, (-1,))


class Codec:
    """Base class: ``encode``/``decode`` one array; subclasses set ``name`` and override."""

    name = "codec"
    lossless = False

    def __init__(self) -> None:
        self.last_stats: dict[str, float] = {}

    def encode(self, x: Any) -> Encoded:
        """The parts and integers that stand for ``x``."""
        raise NotImplementedError

    def decode(self, encoded: Encoded) -> Any:
        """An array of ``x``'s dtype and shape from what ``encode(x)`` returned."""
        raise NotImplementedError

    def relative_error_bound(self, encoded: Encoded) -> float:
        """An upper bound of ``||x - decode(encoded)||_F / ||x||_F`` for the ``x`` that gave
        ``encoded`` (0 for lossless codecs)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The spec that builds this codec (compared across ranks)."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"


class NoneCodec(Codec):
    """Sends the array as it is."""

    name = "none"
    lossless = True

    def encode(self, x: Any) -> Encoded:
        check_array(x)
        xp = array_namespace(x)
        return Encoded((xp.ascontiguousarray(x).reshape(-1),), tensor_meta(x))

    def decode(self, encoded: Encoded) -> Any:
        dtype, shape, _ = read_tensor_meta(encoded.meta)
        return encoded.parts[0].astype(dtype, copy=False).reshape(shape)

    def relative_error_bound(self, encoded: Encoded) -> float:
        return 0.0


class Float16Codec(Codec):
    """Sends a floating-point array as float16, scaled so that its largest magnitude is 1
    (half the bytes of float32; nothing overflows, small gradients do not flush to zero)."""

    name = "fp16"

    def encode(self, x: Any) -> Encoded:
        check_array(x)
        if not np.issubdtype(np.dtype(x.dtype), np.floating):
            raise TypeError(f"fp16 encodes floating-point arrays, got {x.dtype}")
        values, scale = scaled_float16(x.reshape(-1))
        return Encoded((values, scale), tensor_meta(x))

    def decode(self, encoded: Encoded) -> Any:
        dtype, shape, _ = read_tensor_meta(encoded.meta)
        values, scale = encoded.parts
        return (values.astype(np.float32) * scale[0]).astype(dtype, copy=False).reshape(shape)

    def relative_error_bound(self, encoded: Encoded) -> float:
        # |error_i| <= max(u |x_i|, 2^-25 max|x|): u ||x|| + 2^-25 sqrt(n) ||x|| at most.
        n = encoded.parts[0].size
        return FLOAT16_UNIT + FLOAT16_SUBNORMAL * float(np.sqrt(max(n, 1)))


class SideCodec(Codec):
    """Lossless, for what the cloud needs besides activations (attention masks, labels,
    sample ids): arrays of 0/1 values (booleans, 0/1 integers) travel as bits, anything else
    as it is."""

    name = "side"
    lossless = True

    def encode(self, x: Any) -> Encoded:
        check_array(x)
        xp = array_namespace(x)
        flat = xp.ascontiguousarray(x).reshape(-1)
        dt = np.dtype(x.dtype)
        binary = dt == np.bool_ or (np.issubdtype(dt, np.integer) and flat.size > 0 and
                                    bool(xp.all((flat == 0) | (flat == 1))))
        if binary:
            host = np.asarray(flat.astype(np.bool_)) if xp is np else xp.asnumpy(flat) != 0
            return Encoded((np.packbits(host),), (*tensor_meta(x), 1))
        return Encoded((flat,), (*tensor_meta(x), 0))

    def decode(self, encoded: Encoded) -> Any:
        dtype, shape, (packed,) = read_tensor_meta(encoded.meta)
        if not packed:
            return encoded.parts[0].astype(dtype, copy=False).reshape(shape)
        n = int(np.prod(shape, dtype=np.int64))
        return np.unpackbits(encoded.parts[0], count=n).astype(dtype).reshape(shape)

    def relative_error_bound(self, encoded: Encoded) -> float:
        return 0.0
