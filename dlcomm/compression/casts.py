"""Dense casts: ``none`` (identity), ``fp16`` and ``bf16`` (half the bytes on the wire).

``none`` and ``fp16`` are summable: MPI sums float32/float16 buffers. ``bf16`` payloads are
uint16 bit patterns (numpy has no bfloat16), which an integer sum would corrupt, so ``bf16``
is all-gathered and summed after widening; a backend with a native bfloat16 sum (NCCL) could
make it summable later.
"""
from __future__ import annotations

import numpy as np

from dlcomm import kernels
from dlcomm.array_api import array_namespace
from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from dlcomm.compression.base import ALLGATHER, ALLREDUCE, Compressor, Context


class NoneCompressor(Compressor):
    """Identity: the tensor is its own payload (dense all-reduce)."""

    name = "none"
    rounds = (ALLREDUCE,)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        return [tensor], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        return payloads[0].reshape(ctx.shape).astype(ctx.dtype, copy=False)


class FP16Compressor(Compressor):
    """Cast to float16 (values above 65504 become inf); summed in float16 on the wire."""

    name = "fp16"
    rounds = (ALLREDUCE,)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        xp = array_namespace(tensor)
        if xp is np and tensor.dtype == np.float32 and kernels.available():
            return [kernels.float32_to_float16(tensor)], self._context(tensor, name)  # same bits
        return [tensor.astype(xp.float16)], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        p = payloads[0].reshape(ctx.shape)
        if isinstance(p, np.ndarray) and np.dtype(ctx.dtype) == np.float32 and kernels.available():
            return kernels.float16_to_float32(p)  # same bits as astype, several times faster
        return p.astype(ctx.dtype)


class BF16Compressor(Compressor):
    """Round to bfloat16 (nearest even), sent as uint16; gathered, widened, then summed."""

    name = "bf16"
    rounds = (ALLGATHER,)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        flat = tensor.reshape(-1)
        if isinstance(flat, np.ndarray) and flat.dtype == np.float32 and kernels.available():
            return [kernels.float32_to_bf16_bits(flat)], self._context(tensor, name)  # same bits
        return [float_to_bf16_bits(flat)], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        bits = payloads[0]
        if isinstance(bits, np.ndarray) and bits.dtype == np.uint16 and kernels.available():
            out = kernels.bf16_bits_to_float32(bits).reshape(ctx.shape)
        else:
            out = bf16_bits_to_float(bits).reshape(ctx.shape)
        return out.astype(ctx.dtype, copy=out.dtype != np.dtype(ctx.dtype))
