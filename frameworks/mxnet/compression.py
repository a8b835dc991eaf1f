"""Gradient compression for the MXNet adapter: Horovod's ``Compression.none``/``fp16`` on
NDArrays, plus every compressor of ``dlcomm.compression`` by spec
(``Compression.lookup("topk:ratio=0.01")`` or attributes such as ``Compression.topk``), which
the core's engine runs on the gradient's numpy view. Only the fp16 cast is MXNet-specific;
the rest is ``dlcomm.compression.adapter``, shared by every adapter."""
from __future__ import annotations

from typing import Any

import numpy as np

from dlcomm.compression import adapter
from dlcomm.compression.adapter import (
    Compressor,
    CoreCompressor,
    NoneCompressor,
    core_compressor,
)

__all__ = ["Compression", "Compressor", "CoreCompressor", "FP16Compressor", "NoneCompressor",
           "core_compressor", "resolve"]


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


# lookup("fp16") is the NDArray cast here (the core's fp16 would run on the numpy view).
Compression = adapter.make_compression(FP16Compressor, casts={"fp16": FP16Compressor})


def resolve(compression: Any) -> type[Compressor] | Compressor:
    """Accept a Compression member, a CoreCompressor, a spec string, or None (environment)."""
    return adapter.resolve(compression, Compression)
