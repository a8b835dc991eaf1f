"""Cutting a ``torch.nn.Module`` in two at a named sub-module, and the links that cross.

``cut_module(model, split_point)`` traces the model with ``torch.fx`` (the split point and
``leaf_modules`` are not traced into) and puts the split point and everything it depends on
on the edge; the rest runs on the cloud. What the cloud needs from the edge crosses the
split:

* the split point's output: the one activation that should cross;
* inputs of the model the cloud uses (e.g. an attention mask for its attention layers and
  pooling): sent losslessly as *side inputs*; values the edge derived from inputs alone,
  without parameters (the additive attention bias made from the mask), are recomputed on the
  cloud from those inputs instead of being sent (the attention connection is rerouted);
* any other edge activation the cloud uses: a *link*, typically a residual connection that
  jumps over the split point. ``links`` decides: ``keep`` sends it too (two activations cross),
  ``reroute`` moves the parameter-free operations that join it to the split point's output
  (the residual addition) to the edge, so one tensor crosses and nothing changes numerically,
  ``eliminate`` drops the residual addition on the cloud side (the cloud's input is the
  split point's output alone: a different model, fine-tuned from the same weights).

The two halves are ``torch.fx.GraphModule``s sharing the model's parameters; a parameter used
on both sides (tied weights) cannot be split and is refused.
"""
from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx

LINK_POLICIES = ("keep", "reroute", "eliminate")
ACTIVATION, SIDE = "activation", "side"
_RESIDUAL_ADDS = {operator.add, operator.iadd, torch.add}


@dataclasses.dataclass(frozen=True)
class Cut:
    """A model cut in two: ``edge(*inputs)`` returns the values that cross, in the order
    ``cloud(*values)`` takes them; ``kinds[i]`` says whether value i is an activation (its
    codec applies, its gradient comes back) or a side input (sent losslessly)."""

    edge: torch.nn.Module
    cloud: torch.nn.Module
    kinds: tuple[str, ...] | None  # None: by dtype on the first call (parts given by the user)
    names: tuple[str, ...] = ()
    eliminated: tuple[str, ...] = ()
    rerouted: tuple[str, ...] = ()
    side_outputs: tuple[int, ...] | None = None  # given parts: outputs sent losslessly

    def describe(self) -> dict[str, Any]:
        """What crosses, as plain values (compared across ranks, shown in reports)."""
        crossing = ["given parts"] if self.kinds is None else \
            [f"{n}:{k}" for n, k in zip(self.names, self.kinds)]
        return {"crossing": crossing, "eliminated": list(self.eliminated),
                "rerouted": list(self.rerouted)}


class _CutTracer(fx.Tracer):
    """fx's tracer that also keeps ``leaves`` (module paths or types) whole."""

    def __init__(self, leaf_paths: set[str], leaf_types: tuple[type, ...]) -> None:
        super().__init__()
        self.leaf_paths = leaf_paths
        self.leaf_types = leaf_types

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return (qualname in self.leaf_paths or isinstance(m, self.leaf_types)
                or super().is_leaf_module(m, qualname))


def _inputs(node: fx.Node) -> list[fx.Node]:
    return list(node.all_input_nodes)


def _ancestors(roots: Iterable[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(_inputs(n))
    return seen


def _is_parameter(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op != "get_attr":
        return False
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return isinstance(value, torch.nn.Parameter)


def _input_derived(gm: fx.GraphModule, graph: fx.Graph) -> set[fx.Node]:
    """Nodes computed from the model's inputs and constants alone (no module, no parameter):
    the cloud can recompute them from the inputs."""
    derived: set[fx.Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder" or (n.op == "get_attr" and not _is_parameter(gm, n)):
            derived.add(n)
        elif n.op in ("call_function", "call_method") and all(i in derived for i in _inputs(n)):
            derived.add(n)
    return derived


def _is_residual_add(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target in _RESIDUAL_ADDS
            or node.op == "call_method" and node.target in ("add", "add_")) and \
        len(node.args) == 2 and not node.kwargs


def trace(model: torch.nn.Module, split_point: str,
          leaf_modules: Sequence[str | type] = ()) -> fx.GraphModule:
    """``model`` traced with ``split_point`` and ``leaf_modules`` kept whole."""
    names = dict(model.named_modules())
    if split_point not in names or split_point == "":
        raise ValueError(f"split_point {split_point!r} is not a sub-module of the model; "
                         f"sub-modules: {[n for n in names if n][:40]}")
    paths = {split_point} | {m for m in leaf_modules if isinstance(m, str)}
    types = tuple(m for m in leaf_modules if isinstance(m, type))
    bad = [m for m in leaf_modules if not isinstance(m, (str, type))]
    if bad:
        raise TypeError(f"leaf_modules holds module paths (str) or module classes, got {bad!r}")
    try:
        graph = _CutTracer(paths, types).trace(model)
    except Exception as exc:  # fx's errors name the untraceable construct
        raise ValueError(f"torch.fx cannot trace the model ({exc}); name the untraceable "
                         "sub-modules in leaf_modules, or give the two parts yourself "
                         "(parts=(edge, cloud))") from exc
    return fx.GraphModule(model, graph)


def cut_module(model: torch.nn.Module, split_point: str, links: str = "keep",
               leaf_modules: Sequence[str | type] = ()) -> Cut:
    """Cut ``model`` after sub-module ``split_point`` (see the module docstring)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if links not in LINK_POLICIES:
        raise ValueError(f"split_links must be one of {list(LINK_POLICIES)}, got {links!r}")
    gm = trace(model, split_point, leaf_modules)
    graph = gm.graph
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target == split_point]
    if len(calls) != 1:
        raise ValueError(f"split_point {split_point!r} is called {len(calls)} times in the "
                         "model's forward; it must be called exactly once")
    split = calls[0]
    order = {n: i for i, n in enumerate(graph.nodes)}
    derived = _input_derived(gm, graph)
    output = next(n for n in graph.nodes if n.op == "output")
    pulled: list[fx.Node] = []
    bypass: dict[fx.Node, fx.Node] = {}
    while True:
        edge = _with_items(graph, _ancestors([split, *pulled]))
        crossing, needed = _walk(output, edge, derived, bypass)
        links_now = sorted((v for v in crossing if v.op != "placeholder" and v is not split),
                           key=order.__getitem__)
        crossing_activations = sum(1 for v in crossing if v.op != "placeholder")
        if links == "keep" or crossing_activations <= 1:
            break
        if links == "eliminate":
            _eliminate(links_now, needed, edge, bypass)
        elif not _reroute_step(gm, crossing, needed, edge, derived, order, pulled):
            raise ValueError(
                f"split_links='reroute' cannot bring {[v.name for v in links_now]} over the "
                f"split point {split_point!r} (they join the rest of the model through "
                "operations with parameters); use 'keep' or 'eliminate'")
    activations = [v for v in crossing if v.op != "placeholder"]
    if not activations:
        raise ValueError(f"nothing the edge computes crosses the split at {split_point!r}: "
                         "the cloud part does not use the split point's output")
    main = split if split in activations else activations[0]
    activations.sort(key=lambda v: (v is not main, order[v]))
    sides = sorted((v for v in crossing if v.op == "placeholder"), key=order.__getitem__)
    values = activations + sides
    edge_gm = _edge_module(gm, edge, values)
    cloud_gm = _cloud_module(gm, graph, needed, values, bypass)
    check_no_shared_parameters(edge_gm, cloud_gm)
    return Cut(edge_gm, cloud_gm,
               tuple([ACTIVATION] * len(activations) + [SIDE] * len(sides)),
               tuple(v.name for v in values),
               eliminated=tuple(f"{_dropped(n, bypass).name} (residual into {n.name})"
                                for n in bypass),
               rerouted=tuple(n.name for n in pulled))


def _with_items(graph: fx.Graph, edge: set[fx.Node]) -> set[fx.Node]:
    """``edge`` and the items taken out of its tuple outputs (``out[0]`` of a module that
    returns a tuple, as attention modules do): the tensor crosses, not the tuple."""
    for n in graph.nodes:
        if n.op == "call_function" and n.target is operator.getitem and n.args[0] in edge:
            edge.add(n)
    return edge


def _resolve(node: fx.Node, bypass: dict[fx.Node, fx.Node]) -> fx.Node:
    while node in bypass:
        node = bypass[node]
    return node


def _dropped(node: fx.Node, bypass: dict[fx.Node, fx.Node]) -> fx.Node:
    """The operand residual addition ``node`` no longer adds."""
    a, b = node.args
    return a if b is bypass[node] else b


def _walk(output: fx.Node, edge: set[fx.Node], derived: set[fx.Node],
          bypass: dict[fx.Node, fx.Node]) -> tuple[set[fx.Node], set[fx.Node]]:
    """(values that cross, nodes the cloud runs), walking back from the model's output:
    an edge value crosses, an input crosses (a side input), a value derived from inputs
    alone is recomputed on the cloud from them."""
    crossing: set[fx.Node] = set()
    needed: set[fx.Node] = set()
    stack = [output]
    while stack:
        v = _resolve(stack.pop(), bypass)
        if v in needed or v in crossing:
            continue
        if v.op == "placeholder" or (v in edge and v not in derived and v.op != "get_attr"):
            crossing.add(v)
            continue
        needed.add(v)
        stack.extend(_inputs(v))
    return crossing, needed


def _eliminate(links_now: list[fx.Node], needed: set[fx.Node], edge: set[fx.Node],
               bypass: dict[fx.Node, fx.Node]) -> None:
    """Drop the residual additions on the cloud side that add one of ``links_now``."""
    changed = False
    for n in needed:
        if n in edge:
            continue
        for link in links_now:
            if not any(_resolve(i, bypass) is link for i in _inputs(n)):
                continue
            if not _is_residual_add(n) or n in bypass:
                raise ValueError(f"split_links='eliminate' can drop residual additions only; "
                                 f"{link.name} also feeds {n.name} ({n.op} {n.target}); use "
                                 "'keep' or 'reroute'")
            a, b = (_resolve(x, bypass) if isinstance(x, fx.Node) else x for x in n.args)
            other = b if a is link else a
            if not isinstance(other, fx.Node):
                raise ValueError(f"split_links='eliminate': {n.name} adds {link.name} to a "
                                 "constant; nothing would be left to add")
            bypass[n] = other
            changed = True
    if not changed:
        raise ValueError(f"split_links='eliminate' cannot remove {[v.name for v in links_now]}"
                         "; use 'keep' or 'reroute'")


def _movable(gm: fx.GraphModule, node: fx.Node) -> bool:
    """True for an operation without parameters (a function, a method, or a module that
    holds no parameter, such as dropout or an activation)."""
    if node.op in ("call_function", "call_method"):
        return True
    return node.op == "call_module" and not any(
        True for _ in gm.get_submodule(str(node.target)).parameters())


def _reroute_step(gm: fx.GraphModule, crossing: set[fx.Node], needed: set[fx.Node],
                  edge: set[fx.Node], derived: set[fx.Node], order: dict[fx.Node, int],
                  pulled: list[fx.Node]) -> bool:
    """Move to the edge the first (in the model's order) parameter-free cloud operation that
    uses a crossing activation and needs nothing the edge lacks; True if one moved."""
    activations = {v for v in crossing if v.op != "placeholder"}
    for n in sorted(needed - edge, key=order.__getitem__):
        ins = _inputs(n)
        if not _movable(gm, n) or not any(i in activations for i in ins):
            continue
        if all(i in edge or i in derived or (i.op == "get_attr" and not _is_parameter(gm, i))
               for i in ins):
            pulled.append(n)
            return True
    return False


def _edge_module(gm: fx.GraphModule, edge: set[fx.Node], values: list[fx.Node]
                 ) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    needed = _ancestors(values)
    for n in gm.graph.nodes:
        if n.op == "placeholder" or (n in needed and (n in edge or n.op == "get_attr")):
            env[n] = g.node_copy(n, env.__getitem__)
    g.output(tuple(env[v] for v in values))
    g.lint()
    return fx.GraphModule(gm, g, class_name="EdgePart")


def _cloud_module(gm: fx.GraphModule, graph: fx.Graph, needed: set[fx.Node],
                  values: list[fx.Node], bypass: dict[fx.Node, fx.Node]) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {v: g.placeholder(v.name) for v in values}
    for n in graph.nodes:
        if n in needed and n not in env:
            env[n] = g.node_copy(n, lambda i: env[_resolve(i, bypass)])
    g.lint()
    return fx.GraphModule(gm, g, class_name="CloudPart")


def check_no_shared_parameters(edge: torch.nn.Module, cloud: torch.nn.Module) -> None:
    """Refuse parts that share a parameter (tied weights cannot live on two ranks)."""
    edge_ids = {id(p): n for n, p in edge.named_parameters()}
    shared = [n for n, p in cloud.named_parameters() if id(p) in edge_ids]
    if shared:
        raise ValueError(f"parameters {shared} are used on both sides of the split (tied "
                         "weights); they cannot be split: move the split point or untie them")


class _Tupled(torch.nn.Module):
    """A user's edge part whose output is always a tuple of tensors."""

    def __init__(self, part: torch.nn.Module) -> None:
        super().__init__()
        self.part = part

    def forward(self, *inputs: Any) -> tuple[torch.Tensor, ...]:
        out = self.part(*inputs)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if not all(isinstance(t, torch.Tensor) for t in out):
            raise TypeError("the edge part must return a tensor or a tuple of tensors")
        return out


def parts_cut(edge: torch.nn.Module, cloud: torch.nn.Module,
              side_outputs: Sequence[int] | None = None) -> Cut:
    """A ``Cut`` from two given parts: ``edge(*inputs)`` returns a tensor or a tuple of them,
    ``cloud`` takes them in the same order. Outputs whose positions ``side_outputs`` lists
    (default: those that are not floating point) are sent losslessly, without gradient."""
    for what, m in (("edge", edge), ("cloud", cloud)):
        if not isinstance(m, torch.nn.Module):
            raise TypeError(f"parts must be two torch.nn.Module, the {what} part is "
                            f"{type(m).__name__}")
    check_no_shared_parameters(edge, cloud)
    sides = None
    if side_outputs is not None:
        sides = tuple(side_outputs)
        if not all(isinstance(i, int) and i >= 0 for i in sides):
            raise ValueError(f"side_outputs lists output positions (ints >= 0), got {sides!r}")
    return Cut(_Tupled(edge), cloud, kinds=None, side_outputs=sides)
