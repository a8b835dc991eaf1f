"""Error feedback (memory): what compression dropped this step is added back next step.

``ErrorFeedback(compressor)`` wraps any compressor. For tensor ``name`` it keeps a residual
``e``; each step it compresses ``acc = g + e`` and, once the final round's payloads exist,
sets ``e = acc - local_estimate(payloads)``, so ``sent + new residual == g + old residual``
(up to one float rounding). This is the "memory" of GRACE and BytePS's error-feedback
decorator, written once for every compressor and every number of rounds.
"""
from __future__ import annotations

from dlcomm.array_api import array_namespace
from dlcomm.compression.base import CompressorWrapper, Context, check_tensor
from dlcomm.compression.sparsify import TopK, k_for
from dlcomm.compression.topk_select import native_topk_with_residual

_ACC = "error_feedback_acc"


class ErrorFeedback(CompressorWrapper):
    """Wraps ``inner`` with a per-tensor-name residual (``self.states[name]``)."""

    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        check_tensor(tensor, name)
        residual = self.states.get(name)
        if residual is not None and (residual.shape != tensor.shape
                                     or residual.dtype != tensor.dtype):
            raise ValueError(
                f"tensor {name!r}: shape/dtype changed from {residual.shape}/{residual.dtype} "
                f"to {tensor.shape}/{tensor.dtype}; call reset_state({name!r}) first"
            )
        fused = self._native_topk(tensor, residual, name)
        if fused is not None:
            return fused
        acc = tensor.copy() if residual is None else tensor + residual
        payloads, ctx = self.inner.compress(acc, name)
        return self._maybe_update(payloads, ctx, acc)

    def _native_topk(self, tensor: object, residual: object, name: str) -> tuple | None:
        """Approximate top-k + residual update in native passes (same bits), or None.

        The reference (compress ``acc``, scatter the payloads back, subtract) makes about ten
        passes over the tensor; ``native_topk_with_residual`` makes one per threshold probe
        plus one that selects and writes the residual, without materialising ``acc``.
        """
        inner = self.inner
        if type(inner) is not TopK or not inner.approx or len(self.rounds) != 1:
            return None
        k = k_for(inner.ratio, tensor.size)
        fused = native_topk_with_residual(tensor, residual, k)
        if fused is None:
            return None
        values, indices, new_residual = fused
        self.states[name] = new_residual
        return [values, indices], inner._context(tensor, name)

    def resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        payloads, ctx = self.inner.resume(reduced, ctx)
        return self._maybe_update(payloads, ctx, ctx.data.pop(_ACC))

    def _maybe_update(self, payloads: list, ctx: Context, acc: object) -> tuple[list, Context]:
        """Set the residual once the final round's payloads are known; else carry ``acc``."""
        if ctx.round == len(self.rounds) - 1:
            estimate = self.inner.local_estimate(payloads, ctx)
            xp = array_namespace(acc)
            self.states[ctx.name] = xp.subtract(acc, estimate, dtype=acc.dtype)
        else:
            ctx.data[_ACC] = acc
        return payloads, ctx

    def residual(self, name: str) -> object | None:
        """The current residual of tensor ``name`` (None before its first step)."""
        return self.states.get(name)

    def describe(self) -> str:
        return self.inner.describe()
