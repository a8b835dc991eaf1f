"""``KFACPreconditioner``: distributed K-FAC beside ``dlcomm.torch.DistributedOptimizer``.

Each registered layer's Kronecker factors are computed in its forward hook (A, from the
input) and in a hook on its output's gradient (G), and their all-reduce is handed to dlcomm's
engine at once under a stable name: the engine negotiates and fuses neighbouring factors
(and gradients) while the rest of the forward and backward pass runs (SPD-KFAC's pipelining).
Only the upper triangle of each symmetric factor travels.

Inversions are placed on ranks by cost (``dlcomm.kfac.placement``); after an inverse update
each column of gradient workers all-gathers its inverses in one collective, and where layers
have fewer gradient workers than ranks (MEM-OPT, HYBRID-OPT) each row all-gathers the
preconditioned gradients. Usage follows kfac-pytorch with Horovod::

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=...)
    preconditioner = KFACPreconditioner(model, lr=lr, ...)
    loss.backward()
    optimizer.synchronize()              # gradients averaged over ranks
    preconditioner.step()                # gradients preconditioned in place
    with optimizer.skip_synchronize():
        optimizer.step()
"""
from __future__ import annotations

import functools
import itertools
import logging
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Union

import numpy as np
import torch

from dlcomm import basics
from dlcomm import functions as core_functions
from dlcomm.heterogeneity.agreement import check_same_settings
from dlcomm.kfac import costs, curvature
from dlcomm.kfac import factors as kf
from dlcomm.kfac.exchange_plan import COMPUTE_METHODS, FACTORS, ExchangePlan
from dlcomm.kfac.groups import grid_process_sets
from dlcomm.kfac.placement import METHODS, place_inversions
from dlcomm.kfac.strategy import DistributedStrategy, resolve_grad_workers
from dlcomm.ops import Average
from dlcomm.torch import mpi_ops
from dlcomm.torch.kfac.layers import KFACLayer, register_layers
from dlcomm.torch.kfac.linalg import TORCH_LINALG

logger = logging.getLogger("dlcomm.kfac")

IntSchedule = Union[Callable[[int], int], int]
FloatSchedule = Union[Callable[[int], float], float]

_instances = itertools.count()


def _enum_text(value: Any) -> str:
    """A strategy/method given as a string or as an enum (kfac-pytorch's enums included)."""
    if isinstance(value, str):
        return value.strip().lower().replace("_", "-")
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return name.lower().replace("_", "-")
    raise TypeError(f"expected a string or an enum member, got {type(value).__name__}")


def _check_schedule(value: Any, name: str, *, minimum: float, inclusive: bool = False,
                    maximum: float | None = None, integer: bool = False) -> Any:
    if callable(value):
        return value
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an int" if integer else "a number"
        raise TypeError(f"{name} must be {what} or a callable of the K-FAC step, got "
                        f"{type(value).__name__}")
    low_ok = value >= minimum if inclusive else value > minimum
    if not low_ok or (maximum is not None and value > maximum):
        low = f"{'>=' if inclusive else '>'} {minimum}"
        high = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be {low}{high}, got {value}")
    return value


def _numpy_dtype(dtype: torch.dtype | None, name: str, default: np.dtype) -> np.dtype:
    if dtype is None:
        return default
    table = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
    if dtype not in table:
        raise ValueError(f"{name} must be torch.float32 or torch.float64 (or None), got {dtype}")
    return table[dtype]


class _ObjectGather:
    """What ``check_same_settings`` needs from a communicator: an all-gather of objects."""

    def allgather(self, obj: Any) -> list[Any]:
        return core_functions.allgather_object(obj, name="kfac.settings")


class KFACPreconditioner:
    """Precondition the gradients of a model's ``Linear`` and ``Conv2d`` layers with K-FAC.

    Arguments mirror kfac-pytorch's ``KFACPreconditioner`` (see docs/kfac.md for each):
    ``factor_update_steps``, ``inv_update_steps``, ``damping``, ``factor_decay``, ``kl_clip``
    (None: no clipping) and ``lr`` take a value or a callable of the K-FAC step;
    ``accumulation_steps``, ``assignment_strategy`` (``compute``, ``memory`` or
    ``measured``), ``colocate_factors``, ``compute_method`` (``eigen`` or ``inverse``),
    ``compute_eigenvalue_outer_product``, ``grad_worker_fraction`` (a
    ``DistributedStrategy``, its name, or a fraction of the ranks), ``symmetry_aware``
    (send factors' and inverses' upper triangles only), ``factor_dtype``, ``inv_dtype``,
    ``skip_layers`` (regular expressions on layer and class names),
    ``update_factors_in_hook`` (False: factors are all-reduced at ``step()`` instead of as
    the pass produces them). ``placement`` (``optimal``, ``lpt`` or ``greedy``) chooses how
    inversions are balanced over ranks.

    Collective: build it on every rank, with the same model and arguments, after
    ``dlcomm.torch.init()``; ``step()`` and ``load_state_dict()`` are collective too.
    """

    def __init__(self, model: torch.nn.Module, *,
                 factor_update_steps: IntSchedule = 1,
                 inv_update_steps: IntSchedule = 1,
                 damping: FloatSchedule = 0.001,
                 factor_decay: FloatSchedule = 0.95,
                 kl_clip: FloatSchedule | None = 0.001,
                 lr: FloatSchedule = 0.1,
                 accumulation_steps: int = 1,
                 assignment_strategy: Any = "compute",
                 colocate_factors: bool = True,
                 compute_method: Any = "eigen",
                 compute_eigenvalue_outer_product: bool = True,
                 grad_worker_fraction: Any = DistributedStrategy.COMM_OPT,
                 symmetry_aware: bool = True,
                 factor_dtype: torch.dtype | None = None,
                 inv_dtype: torch.dtype = torch.float32,
                 skip_layers: Sequence[str] | str | None = None,
                 update_factors_in_hook: bool = True,
                 placement: str = "optimal",
                 loglevel: int = logging.DEBUG) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not basics.is_initialized():
            raise ValueError("KFACPreconditioner needs dlcomm running: call "
                             "dlcomm.torch.init() first (on every rank)")
        self._factor_update_steps = _check_schedule(factor_update_steps, "factor_update_steps",
                                                    minimum=1, inclusive=True, integer=True)
        self._inv_update_steps = _check_schedule(inv_update_steps, "inv_update_steps",
                                                 minimum=1, inclusive=True, integer=True)
        self._damping = _check_schedule(damping, "damping", minimum=0.0)
        self._factor_decay = _check_schedule(factor_decay, "factor_decay", minimum=0.0,
                                             maximum=1.0)
        self._kl_clip = None if kl_clip is None else _check_schedule(kl_clip, "kl_clip",
                                                                     minimum=0.0)
        self._lr = _check_schedule(lr, "lr", minimum=0.0, inclusive=True)
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) \
                or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be an int >= 1, got "
                             f"{accumulation_steps!r}")
        if not callable(inv_update_steps) and not callable(factor_update_steps) \
                and inv_update_steps % factor_update_steps:
            warnings.warn("inv_update_steps is best a multiple of factor_update_steps",
                          stacklevel=2)
        self.assignment_strategy = _enum_text(assignment_strategy)
        if self.assignment_strategy not in costs.STRATEGIES:
            raise ValueError(f"assignment_strategy {assignment_strategy!r} is not one of "
                             f"{', '.join(costs.STRATEGIES)}")
        self.compute_method = _enum_text(compute_method)
        if self.compute_method not in COMPUTE_METHODS:
            raise ValueError(f"compute_method {compute_method!r} is not one of "
                             f"{', '.join(COMPUTE_METHODS)}")
        if placement not in METHODS:
            raise ValueError(f"placement {placement!r} is not one of {', '.join(METHODS)}")
        for flag, name in ((colocate_factors, "colocate_factors"),
                           (compute_eigenvalue_outer_product, "compute_eigenvalue_outer_product"),
                           (symmetry_aware, "symmetry_aware"),
                           (update_factors_in_hook, "update_factors_in_hook")):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if isinstance(skip_layers, str):
            skip_layers = [skip_layers]
        skip_layers = list(skip_layers or [])
        if not all(isinstance(p, str) for p in skip_layers):
            raise TypeError("skip_layers must be a list of regular expressions (strings)")
        self.factor_dtype = _numpy_dtype(factor_dtype, "factor_dtype", np.dtype(np.float32))
        self.inv_dtype = _numpy_dtype(inv_dtype, "inv_dtype", np.dtype(np.float32))
        self.accumulation_steps = accumulation_steps
        self.colocate_factors = colocate_factors
        self.compute_eigenvalue_outer_product = compute_eigenvalue_outer_product
        self.symmetry_aware = symmetry_aware
        self.skip_layers = skip_layers
        self.update_factors_in_hook = update_factors_in_hook
        self.placement_method = placement
        self._steps = 0
        self._rank, self._size = basics.rank(), basics.size()

        self.grid = resolve_grad_workers(grad_worker_fraction, self._size)
        self.distributed_strategy = self.grid.strategy
        self.grad_worker_fraction = self.grid.grad_workers / self._size
        if not colocate_factors and self.distributed_strategy is DistributedStrategy.MEM_OPT \
                and self._size > 1:
            warnings.warn("MEM-OPT (one gradient worker per layer) needs colocate_factors="
                          "True; enabling it", stacklevel=2)
            self.colocate_factors = True

        self._layers: list[KFACLayer] = register_layers(model, skip_layers, self.factor_dtype)
        self._by_name = {layer.name: layer for layer in self._layers}
        self._by_module = {layer.module: layer for layer in self._layers}
        self._prefix = f"kfac{next(_instances)}"
        dims = {layer.name: (layer.a_dim, layer.g_dim) for layer in self._layers}
        if self._size > 1:
            check_same_settings(_ObjectGather(), "KFACPreconditioner", self._settings(dims))
        measured = None
        if self.assignment_strategy == "measured":
            sizes = sorted({n for pair in dims.values() for n in pair})
            mine = (costs.measure_inversion_seconds(sizes, self.compute_method,
                                                    dtype=self.inv_dtype, linalg=TORCH_LINALG)
                    if self._rank == 0 else None)
            measured = core_functions.broadcast_object(mine, 0, name=f"{self._prefix}.costs")
        work = costs.placement_work(
            dims, self.assignment_strategy, self.compute_method, measured=measured,
            inv_update_steps=(self._inv_update_steps if not callable(self._inv_update_steps)
                              else 1),
            preconditioning_on_owner=self.distributed_strategy is DistributedStrategy.MEM_OPT)
        self.placement = place_inversions(work, self.grid, colocate_factors=self.colocate_factors,
                                          method=placement)
        self._plan = ExchangePlan(self.placement, dims, self.compute_method, symmetry_aware)
        self._sets = grid_process_sets(self.grid, self._rank)
        self._inverted: set[str] = set()  # layers whose inverses this rank holds
        self._hooks = [layer.module.register_forward_hook(self._on_forward)
                       for layer in self._layers]
        logger.log(loglevel, "K-FAC registered %d layers; placement %s (makespan %.3g, "
                   "optimal=%s): %s", len(self._layers), self.placement.method,
                   self.placement.makespan, self.placement.optimal,
                   {name: dict(o) for name, o in self.placement.owners.items()})

    # --- schedules --------------------------------------------------------------------------
    def _value(self, value: Any) -> Any:
        return value(self._steps) if callable(value) else value

    @property
    def steps(self) -> int:
        """K-FAC steps taken (``step()`` calls)."""
        return self._steps

    @property
    def damping(self) -> float:
        return self._value(self._damping)

    @property
    def factor_decay(self) -> float:
        return self._value(self._factor_decay)

    @property
    def kl_clip(self) -> float | None:
        return self._value(self._kl_clip)

    @property
    def lr(self) -> float:
        return self._value(self._lr)

    @property
    def factor_update_steps(self) -> int:
        return self._value(self._factor_update_steps)

    @property
    def inv_update_steps(self) -> int:
        return self._value(self._inv_update_steps)

    @property
    def layers(self) -> dict[str, KFACLayer]:
        """The registered layers by module name."""
        return dict(self._by_name)

    def _settings(self, dims: dict[str, tuple[int, int]]) -> dict[str, Any]:
        fixed = {name: getattr(self, f"_{name}") for name in
                 ("factor_update_steps", "inv_update_steps", "damping", "factor_decay",
                  "kl_clip", "lr")}
        return {
            "layers": [(la.name, la.kind, *dims[la.name]) for la in self._layers],
            **{k: ("<callable>" if callable(v) else v) for k, v in fixed.items()},
            "accumulation_steps": self.accumulation_steps,
            "assignment_strategy": self.assignment_strategy,
            "colocate_factors": self.colocate_factors,
            "compute_method": self.compute_method,
            "grad_workers": self.grid.grad_workers,
            "symmetry_aware": self.symmetry_aware,
            "factor_dtype": str(self.factor_dtype),
            "inv_dtype": str(self.inv_dtype),
            "update_factors_in_hook": self.update_factors_in_hook,
            "placement": self.placement_method,
        }

    # --- hooks: factors as the pass produces them -------------------------------------------
    def _collecting(self, module: torch.nn.Module) -> bool:
        return (module.training and torch.is_grad_enabled()
                and self._steps % self.factor_update_steps == 0)

    def _on_forward(self, module: torch.nn.Module, inputs: tuple, output: Any) -> None:
        if not self._collecting(module):
            return
        layer = self._by_module[module]
        with torch.no_grad():
            count = layer.add_to_batch("A", layer.input_factor(inputs[0]))
        if self.update_factors_in_hook and count == self.accumulation_steps:
            self._submit(layer, "A")
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(functools.partial(self._on_output_grad, layer))

    def _on_output_grad(self, layer: KFACLayer, grad: torch.Tensor) -> None:
        with torch.no_grad():
            count = layer.add_to_batch("G", layer.output_factor(grad))
        if self.update_factors_in_hook and count == self.accumulation_steps:
            self._submit(layer, "G")

    def _submit(self, layer: KFACLayer, factor: str) -> None:
        """Start the average of this rank's batch factor over all ranks."""
        batch = layer.take_batch(factor)
        if batch is None:
            return
        packed = kf.pack_upper(batch) if self.symmetry_aware else batch.reshape(-1)
        tensor = torch.from_numpy(packed)
        if self._size == 1:
            layer.pending[factor].append((tensor, None))
            return
        index = len(layer.pending[factor])
        name = f"{self._prefix}.{factor}.{layer.name}" + (f".{index}" if index else "")
        handle = mpi_ops.allreduce_async_(tensor, name=name, op=Average)
        layer.pending[factor].append((tensor, handle))

    # --- the step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self) -> None:
        """Finish the factors' all-reduces, update the running factors, recompute and exchange
        inverses every ``inv_update_steps``, and replace each registered layer's gradient by
        its preconditioned (and KL-clipped) gradient. Call after the gradients are averaged
        (``optimizer.synchronize()``) and before ``optimizer.step()``."""
        for layer in self._layers:  # micro-batches not yet sent (or all, without hooks)
            for factor in FACTORS:
                if layer.batch_count[factor]:
                    self._submit(layer, factor)
        self._finish_factors()
        if self._steps % self.inv_update_steps == 0:
            self._update_inverses()
        self._precondition()
        self._steps += 1

    def _finish_factors(self) -> None:
        decay = self.factor_decay
        for layer in self._layers:
            for factor in FACTORS:
                pending = layer.pending[factor]
                if not pending:
                    continue
                results = [(tensor if handle is None else handle.wait()).numpy()
                           for tensor, handle in pending]
                pending.clear()
                mean = results[0]
                if len(results) > 1:  # the layer ran more than once in the pass
                    mean = np.mean(results, axis=0, dtype=results[0].dtype)
                dim = layer.a_dim if factor == "A" else layer.g_dim
                batch = (kf.unpack_upper(mean, dim) if self.symmetry_aware
                         else mean.reshape(dim, dim))
                layer.factors[factor] = kf.running_average(layer.factors[factor], batch, decay)

    def _ready_layers(self) -> set[str]:
        return {la.name for la in self._layers
                if la.factors["A"] is not None and la.factors["G"] is not None}

    def _update_inverses(self) -> None:
        """Invert the factors this rank owns; all-gather them over this rank's column."""
        ready = self._ready_layers()
        if not ready:
            return
        damping = self.damping
        parts = []
        for name, factor in self._plan.owned(self._rank, ready):
            matrix = self._by_name[name].factors[factor]
            if self.compute_method == "eigen":
                values, vectors = curvature.eigen_decomposition(matrix, self.inv_dtype,
                                                                 TORCH_LINALG)
                parts += [vectors.reshape(-1), values]
            else:
                inverse = curvature.damped_inverse(matrix, damping, self.inv_dtype,
                                                   TORCH_LINALG)
                parts.append(kf.pack_upper(inverse) if self.symmetry_aware
                             else inverse.reshape(-1))
        payload = np.concatenate(parts) if parts else np.empty(0, dtype=self.inv_dtype)
        column = self.grid.column_of(self._rank)
        if self._sets.column is not None:
            gathered = mpi_ops.allgather(torch.from_numpy(payload),
                                         name=f"{self._prefix}.inverses.{column}",
                                         process_set=self._sets.column).numpy()
        else:
            gathered = payload
        for seg in self._plan.inverse_segments(column, ready):
            chunk = gathered[seg.offset:seg.offset + seg.size]
            layer = self._by_name[seg.layer]
            n = layer.a_dim if seg.factor == "A" else layer.g_dim
            if self.compute_method == "eigen":
                layer.second_order["Q" + seg.factor] = chunk[:n * n].reshape(n, n)
                layer.second_order["d" + seg.factor] = chunk[n * n:]
            elif self.symmetry_aware:
                layer.second_order[seg.factor] = kf.unpack_upper(chunk, n)
            else:
                layer.second_order[seg.factor] = chunk.reshape(n, n)
        if self.compute_method == "eigen" and self.compute_eigenvalue_outer_product:
            for name in self._plan.column_layers(column, ready):
                so = self._by_name[name].second_order
                so["scale"] = curvature.eigen_scale(so["dG"], so["dA"], damping)
        self._inverted = ready

    def _preconditioned(self, layer: KFACLayer, grad: np.ndarray) -> np.ndarray:
        so = layer.second_order
        if self.compute_method == "inverse":
            return curvature.precondition_inverse(grad, so["G"], so["A"])
        scale = so.get("scale") if self.compute_eigenvalue_outer_product else None
        if scale is None:
            scale = curvature.eigen_scale(so["dG"], so["dA"], self.damping)
        return curvature.precondition_eigen(grad, so["QG"], so["QA"], scale)

    def _precondition(self) -> None:
        """Precondition this rank's layers, all-gather over the row, KL-clip, write back."""
        ready = self._inverted
        if not ready:
            return
        grads = {name: self._by_name[name].grad_matrix() for name in ready}
        column, row = self.grid.column_of(self._rank), self.grid.row_of(self._rank)
        mine = self._plan.column_layers(column, ready)
        update: dict[str, np.ndarray] = {}
        for name in mine:
            layer = self._by_name[name]
            grad = grads[name]
            if grad is None:
                grad = np.zeros((layer.g_dim, layer.a_dim), dtype=self.inv_dtype)
            update[name] = self._preconditioned(layer, grad)
        if self._sets.row is not None:
            payload = (np.concatenate([update[name].reshape(-1) for name in mine]) if mine
                       else np.empty(0, dtype=self.inv_dtype))
            gathered = mpi_ops.allgather(torch.from_numpy(payload),
                                         name=f"{self._prefix}.grads.{row}",
                                         process_set=self._sets.row).numpy()
            for seg in self._plan.grad_segments(row, ready):
                layer = self._by_name[seg.layer]
                update[seg.layer] = gathered[seg.offset:seg.offset + seg.size].reshape(
                    layer.g_dim, layer.a_dim)
        scale = 1.0
        kl_clip = self.kl_clip
        if kl_clip is not None:
            lr = self.lr
            total = 0.0
            for name in self._plan.placement.layers:  # layer order: same sum on every rank
                if name in ready and grads[name] is not None:
                    total += float(np.multiply(update[name], grads[name],
                                               dtype=np.float64).sum())
            scale = curvature.kl_clip_scale(total * lr * lr, kl_clip)
        for name in ready:
            if grads[name] is None:
                continue
            value = update[name]
            if scale != 1.0:
                value = value * value.dtype.type(scale)
            self._by_name[name].set_grad(value)

    # --- state --------------------------------------------------------------------------------
    def state_dict(self, include_factors: bool = True) -> dict[str, Any]:
        """The step count, the non-callable hyper-parameters and (by default) every layer's
        running factors, as kfac-pytorch saves them."""
        state: dict[str, Any] = {"steps": self._steps}
        for name in ("factor_update_steps", "inv_update_steps", "damping", "factor_decay",
                     "kl_clip", "lr"):
            value = getattr(self, f"_{name}")
            if not callable(value):
                state[name] = value
        if include_factors:
            state["layers"] = {
                layer.name: {f: (None if layer.factors[f] is None
                                 else torch.from_numpy(layer.factors[f].copy()))
                             for f in FACTORS}
                for layer in self._layers}
        return state

    def load_state_dict(self, state_dict: dict[str, Any], compute_inverses: bool = True) -> None:
        """Restore ``state_dict()``'s content; with ``compute_inverses`` the inverses are
        recomputed from the loaded factors (collective: call on every rank)."""
        if not isinstance(state_dict, dict) or "steps" not in state_dict:
            raise ValueError("state_dict must be a dict from KFACPreconditioner.state_dict()")
        self._steps = int(state_dict["steps"])
        for name in ("factor_update_steps", "inv_update_steps", "damping", "factor_decay",
                     "kl_clip", "lr"):
            if name in state_dict:
                setattr(self, f"_{name}", state_dict[name])
        layers = state_dict.get("layers")
        if layers is None:
            if compute_inverses:
                warnings.warn("the state_dict holds no factors, so no inverses can be "
                              "computed; they will be at the next inverse update", stacklevel=2)
            return
        unknown = sorted(set(layers) - set(self._by_name))
        missing = sorted(set(self._by_name) - set(layers))
        if unknown or missing:
            raise ValueError(f"state_dict layers do not match the registered layers "
                             f"(unknown: {unknown}, missing: {missing})")
        for name, saved in layers.items():
            layer = self._by_name[name]
            for factor in FACTORS:
                value = saved.get(factor)
                if value is None:
                    layer.factors[factor] = None
                    continue
                dim = layer.a_dim if factor == "A" else layer.g_dim
                array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) \
                    else np.asarray(value)
                if array.shape != (dim, dim):
                    raise ValueError(f"factor {factor} of {name!r} has shape {array.shape}, "
                                     f"expected ({dim}, {dim})")
                layer.factors[factor] = array.astype(self.factor_dtype, copy=True)
        if compute_inverses:
            self._update_inverses()

    def reset_batch(self) -> None:
        """Drop the factors accumulated since the last step (not those already sent)."""
        for layer in self._layers:
            for factor in FACTORS:
                layer.take_batch(factor)

    def memory_usage(self) -> dict[str, int]:
        """Bytes this rank holds for factors and second-order results."""
        factors = sum(f.nbytes for la in self._layers for f in la.factors.values()
                      if f is not None)
        second = sum(a.nbytes for la in self._layers for a in la.second_order.values())
        return {"factors": factors, "second_order": second, "total": factors + second}

    def remove(self) -> None:
        """Remove the hooks and the process sets this preconditioner added (collective)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._sets.remove()

    def __repr__(self) -> str:
        return (f"KFACPreconditioner(layers={len(self._layers)}, "
                f"strategy={self.distributed_strategy.value}, "
                f"grad_worker_fraction={self.grad_worker_fraction:g}, "
                f"compute_method={self.compute_method}, placement={self.placement.method}, "
                f"steps={self._steps})")
