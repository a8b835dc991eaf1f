"""``dlcomm.torch.fl``: federated learning with a ``torch.nn.Module`` (see docs/fl.md).

The user writes ``train(model, client_id, ctx)``: local training of one client on ``model``,
which already holds the round's global weights, returning the number of samples (or
``(num_samples, metrics)``). This module turns it into the core's client update on numpy
arrays: it loads the global weights into the one model object, seeds torch with the client's
seed, applies the strategy's gradient correction (FedProx, SCAFFOLD) through gradient hooks and
counts optimizer steps, so the user's loop needs none of that.
"""
from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from dlcomm import fl as core
from dlcomm.fl import ClientContext, ClientResult, NamedArrays

TrainFn = Callable[[torch.nn.Module, int, ClientContext], Any]


def module_weights(model: torch.nn.Module) -> NamedArrays:
    """The module's floating-point state (parameters and buffers such as batch-norm
    statistics) as numpy copies keyed by ``state_dict`` name; integer buffers stay local."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return {n: t.detach().cpu().numpy().copy() for n, t in model.state_dict().items()
            if t.is_floating_point()}


def load_weights(model: torch.nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Copy ``weights`` into the module's tensors of the same names, in place."""
    state = model.state_dict()
    with torch.no_grad(), warnings.catch_warnings():
        # the runner hands clients read-only arrays; they are only read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, value in weights.items():
            if name not in state:
                raise ValueError(f"the model has no tensor named {name!r}")
            state[name].copy_(torch.from_numpy(np.asarray(value)))


class _Corrections:
    """Gradient hooks on a module's parameters that add the current client's correction."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = dict(model.named_parameters())
        self.constant: dict[str, torch.Tensor] = {}
        self.anchor: dict[str, torch.Tensor] = {}
        self.mu = 0.0
        for name, p in self.params.items():
            if p.requires_grad:
                p.register_hook(self._hook(name, p))

    def _hook(self, name: str, p: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        def add(grad: torch.Tensor) -> torch.Tensor:
            c = self.constant.get(name)
            if c is not None:
                grad = grad + c
            a = self.anchor.get(name)
            if a is not None:
                grad = grad + self.mu * (p.detach() - a)
            return grad

        return add

    def set(self, correction: core.GradientCorrection | None) -> None:
        self.constant, self.anchor, self.mu = {}, {}, 0.0
        if correction is None:
            return
        for name, p in self.params.items():
            if correction.constant is not None and name in correction.constant:
                self.constant[name] = torch.as_tensor(correction.constant[name], dtype=p.dtype)
            if correction.prox_mu and correction.anchor is not None and \
                    name in correction.anchor:
                self.anchor[name] = torch.as_tensor(correction.anchor[name], dtype=p.dtype)
        self.mu = float(correction.prox_mu)


_CORRECTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def client_update(model: torch.nn.Module, train: TrainFn) -> core.client.ClientUpdate:
    """The core client update that runs ``train(model, client_id, ctx)`` on ``model``."""
    if not callable(train):
        raise TypeError("train must be callable as train(model, client_id, ctx)")
    module_weights(model)  # validates model
    if model not in _CORRECTIONS:
        _CORRECTIONS[model] = _Corrections(model)
    corrections = _CORRECTIONS[model]

    def update(client: int, weights: NamedArrays, ctx: ClientContext) -> ClientResult:
        load_weights(model, weights)
        torch.manual_seed(ctx.seed % (1 << 63))
        corrections.set(ctx.correction)
        steps = [0]

        def count(*_: Any) -> None:
            steps[0] += 1

        handle = register_optimizer_step_post_hook(count)
        try:
            answer = train(model, client, ctx)
        finally:
            handle.remove()
            corrections.set(None)
        num_samples, metrics = answer if isinstance(answer, tuple) else (answer, {})
        return ClientResult(num_samples=num_samples, weights=module_weights(model),
                            num_steps=steps[0], metrics=dict(metrics),
                            state=dict(ctx.state) or None)

    return update


class Simulation(core.Simulation):
    """``dlcomm.fl.Simulation`` of ``train`` on ``model`` (one model object per rank)."""

    def __init__(self, model: torch.nn.Module, train: TrainFn, num_clients: int,
                 clients_per_round: int, strategy: str | core.Strategy = "fedavg",
                 **kwargs: Any) -> None:
        self.model = model
        super().__init__(client_update(model, train), module_weights(model), num_clients,
                         clients_per_round, strategy, **kwargs)

    def load_global(self) -> torch.nn.Module:
        """Load the current global weights into ``model`` (e.g. to evaluate) and return it."""
        load_weights(self.model, self.weights)
        return self.model


class Deployment(core.Deployment):
    """``dlcomm.fl.Deployment`` of ``train`` on ``model``: rank 0 serves, rank i+1 is client i."""

    def __init__(self, model: torch.nn.Module, train: TrainFn, num_clients: int,
                 clients_per_round: int, strategy: str | core.Strategy = "fedavg",
                 **kwargs: Any) -> None:
        self.model = model
        super().__init__(client_update(model, train), module_weights(model), num_clients,
                         clients_per_round, strategy, **kwargs)

    def load_global(self) -> torch.nn.Module:
        """Load the current global weights into ``model`` and return it."""
        load_weights(self.model, self.weights)
        return self.model


def run_reference(model: torch.nn.Module, train: TrainFn, num_clients: int,
                  clients_per_round: int, rounds: int, strategy: str | core.Strategy = "fedavg",
                  *, seed: int = 0, trace: core.ClientTrace | None = None,
                  metric_names: Sequence[str] = ()) -> tuple[NamedArrays, list[dict]]:
    """The single-process reference of the same run (``dlcomm.fl.run_reference``)."""
    return core.run_reference(client_update(model, train), module_weights(model), num_clients,
                              clients_per_round, rounds, strategy, seed=seed, trace=trace,
                              metric_names=metric_names)


__all__ = ["Deployment", "Simulation", "client_update", "load_weights", "module_weights",
           "run_reference"]
