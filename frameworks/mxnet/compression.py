"""Gradient compression for the MXNet adapter: Horovod's ``Compression.none``/``fp16`` on
NDArrays, plus every compressor of ``dlcomm.compression`` by spec
(``Compression.lookup("topk:ratio=0.01")`` or attributes such as ``Compression.topk``), which
the core's engine runs on the gradient's numpy view."""
from __future__ import annotations

from typing import Any

import numpy as np

from dlcomm import compression as core


class Compressor:
    """Horovod's interface: ``compress(tensor) -> (tensor, ctx)`` and ``decompress``."""

    core_spec: str | None = None  # set for compressors the engine runs (not NDArray casts)

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class NoneCompressor(Compressor):
    """No compression."""


class FP16Compressor(Compressor):
    """Send floating-point NDArrays as float16 (half the bytes), restore the dtype after."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f" and dtype != np.float16:
            return tensor.astype("float16"), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else tensor.astype(ctx)


class CoreCompressor(Compressor):
    """A compressor of ``dlcomm.compression``, run by the engine (state per tensor name)."""

    def __init__(self, spec: str) -> None:
        self.core_spec = spec
        self.core = core.get_compressor(spec)  # validates the spec now

    def fresh(self) -> CoreCompressor:
        """A new instance with empty state (each trainer keeps its own residuals)."""
        return CoreCompressor(self.core_spec)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Compression.lookup({self.core_spec!r})"


class _CompressionMeta(type):
    def __getattr__(cls, name: str) -> CoreCompressor:
        if name.startswith("_") or name not in core.available_compressors():
            raise AttributeError(
                f"Compression has no {name!r}; available: none, fp16, "
                f"{', '.join(sorted(core.available_compressors()))}")
        return CoreCompressor(name)


class Compression(metaclass=_CompressionMeta):
    """Compression algorithms, Horovod style: ``Compression.none``, ``Compression.fp16``,
    ``Compression.topk`` (default parameters) or ``Compression.lookup("topk:ratio=0.01")``."""

    none = NoneCompressor
    fp16 = FP16Compressor

    @staticmethod
    def lookup(spec: str) -> type[Compressor] | CoreCompressor:
        """The compressor for a spec string (``"none"``, ``"fp16"``, ``"powersgd:rank=4"``)."""
        if not isinstance(spec, str):
            raise TypeError(f"compression spec must be a str, got {type(spec).__name__}")
        if spec.strip().lower() == "none":
            return NoneCompressor
        if spec.strip().lower() == "fp16":
            return FP16Compressor
        return CoreCompressor(spec)


def resolve(compression: Any) -> type[Compressor] | Compressor:
    """Accept a Compression member, a CoreCompressor, a spec string, or None (environment)."""
    if compression is None:
        spec = core.compressor_from_env().describe()
        return NoneCompressor if spec == "none" else CoreCompressor(spec)
    if isinstance(compression, str):
        return Compression.lookup(compression)
    if isinstance(compression, CoreCompressor):
        return compression.fresh()
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression
    if isinstance(compression, Compressor):
        return compression
    raise TypeError(f"compression must be hvd.Compression.<name>, a spec string or None, "
                    f"got {compression!r}")


def core_compressor(compression: Any) -> Any:
    """The engine-side compressor object of ``compression``, or None for casts and none."""
    return compression.core if isinstance(compression, CoreCompressor) else None
