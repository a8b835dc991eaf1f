"""What a user's client update receives and returns.

A client update is ``fn(client_id, weights, ctx) -> ClientResult``: it trains on one client's
data starting from the global ``weights`` and reports the new weights (or the change) and how
many samples it used. ``ctx`` carries the round, the client's seed, the strategy's gradient
correction and the client's own saved state. The same function runs in the single-process
reference, in the simulation (many clients one after another on a rank) and in a deployment.
"""
from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping

import numpy as np

from dlcomm.fl.arrays import NamedArrays, check_named_arrays, check_same_layout


@dataclasses.dataclass(frozen=True)
class GradientCorrection:
    """A term a strategy adds to every gradient of a client's local training:
    ``grad[name] += constant[name] + prox_mu * (weight[name] - anchor[name])``.
    FedProx sets the proximal part, SCAFFOLD the constant (c - c_i)."""

    constant: Mapping[str, np.ndarray] | None = None
    prox_mu: float = 0.0
    anchor: Mapping[str, np.ndarray] | None = None

    def term(self, name: str, weight: np.ndarray) -> np.ndarray | None:
        """The addition to ``name``'s gradient at the current ``weight``, or None."""
        out = None
        if self.constant is not None and name in self.constant:
            out = np.asarray(self.constant[name], dtype=weight.dtype)
        if self.prox_mu and self.anchor is not None and name in self.anchor:
            prox = self.prox_mu * (weight - self.anchor[name].astype(weight.dtype))
            out = prox if out is None else out + prox
        return out

    def apply(self, weights: Mapping[str, np.ndarray], grads: Mapping[str, np.ndarray]) -> None:
        """Add the correction to ``grads`` in place (for clients written in numpy)."""
        for name, g in grads.items():
            t = self.term(name, weights[name])
            if t is not None:
                g += t


@dataclasses.dataclass
class ClientContext:
    """Everything a client update needs besides its id and the global weights."""

    client_id: int
    round_index: int
    seed: int  # derived from (run seed, round, client): the same wherever the client runs
    correction: GradientCorrection | None = None
    state: NamedArrays = dataclasses.field(default_factory=dict)  # the user's saved state


@dataclasses.dataclass
class ClientResult:
    """A client update's answer: ``weights`` (new) or ``delta`` (new minus global), the
    number of samples it trained on, and optionally the local steps it took (FedNova and
    SCAFFOLD need them), metrics, and state to get back in ``ctx.state`` next time."""

    num_samples: int
    weights: Mapping[str, np.ndarray] | None = None
    delta: Mapping[str, np.ndarray] | None = None
    num_steps: int | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    state: Mapping[str, np.ndarray] | None = None


ClientUpdate = Callable[[int, NamedArrays, ClientContext], ClientResult]


def result_delta(result: object, global_weights: NamedArrays, client_id: int) -> NamedArrays:
    """Validate a client update's answer and return its change as float64 arrays."""
    who = f"client {client_id}'s update"
    if not isinstance(result, ClientResult):
        raise TypeError(f"{who} must return a dlcomm.fl.ClientResult, got "
                        f"{type(result).__name__}")
    n = result.num_samples
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"{who}: num_samples must be an int >= 0, got {n!r}")
    s = result.num_steps
    if s is not None and (isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0):
        raise ValueError(f"{who}: num_steps must be None or an int >= 0, got {s!r}")
    if (result.weights is None) == (result.delta is None):
        raise ValueError(f"{who} must give exactly one of weights= and delta=")
    given = check_named_arrays(result.weights if result.delta is None else result.delta,
                               f"{who}'s {'weights' if result.delta is None else 'delta'}")
    check_same_layout(given, global_weights, f"{who}'s arrays")
    if result.delta is not None:
        return {n_: given[n_].astype(np.float64) for n_ in global_weights}
    return {n_: given[n_].astype(np.float64) - global_weights[n_] for n_ in global_weights}
