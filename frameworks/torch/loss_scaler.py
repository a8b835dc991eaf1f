"""``LossScaler``: dynamic loss scaling whose skip decision every rank shares.

16-bit gradients overflow; a loss scaler multiplies the loss by a large factor, skips the
steps whose gradients hold inf/NaN and lowers the factor then. On several ranks the decision
must be the same everywhere, or the ranks step different times and their parameters part.
The scaler therefore agrees on one overflow flag per step: when the gradients travel through
a plain sum (no compressor, or the fp16 cast) an inf/NaN on any rank reaches every rank's
averaged gradient, so the check of the averaged gradients is the agreed flag and no message
is added (the flag is fused with the gradients); otherwise (a compressor that may drop
values, ``loss_scale_flag='separate'``) each rank checks its local gradients before they
are sent and the ranks all-reduce that one flag with ``Max``.
"""
from __future__ import annotations

from typing import Any

import torch

from dlcomm.config import knob_value
from dlcomm.ops import Average, Max, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch import mpi_ops
from dlcomm.torch.compression import FP16Compressor, NoneCompressor

FLAG_MODES = ("auto", "fused", "separate")


def gradients_finite(grads: list[torch.Tensor]) -> bool:
    """True when no gradient holds an inf or NaN."""
    return all(bool(torch.isfinite(g).all()) for g in grads if g is not None)


def agreed_overflow(local_overflow: bool, process_set: ProcessSet = global_process_set,
                    name: str = "loss_scaler.overflow") -> bool:
    """True on every rank when any rank of ``process_set`` saw an overflow (one all-reduced
    flag with ``Max``)."""
    flag = torch.tensor([1.0 if local_overflow else 0.0])
    return bool(mpi_ops.allreduce(flag, name=name, op=Max, process_set=process_set)[0] > 0)


def _carries_nonfinite(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s all-reduce carries an inf/NaN of one rank to every rank (a
    plain or fp16-cast sum/average of the gradients of a ``DistributedOptimizer``)."""
    compression = getattr(optimizer, "_compression", None)
    op = getattr(optimizer, "_op", None)
    return (hasattr(optimizer, "_gradient_inspectors")
            and compression in (NoneCompressor, FP16Compressor)
            and op in (Average, ReduceOp.SUM))


class LossScaler:
    """Dynamic loss scaling for a (distributed) torch optimizer; every rank skips the same
    steps and keeps the same scale.

    Use: ``scaler.scale(loss).backward(); scaler.step(); optimizer.zero_grad()``.
    ``step`` synchronizes a ``DistributedOptimizer``, agrees on the overflow flag, divides
    the gradients by the scale and steps unless some rank overflowed, then updates the scale:
    times ``backoff_factor`` after an overflow, times ``growth_factor`` after
    ``loss_scale_growth_interval`` clean steps. ``loss_scale_flag``: ``auto`` (fused when the
    all-reduce carries inf/NaN, else separate), ``fused`` or ``separate``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, loss_scale_init: float | None = None,
                 loss_scale_growth_interval: int | None = None, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, loss_scale_flag: str | None = None,
                 process_set: ProcessSet = global_process_set) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        scale = float(knob_value("loss_scale_init", loss_scale_init))
        interval = knob_value("loss_scale_growth_interval", loss_scale_growth_interval)
        mode = knob_value("loss_scale_flag", loss_scale_flag)
        if not scale > 0 or scale == float("inf"):
            raise ValueError(f"loss_scale_init must be a finite number > 0, got {scale!r}")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"loss_scale_growth_interval must be an int >= 1, got "
                             f"{interval!r}")
        if not growth_factor > 1.0:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor!r}")
        if mode not in FLAG_MODES:
            raise ValueError(f"loss_scale_flag must be one of {FLAG_MODES}, got {mode!r}")
        carries = _carries_nonfinite(optimizer)
        if mode == "fused" and not carries:
            raise ValueError("loss_scale_flag='fused' needs a DistributedOptimizer whose "
                             "gradients travel uncompressed or fp16-cast with op Average or "
                             "Sum (a compressor may drop an inf); use 'separate' or 'auto'")
        self.optimizer = optimizer
        self.process_set = process_set
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = interval
        self.fused = mode == "fused" or (mode == "auto" and carries)
        self._scale = scale
        self._clean_steps = 0
        self._local_overflow = False
        self.skipped_steps = 0
        self.distributed = hasattr(optimizer, "synchronize") and hasattr(
            optimizer, "skip_synchronize")
        if not self.fused and hasattr(optimizer, "_gradient_inspectors"):
            optimizer._gradient_inspectors.append(self._inspect)

    @property
    def loss_scale(self) -> float:
        """The factor the loss is multiplied by now."""
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the current scale (call ``backward`` on the result)."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        return loss * self._scale

    def _inspect(self, grads: list[torch.Tensor]) -> None:
        """Record an inf/NaN among local gradients before they are sent."""
        if not self._local_overflow and not gradients_finite(grads):
            self._local_overflow = True

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad for g in self.optimizer.param_groups for p in g["params"]
                if p.grad is not None]

    def step(self, closure: Any = None) -> bool:
        """Synchronize, agree on overflow, unscale and step unless some rank overflowed;
        update the scale. Returns whether the optimizer stepped (the same on every rank)."""
        if self.distributed:
            self.optimizer.synchronize()
        grads = self._grads()
        local = self._local_overflow or not gradients_finite(grads)
        self._local_overflow = False
        if self.fused or not self.distributed:
            overflow = local  # the averaged gradients already carry every rank's inf/NaN
        else:
            overflow = agreed_overflow(local, self.process_set)
        if overflow:
            self.skipped_steps += 1
            self._scale *= self.backoff_factor
            self._clean_steps = 0
            if self.distributed:
                self.optimizer._synchronized = False  # the next backward starts afresh
            # A compressor's error memory took in this step's inf/NaN: forget it on every
            # rank, or it would poison all later steps.
            reset = getattr(getattr(self.optimizer, "_core_compressor", None), "reset_state",
                            None)
            if reset is not None:
                reset()
            return False
        inverse = 1.0 / self._scale
        with torch.no_grad():
            for g in grads:
                g.mul_(inverse)
        if self.distributed:
            with self.optimizer.skip_synchronize():
                self.optimizer.step(closure)
        else:
            self.optimizer.step(closure)
        self._clean_steps += 1
        if self._clean_steps >= self.growth_interval:
            self._scale *= self.growth_factor
            self._clean_steps = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        """Scale and counters, to checkpoint with the optimizer."""
        return {"scale": self._scale, "clean_steps": self._clean_steps,
                "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
