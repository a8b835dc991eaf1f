"""Profile a torch model into a ``Workload`` with hooks (needs torch; import it only then).

Forward: pre- and post-forward hooks on every leaf module time its forward. Backward: a
post-accumulate-grad hook on every parameter stamps when its gradient is ready (what
wait-free backpropagation sends); a layer's backward time is the gap between the previous
layer's gradients (in backward order) and its own, so parameterless layers' backward time
lands in the next layer that owns gradients. Each figure is the median over ``repeats``
iterations after ``warmup``; the update is the wrapped optimizer's ``step`` when one is
given.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dlcomm.tools.simulate.workload import Layer, Tensor, Workload


def _leaves(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(name or "(model)", m) for name, m in model.named_modules()
            if not list(m.children())]


def profile_model(model: torch.nn.Module, make_batch: Callable[[], tuple[Any, Any]],
                  loss_fn: Callable[[Any, Any], torch.Tensor] | None = None, *,
                  optimizer: torch.optim.Optimizer | None = None, warmup: int = 2,
                  repeats: int = 5, name: str = "model") -> Workload:
    """Time ``model`` on batches from ``make_batch() -> (inputs, targets)`` with ``loss_fn``
    (default cross-entropy); returns the per-layer workload at that batch size."""
    if warmup < 0 or repeats < 1:
        raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup}, {repeats}")
    loss_fn = loss_fn or torch.nn.functional.cross_entropy
    leaves = _leaves(model)
    if not leaves:
        raise ValueError("the model has no modules to profile")
    param_name = {id(p): n for n, p in model.named_parameters()}
    owner: dict[int, int] = {}
    for li, (_, module) in enumerate(leaves):
        for p in module.parameters(recurse=False):
            if p.requires_grad:
                owner.setdefault(id(p), li)
    unowned = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in owner]
    if unowned:
        raise ValueError(f"parameters outside leaf modules cannot be placed: {unowned[:5]}; "
                         "profile a model whose parameters belong to leaf modules")

    forward_s = [0.0] * len(leaves)
    started: dict[int, float] = {}
    order: list[int] = []
    ready: dict[int, float] = {}
    hooks = []
    for li, (_, module) in enumerate(leaves):
        def pre(_m: Any, _i: Any, li: int = li) -> None:
            started[li] = time.perf_counter()
            if li not in order:
                order.append(li)

        def post(_m: Any, _i: Any, _o: Any, li: int = li) -> None:
            forward_s[li] += time.perf_counter() - started.pop(li)

        hooks += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    for p in model.parameters():
        if p.requires_grad:
            def stamp(param: torch.Tensor) -> None:
                ready[id(param)] = time.perf_counter()

            hooks.append(p.register_post_accumulate_grad_hook(stamp))

    samples: list[dict[str, Any]] = []
    batch_size = None
    try:
        for it in range(warmup + repeats):
            inputs, targets = make_batch()
            batch_size = int(inputs.shape[0])
            model.zero_grad(set_to_none=True)
            forward_s[:] = [0.0] * len(leaves)
            ready.clear()
            t0 = time.perf_counter()
            loss = loss_fn(model(inputs), targets)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            update = 0.0
            if optimizer is not None:
                optimizer.step()
                update = time.perf_counter() - t2
            if it >= warmup:
                samples.append({"forward": list(forward_s), "forward_total": t1 - t0,
                                "backward_start": t1, "backward_end": t2,
                                "ready": dict(ready), "update": update})
    finally:
        for h in hooks:
            h.remove()

    layers_in_order = order + [li for li in range(len(leaves)) if li not in order]
    per_layer_fwd = {li: statistics.median(s["forward"][li] for s in samples)
                     for li in layers_in_order}
    total_fwd = statistics.median(s["forward_total"] for s in samples)
    timed = sum(per_layer_fwd.values())
    scale = total_fwd / timed if timed > 0 else 0.0  # ops outside modules, spread evenly
    per_layer_bwd = {li: 0.0 for li in layers_in_order}
    for li in layers_in_order:
        per_layer_bwd[li] = statistics.median(_backward_share(s, li, layers_in_order, owner)
                                              for s in samples)
    layers = []
    for li in layers_in_order:
        lname, module = leaves[li]
        tensors = tuple(Tensor(param_name[id(p)], tuple(p.shape) or (1,), p.element_size())
                        for p in module.parameters(recurse=False)
                        if p.requires_grad and owner.get(id(p)) == li)
        layers.append(Layer(lname, per_layer_fwd[li] * scale, per_layer_bwd[li], tensors))
    update_s = statistics.median(s["update"] for s in samples)
    return Workload(name, batch_size or 1, tuple(layers), update_s)


def _backward_share(sample: dict[str, Any], li: int, forward_order: Sequence[int],
                    owner: dict[int, int]) -> float:
    """Layer ``li``'s backward time in one sample: from the previous gradient-owning layer's
    last gradient (backward order) to its own last one; the first layer also gets the tail
    up to the end of backward."""
    ready_of: dict[int, float] = {}
    for pid, t in sample["ready"].items():
        layer = owner.get(pid)
        if layer is not None:
            ready_of[layer] = max(ready_of.get(layer, 0.0), t)
    if li not in ready_of:
        return 0.0
    backward = [x for x in reversed(forward_order) if x in ready_of]
    pos = backward.index(li)
    previous = sample["backward_start"] if pos == 0 else ready_of[backward[pos - 1]]
    share = max(ready_of[li] - previous, 0.0)
    if pos == len(backward) - 1:
        share += max(sample["backward_end"] - ready_of[li], 0.0)
    return share
