"""Gradient compression for the TensorFlow adapter: Horovod's ``Compression.none``/``fp16``
(casts done with TensorFlow ops) plus every compressor of ``dlcomm.compression`` by name
(``Compression.lookup("topk:ratio=0.01")`` or ``Compression.topk``), which the engine runs.
Only the fp16 cast is TensorFlow-specific; the rest is ``dlcomm.compression.adapter``."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dlcomm.compression import adapter
from dlcomm.compression.adapter import Compressor, CoreCompressor, NoneCompressor

__all__ = ["Compression", "Compressor", "CoreCompressor", "FP16Compressor", "NoneCompressor",
           "resolve", "split"]


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (half the bytes), restore the dtype after."""

    @staticmethod
    def compress(tensor: tf.Tensor) -> tuple[tf.Tensor, Any]:
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: tf.Tensor, ctx: Any) -> tf.Tensor:
        return tensor if ctx is None else tf.cast(tensor, ctx)


Compression = adapter.make_compression(FP16Compressor)


def resolve(compression: Any) -> type[Compressor] | Compressor:
    """Accept a Compression member, a CoreCompressor (copied, so its residuals are the
    caller's own), a spec string, or None (``DLCOMM_COMPRESSION``)."""
    return adapter.resolve(compression, Compression)


def split(compression: Any) -> tuple[Any, Any]:
    """``(tensor-level compressor, engine compressor or None)`` for one collective call."""
    c = resolve(compression) if not isinstance(compression, CoreCompressor) else compression
    if isinstance(c, CoreCompressor):
        return NoneCompressor, c.core
    return c, None
