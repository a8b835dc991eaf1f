"""The ``dear`` schedule: DeAR's decoupled all-reduce (Zhang et al.).

An all-reduce is a reduce-scatter followed by an all-gather. DeAR runs the two halves at
different times: each fused bucket of gradients is reduce-scattered as soon as backward has
produced all of it, and all-gathered during the *next* forward pass, so the all-gather
overlaps forward computation instead of delaying the optimizer step.

Here ``step()`` waits for the reduce-scatters, queues every bucket's all-gather in forward
order (the engine runs them one after another while forward proceeds) and returns without
touching a parameter. The update of a bucket happens in a forward pre-hook, just before the
first module that owns one of its parameters runs: wait for that bucket's all-gather, put
the averaged gradient in ``.grad``, and run the wrapped optimizer's ``step`` on that bucket's
parameters only (with the hyper-parameters the groups had at ``step()``). Element-wise
optimizers (SGD, Adam, ...) give exactly the result of one full step.

The pre-hook is a global module forward pre-hook, so no model needs to be passed. Reading
parameters without running a forward (checkpointing, copying weights, the end of training)
needs ``optimizer.flush()`` first; ``state_dict()``/``load_state_dict()`` flush themselves,
and so does ``state_dict()`` of a module holding the optimizer's parameters (once it has run
a forward), so a checkpoint never holds parameters a step behind.
A parameter used outside its module's forward (functional code) would be stale: backward
then raises instead of training on it.
"""
from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from dlcomm.config import KNOB_BY_NAME, parse_bytes
from dlcomm.torch import mpi_ops
from dlcomm.torch.compression import NoneCompressor
from dlcomm.torch.schedules.base import ScheduleBase

DEFAULT_BUCKET_BYTES = KNOB_BY_NAME["dear_bucket_size"].default

# Optimizers whose step treats each parameter on its own: stepping a subset of parameters
# equals the same subset's part of a full step.
SPLITTABLE_OPTIMIZERS: tuple[type, ...] = tuple(
    getattr(torch.optim, n) for n in ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta",
                                      "RMSprop", "NAdam", "RAdam", "ASGD", "Rprop")
    if hasattr(torch.optim, n))


def bucket_bytes_from_env(environ: Any = None) -> int:
    """``DLCOMM_DEAR_BUCKET_SIZE`` in bytes (suffixes k, M, G), default 4 MiB."""
    env = os.environ if environ is None else environ
    raw = env.get("DLCOMM_DEAR_BUCKET_SIZE", "")
    if not raw:
        return DEFAULT_BUCKET_BYTES
    try:
        value = parse_bytes(raw)
    except ValueError as exc:
        raise ValueError(f"bad DLCOMM_DEAR_BUCKET_SIZE={raw!r}: {exc}") from None
    if value < 1:
        raise ValueError("DLCOMM_DEAR_BUCKET_SIZE must be >= 1 byte")
    return value


def make_buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Split ``params`` (in backward order) into consecutive buckets of one dtype, each up
    to ``bucket_bytes`` (a larger parameter gets a bucket of its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if buckets and buckets[-1][0].dtype == p.dtype and size + nbytes <= bucket_bytes:
            buckets[-1].append(p)
            size += nbytes
        else:
            buckets.append([p])
            size = nbytes
    return buckets


def _check_splittable(optimizer: torch.optim.Optimizer) -> None:
    if not isinstance(optimizer, SPLITTABLE_OPTIMIZERS):
        names = ", ".join(c.__name__ for c in SPLITTABLE_OPTIMIZERS)
        raise ValueError(
            f"schedule='dear' updates each bucket of parameters on its own, which needs an "
            f"optimizer whose step treats parameters independently; "
            f"{type(optimizer).__name__} is not one of {names}. Use schedule='wfbp' "
            "(or 'mgwfbp') for it")


class _Bucket:
    """One fused bucket: its parameters and where it is in the reduce-scatter/all-gather."""

    __slots__ = ("index", "params", "ready", "scatter", "gather", "hyper")

    def __init__(self, index: int, params: list[torch.Tensor]) -> None:
        self.index = index
        self.params = params
        self.ready: set[torch.Tensor] = set()
        self.scatter: Any = None  # reduce-scatter handle (during backward and step)
        self.gather: Any = None  # all-gather handle (from step to the next forward)
        self.hyper: list[dict] | None = None  # param-group settings captured at step()


class DeARSchedule(ScheduleBase):
    """Reduce-scatter during backward, all-gather and per-bucket update during forward."""

    schedule_name = "dear"

    def _start(self) -> None:
        if not self._included:
            raise ValueError("schedule='dear' needs every rank that builds it in its "
                             "process_set; use schedule='wfbp' on ranks outside it")
        _check_splittable(self)
        if self._compression is not NoneCompressor:
            raise ValueError("schedule='dear' sends gradients uncompressed; use "
                             "compression=None/Compression.none, or schedule='wfbp' for "
                             "compression")
        backward_order = list(reversed(self._params))
        if self._user_groups:
            groups = [[p for p in g if p.requires_grad] for g in self._user_groups]
            grouped = {p for g in groups for p in g}
            groups += [[p] for p in backward_order if p not in grouped]
            groups = [g for g in groups if g]
            if any(len({p.dtype for p in g}) > 1 for g in groups):
                raise ValueError("schedule='dear' fuses each group into one flat buffer: a "
                                 "group must hold parameters of one dtype")
        else:
            groups = make_buckets(backward_order, bucket_bytes_from_env())
        self._buckets = [_Bucket(i, g) for i, g in enumerate(groups)]
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._delay = {p: self._passes for p in self._params}
        self._awaiting: dict[torch.Tensor, _Bucket] = {}  # parameters whose update is due
        self._grad_hooks = [p.register_post_accumulate_grad_hook(self._on_grad)
                            for p in self._params]
        self._param_ids = {id(p) for p in self._params}
        self._seen_modules: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._module_hooks: list[Any] = []
        ref = weakref.ref(self)

        def pre_hook(module: torch.nn.Module, args: Any) -> None:
            opt = ref()
            if opt is None:
                handle.remove()
                return
            if module not in opt._seen_modules:
                opt._watch_state_dict(module)
            if opt._awaiting:
                opt._before_forward(module)

        handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
        self._forward_hook = handle

    def _watch_state_dict(self, module: torch.nn.Module) -> None:
        """A module that holds parameters of this optimizer flushes it in ``state_dict()``:
        ``torch.save(model.state_dict(), ...)`` then saves updated parameters."""
        holds = any(p is not None and id(p) in self._param_ids
                    for p in module._parameters.values())
        self._seen_modules[module] = holds
        if not holds:
            return
        ref = weakref.ref(self)

        def state_dict_hook(module: torch.nn.Module, prefix: str, keep_vars: bool) -> None:
            opt = ref()
            if opt is not None:
                opt.flush()

        self._module_hooks.append(module.register_state_dict_pre_hook(state_dict_hook))

    # --- backward: reduce-scatter each bucket once all its gradients exist ----------------
    def _on_grad(self, p: torch.Tensor) -> None:
        if p in self._awaiting:
            raise RuntimeError(
                f"parameter '{self._parameter_names[p]}' was used before its update of the "
                "previous step was applied: schedule='dear' updates a parameter just before the "
                "first module owning it runs, and this parameter was used outside its module's "
                "forward. Call optimizer.flush() before such use, or use schedule='wfbp'")
        bucket = self._bucket_of[p]
        if bucket.scatter is not None and self._delay[p] <= 0:
            raise RuntimeError(
                f"gradient of '{self._parameter_names[p]}' was computed more than "
                f"backward_passes_per_step={self._passes} times before step()")
        self._delay[p] -= 1
        if self._delay[p] > 0:
            return
        bucket.ready.add(p)
        if len(bucket.ready) == len(bucket.params):
            self._reduce_scatter(bucket)

    def _reduce_scatter(self, bucket: _Bucket) -> None:
        flat = torch.cat([self._dense_grad(p).detach().reshape(-1) for p in bucket.params])
        pre, post = self._scales()
        bucket.scatter = mpi_ops.reducescatter_async(
            flat, name=f"{self._prefix}.rs{bucket.index}", op=self._op,
            process_set=self._process_set, prescale_factor=pre, postscale_factor=post)
        bucket.ready.clear()

    # --- step: all reduce-scatters done, queue the all-gathers -----------------------------
    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("schedule='dear' cannot run a closure: parameters are updated "
                             "bucket by bucket during the next forward. Use schedule='wfbp'")
        self.flush()  # updates not applied by a forward since the last step (unused params)
        for bucket in self._buckets:
            if bucket.scatter is None:  # gradients backward did not produce travel as zeros
                self._reduce_scatter(bucket)
        shards = [bucket.scatter.wait() for bucket in self._buckets]
        for p in self._delay:
            self._delay[p] = self._passes
        # Nothing of ours is in flight here: a safe point to change engine settings.
        self._record_step_for_autotune()
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for bucket in reversed(self._buckets):  # forward order: the last bucket of backward
            bucket.gather = mpi_ops.allgather_async(
                shards[bucket.index], name=f"{self._prefix}.ag{bucket.index}",
                process_set=self._process_set)
            bucket.scatter = None
            bucket.hyper = hyper
            for p in bucket.params:
                self._awaiting[p] = bucket

    # --- forward: update a bucket just before its parameters are used ---------------------
    def _before_forward(self, module: torch.nn.Module) -> None:
        for p in module._parameters.values():
            bucket = self._awaiting.get(p) if p is not None else None
            if bucket is not None:
                self._apply(bucket)

    def _apply(self, bucket: _Bucket) -> None:
        """Wait for the bucket's averaged gradient and step its parameters with it."""
        flat = bucket.gather.wait()
        bucket.gather = None
        for p in bucket.params:
            del self._awaiting[p]
        members = set(bucket.params)
        saved_groups = self.param_groups
        saved_grads = [p.grad for p in bucket.params]
        offset = 0
        for p in bucket.params:
            p.grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.param_groups = [dict(h, params=[p for p in g["params"] if p in members])
                             for h, g in zip(bucket.hyper, saved_groups)]
        try:
            self._base_step()
        finally:
            self.param_groups = saved_groups
            for p, g in zip(bucket.params, saved_grads):
                p.grad = g

    def flush(self) -> None:
        """Apply every update still waiting for a forward pass, in forward order.

        Call it before reading parameters outside a forward pass: saving a checkpoint,
        evaluating with code that does not call the modules, and at the end of training.
        """
        for bucket in reversed(self._buckets):
            if bucket.gather is not None:
                self._apply(bucket)

    @property
    def pending_updates(self) -> int:
        """How many buckets still wait for their all-gather and update."""
        return sum(1 for b in self._buckets if b.gather is not None)

    def synchronize(self) -> None:
        raise RuntimeError(
            "schedule='dear' never holds all averaged gradients at once (each bucket is "
            "updated during the next forward), so synchronize() and operations over all "
            "gradients such as clipping by the global norm are not available; use "
            "schedule='wfbp' for them")

    def skip_synchronize(self) -> Any:
        self.synchronize()

    def state_dict(self) -> dict:
        self.flush()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.flush()
        return super().load_state_dict(state_dict)

    def close(self) -> None:
        """Flush and remove the hooks (the optimizer then no longer trains)."""
        self.flush()
        self._forward_hook.remove()
        for h in self._grad_hooks + self._module_hooks:
            h.remove()
