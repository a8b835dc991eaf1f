"""Error feedback (memory): what compression dropped this step is added back next step.

``ErrorFeedback(compressor)`` wraps any compressor. For tensor ``name`` it keeps a residual
``e``; each step it compresses ``acc = g + e`` and, once the final round's payloads exist,
sets ``e = acc - local_estimate(payloads)``, so ``sent + new residual == g + old residual``
(up to one float rounding). This is the "memory" of GRACE and BytePS's error-feedback
decorator, written once for every compressor and every number of rounds.

Momentum correction (``set_momentum(m)``, DGC's memory, Lin et al. 2018): when the optimizer
applies momentum ``m`` after the all-reduce, error feedback on the bare gradient is unstable
at a dense learning rate: a residual held back for many steps is released at once and the
optimizer's momentum then amplifies it tenfold (m = 0.9), so the model oscillates or
diverges. With momentum correction each rank accumulates the velocity itself,
``u = m u + g``, compresses ``acc = u + e``, and after sending keeps in ``u`` only what was not
sent (momentum factor masking: ``u - C(u)`` for a compressor whose selection is linear, i.e.
sparsifiers and low-rank projections, ``u * clip(e / acc, 0, 1)`` otherwise). The reduced
result ``R`` is then a velocity; the optimizer receives ``R_t - m R_{t-1}``, so its own
momentum buffer ``m buf + d`` equals ``R_t`` and it steps by ``lr * R_t``. Momentum 0 (the
default) is plain error feedback, bit for bit; ``momentum_correction=False`` (spec ``mc=0``)
keeps it plain whatever the optimizer's momentum, the PowerSGD paper's algorithm and DDP's
PowerSGD hook's.
"""
from __future__ import annotations

from dlcomm.array_api import array_namespace
from dlcomm.compression.base import (
    ALLREDUCE,
    CompressorWrapper,
    Context,
    check_momentum,
    check_op,
    check_tensor,
    copy_state,
    with_param,
)
from dlcomm.compression.sparsify import TopK, k_for
from dlcomm.compression.topk_select import native_topk_with_residual
from dlcomm.kernels import momentum_update_, velocity_step_

_ACC = "error_feedback_acc"
_MOMENTUM = "error_feedback_momentum"


class ErrorFeedback(CompressorWrapper):
    """Wraps ``inner`` with a per-tensor-name residual (``self.states[name]``) and, with
    ``momentum`` > 0, a per-tensor velocity (``self.velocities``) and the previous reduced
    result (``self.results``) for momentum correction."""

    def __init__(self, inner: object, momentum: float = 0.0,
                 momentum_correction: bool = True) -> None:
        super().__init__(inner)
        self.momentum_correction = bool(momentum_correction)
        self.momentum = check_momentum(momentum) if self.momentum_correction else 0.0
        self.velocities: dict[str, object] = {}
        self.results: dict[str, object] = {}

    def set_momentum(self, momentum: float) -> None:
        """The momentum the optimizer applies after the all-reduce (SGD's ``momentum``);
        0 turns momentum correction off. Read at each step's ``compress``, so a schedule
        that changes the optimizer's momentum may call it every step. Without
        ``momentum_correction`` (spec ``mc=0``: error feedback on the bare gradient, as the
        PowerSGD paper and DDP's PowerSGD hook do) it is checked and ignored."""
        momentum = check_momentum(momentum)
        self.momentum = momentum if self.momentum_correction else 0.0

    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        check_tensor(tensor, name)
        residual = self.states.get(name)
        if residual is not None and (residual.shape != tensor.shape
                                     or residual.dtype != tensor.dtype):
            raise ValueError(
                f"tensor {name!r}: shape/dtype changed from {residual.shape}/{residual.dtype} "
                f"to {tensor.shape}/{tensor.dtype}; call reset_state({name!r}) first"
            )
        momentum = self.momentum
        update = None  # (g, m): the velocity still to become velocity * m + g
        if momentum:
            velocity = self.velocities.get(name)
            if velocity is None or velocity.shape != tensor.shape:
                velocity = tensor.copy()
            else:
                update = (tensor, momentum)
            self.velocities[name] = velocity
            tensor = velocity
        else:
            self.velocities.pop(name, None)
        fused = self._native_topk(tensor, residual, name, update)  # does ``update``
        if fused is not None:
            payloads, ctx = fused
            ctx.data[_MOMENTUM] = momentum
            if momentum:  # masking as TopK.unsent does, in place: the velocity is ours
                tensor.reshape(-1)[payloads[1]] = 0
            return payloads, ctx
        acc = tensor.copy() if residual is None else tensor + residual
        payloads, ctx = self.inner.compress(acc, name)
        ctx.data[_MOMENTUM] = momentum
        return self._maybe_update(payloads, ctx, acc)

    def _native_topk(self, tensor: object, residual: object, name: str,
                     update: tuple | None = None) -> tuple | None:
        """Approximate top-k + residual update in native passes (same bits), or None.
        ``update=(g, m)``: ``tensor`` (the velocity) first becomes ``tensor * m + g``, in
        every case (in the first counting pass where the kernels run).

        The reference (compress ``acc``, scatter the payloads back, subtract) makes about ten
        passes over the tensor; ``native_topk_with_residual`` makes one per threshold probe
        plus one that selects and writes the residual, without materialising ``acc``.
        """
        inner = self.inner
        if type(inner) is not TopK or not inner.approx or len(self.rounds) != 1:
            if update is not None:
                momentum_update_(tensor, *update)
            return None
        k = k_for(inner.ratio, tensor.size)
        fused = native_topk_with_residual(tensor, residual, k, momentum_update=update)
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
            residual = xp.subtract(acc, estimate, dtype=acc.dtype)
            self.states[ctx.name] = residual
            if ctx.data[_MOMENTUM]:
                velocity = self.velocities[ctx.name]
                self.velocities[ctx.name] = self._unsent_velocity(
                    velocity, payloads, ctx, (acc, residual))
        else:
            ctx.data[_ACC] = acc
        return payloads, ctx

    def _unsent_velocity(self, velocity: object, payloads: list, ctx: Context,
                         acc_residual: tuple | None) -> object:
        """Momentum factor masking: the velocity keeps only what this step did not send."""
        kept = self.inner.unsent(velocity, payloads, ctx)
        if kept is not None:
            return kept
        acc, residual = acc_residual  # a non-linear selection (sign): the kept share
        xp = array_namespace(acc)
        nonzero = acc != 0
        share = xp.where(nonzero, residual / xp.where(nonzero, acc, 1), 1)
        return velocity * xp.clip(share, 0, 1).astype(velocity.dtype, copy=False)

    # -- momentum correction of the reduced result (identity when momentum is 0) -----------
    def _velocity_step(self, result: object, ctx: Context, owned: bool = False) -> object:
        """``R_t - m R_{t-1}``: what an optimizer with momentum m must receive so that its
        momentum buffer equals the reduced velocity ``R_t``. ``owned``: ``result`` may be
        overwritten, so it becomes ``R_t - m R_{t-1}`` in place and the kept ``R_{t-1}``
        becomes ``R_t`` in the same pass. ``result`` itself is never kept."""
        momentum = ctx.data.get(_MOMENTUM, 0.0)
        if not momentum:
            self.results.pop(ctx.name, None)
            return result
        if not self._corrects(result, ctx):
            self.results[ctx.name] = result.copy()
            return result
        previous = self.results[ctx.name]
        if owned and previous.dtype == result.dtype:
            velocity_step_(result, previous, momentum)  # one pass, the bits of the two below
            self.results[ctx.name] = previous
            return result
        self.results[ctx.name] = result.copy()
        # In place in the old result, which is no longer kept: -(p m) + r has the bits of
        # r - p m (negation is exact), without two temporaries of the tensor's size.
        previous *= previous.dtype.type(-momentum)
        previous += result
        return previous

    def _corrects(self, result: object, ctx: Context) -> bool:
        """Whether ``_velocity_step`` changes ``result``: momentum, and a kept ``R_{t-1}``
        of ``result``'s shape."""
        previous = self.results.get(ctx.name)
        return (bool(ctx.data.get(_MOMENTUM, 0.0)) and previous is not None
                and previous.shape == result.shape)

    def decompress(self, payloads: list, ctx: Context) -> object:
        out = self.inner.decompress(payloads, ctx)
        if self.rounds[-1] != ALLREDUCE:
            return out  # all-gathered payloads decompress purely; decompress_all corrects
        return self._velocity_step(out, ctx)

    def decompress_all(self, per_rank: list, ctx: Context, op: str = "average") -> object:
        check_op(op)
        # A new array (``Compressor.decompress_all``'s contract): kept without a copy, which
        # saves a pass over the tensor and its allocation every step.
        result = self.inner.decompress_all(per_rank, ctx, op)
        return self._velocity_step(result, ctx, owned=not self._holds(result, ctx.name))

    def decompress_all_into(self, per_rank: list, ctx: Context, op: str, out: object
                            ) -> object | None:
        """``decompress_all`` into ``out`` where the inner compressor offers it (top-k):
        momentum correction then runs in place on ``out`` and the kept result."""
        check_op(op)
        support = self.inner.decompress_all_into(per_rank, ctx, op, out)
        if support is None:
            return None
        corrected = self._corrects(out, ctx)
        # ``out`` is never kept by ``_velocity_step`` (owned: corrected in place, or copied)
        value = self._velocity_step(out, ctx, owned=True)
        if value is not out:  # the kept result has another dtype: corrected out of place
            out[...] = value
        return slice(None) if corrected else support

    def _holds(self, array: object, name: str) -> bool:
        """Whether ``array`` shares memory with this wrapper's state of tensor ``name``."""
        kept = [s for s in (self.states.get(name), self.velocities.get(name),
                            self.results.get(name)) if s is not None]
        return any(_shares_memory(array, s) for s in kept)

    def residual(self, name: str) -> object | None:
        """The current residual of tensor ``name`` (None before its first step)."""
        return self.states.get(name)

    def velocity(self, name: str) -> object | None:
        """The local velocity of tensor ``name`` under momentum correction (else None)."""
        return self.velocities.get(name)

    def reset_state(self, name: str | None = None) -> None:
        super().reset_state(name)
        for store in (self.velocities, self.results):
            if name is None:
                store.clear()
            else:
                store.pop(name, None)

    def state_dict(self) -> dict:
        """Residuals (``states``), velocities, previous reduced results and the momentum, by
        tensor name, plus the inner compressor's state."""
        return {**super().state_dict(), "momentum": self.momentum,
                "velocities": copy_state(self.velocities), "results": copy_state(self.results)}

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in ("momentum", "velocities", "results") if k not in state]
        if missing:
            raise ValueError(f"the checkpoint's error-feedback state lacks {missing}")
        super().load_state_dict(state)
        self.momentum = check_momentum(state["momentum"])
        self.velocities = copy_state(state["velocities"])
        self.results = copy_state(state["results"])

    def describe(self) -> str:
        spec = self.inner.describe()
        return spec if self.momentum_correction else with_param(spec, "mc", 0)


def _shares_memory(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` may overlap in memory (True where it cannot be told: the
    caller then copies)."""
    check = getattr(array_namespace(a), "may_share_memory", None)
    return True if check is None else bool(check(a, b))
