"""Composition: cast another compressor's floating payloads to fp16 or bf16 on the wire.

``PayloadCast(PowerSGD(rank=4), "fp16")`` (registry: ``"powersgd:rank=4+fp16"``) halves the
bytes of P and Q; integer payloads (indices, levels, packed signs) pass unchanged. fp16
payloads stay summable; bf16 payloads are uint16 bit patterns, so bf16 composes only with
compressors whose rounds are all all-gathers. Wrap with error feedback outside the cast so the
residual also absorbs the cast's rounding.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from dlcomm.compression.base import ALLGATHER, WORLD, Compressor, CompressorWrapper, Context

CASTS = ("fp16", "bf16")
_DTYPES = "payload_cast_dtypes"


class PayloadCast(CompressorWrapper):
    """Casts floating payloads of ``inner`` to ``cast`` ('fp16' or 'bf16') and back."""

    def __init__(self, inner: Compressor, cast: str = "fp16") -> None:
        super().__init__(inner)
        if cast not in CASTS:
            raise ValueError(f"payload cast must be one of {list(CASTS)}, got {cast!r}")
        if any(group != WORLD for group in inner.groups):
            raise ValueError(f"'+{cast}' does not compose with {inner.name}, whose rounds run "
                             "over hosts and peers (all-gathered lists mid-way)")
        if cast == "bf16" and any(kind != ALLGATHER for kind in inner.rounds):
            raise ValueError(
                f"'+bf16' needs all-gathered payloads but {inner.name} has rounds "
                f"{list(inner.rounds)}; bf16 bit patterns cannot be summed: use '+fp16'"
            )
        self.cast = cast
        self.name = f"{inner.name}+{cast}"

    def _encode(self, payloads: list, ctx: Context) -> list:
        ctx.data.setdefault(_DTYPES, {})[ctx.round] = [p.dtype for p in payloads]
        return [self._encode_one(p) for p in payloads]

    def _encode_one(self, p: object) -> object:
        if p.dtype.kind != "f":
            return p
        if self.cast == "fp16":
            return p.astype(array_namespace(p).float16)
        return float_to_bf16_bits(p).reshape(p.shape)

    def _decode(self, payloads: list, ctx: Context) -> list:
        dtypes = ctx.data[_DTYPES][ctx.round]
        return [self._decode_one(p, d) for p, d in zip(payloads, dtypes)]

    def _decode_one(self, p: object, dtype: np.dtype) -> object:
        if np.dtype(dtype).kind != "f":
            return p
        if self.cast == "fp16":
            return p.astype(dtype)
        return bf16_bits_to_float(p).astype(dtype)

    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        payloads, ctx = self.inner.compress(tensor, name)
        return self._encode(payloads, ctx), ctx

    def resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        payloads, ctx = self.inner.resume(self._decode(reduced, ctx), ctx)
        return self._encode(payloads, ctx), ctx

    def decompress(self, payloads: list, ctx: Context) -> object:
        return self.inner.decompress(self._decode(payloads, ctx), ctx)

    def local_estimate(self, payloads: list, ctx: Context) -> object:
        return self.inner.local_estimate(self._decode(payloads, ctx), ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object | None:
        return self.inner.unsent(tensor, self._decode(payloads, ctx), ctx)

    def decompress_all(self, per_rank: list, ctx: Context, op: str = "average") -> object:
        return self.inner.decompress_all([self._decode(p, ctx) for p in per_rank], ctx, op)

    def decompress_all_into(self, per_rank: list, ctx: Context, op: str, out: object
                            ) -> object | None:
        return self.inner.decompress_all_into([self._decode(p, ctx) for p in per_rank], ctx,
                                              op, out)

    def merge(self, lower: list, higher: list, ctx: Context) -> list:
        merged = self.inner.merge(self._decode(lower, ctx), self._decode(higher, ctx), ctx)
        return self._encode(merged, ctx)

    def describe(self) -> str:
        return f"{self.inner.describe()}+{self.cast}"
