"""Error feedback (memory): what compression dropped this step is added back next step.

``ErrorFeedback(compressor)`` wraps any compressor. For tensor ``name`` it keeps a residual
``e``; each step it compresses ``acc = g + e`` and, once the final round's payloads exist,
sets ``e = acc - local_estimate(payloads)``, so ``sent + new residual == g + old residual``
(up to one float rounding). This is the "memory" of GRACE and BytePS's error-feedback
decorator, written once for every compressor and every number of rounds.
"""
from __future__ import annotations

from dlcomm.compression.array_api import array_namespace
from dlcomm.compression.base import CompressorWrapper, Context, check_tensor

_ACC = "error_feedback_acc"


class ErrorFeedback(CompressorWrapper):
    """Wraps ``inner`` with a per-tensor-name residual (``self.states[name]``)."""

    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        check_tensor(tensor, name)
        residual = self.states.get(name)
        if residual is None:
            acc = tensor.copy()
        else:
            if residual.shape != tensor.shape or residual.dtype != tensor.dtype:
                raise ValueError(
                    f"tensor {name!r}: shape/dtype changed from {residual.shape}/{residual.dtype} "
                    f"to {tensor.shape}/{tensor.dtype}; call reset_state({name!r}) first"
                )
            acc = tensor + residual
        payloads, ctx = self.inner.compress(acc, name)
        return self._maybe_update(payloads, ctx, acc)

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
