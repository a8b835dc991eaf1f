"""Gradient compression for the torch adapter: Horovod's ``Compression.none``/``fp16`` plus
every compressor of ``dlcomm.compression`` by name (``Compression.lookup("topk:ratio=0.01")``,
or attributes such as ``Compression.topk``). Only the fp16 cast is torch-specific; the rest
is ``dlcomm.compression.adapter``, shared by every adapter."""
from __future__ import annotations

from typing import Any

import torch

from dlcomm.compression import adapter
from dlcomm.compression.adapter import Compressor, CoreCompressor, NoneCompressor

__all__ = ["Compression", "Compressor", "CoreCompressor", "FP16Compressor", "NoneCompressor",
           "resolve"]


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 (half the bytes), restore the dtype after."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


Compression = adapter.make_compression(FP16Compressor)


def resolve(compression: Any) -> type[Compressor] | Compressor:
    """Accept a Compression member, a CoreCompressor, a spec string, or None (environment)."""
    return adapter.resolve(compression, Compression)
