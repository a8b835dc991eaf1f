"""FedOpt (Reddi et al. 2021, "Adaptive Federated Optimization"): the weighted average change
of the clients is a pseudo-gradient that a server optimizer (Adam, Yogi or Adagrad) applies.

    delta = sum_i n_i (w_i - w) / sum_i n_i
    m = beta1 m + (1 - beta1) delta
    v = v + delta^2                                   (adagrad)
    v = beta2 v + (1 - beta2) delta^2                 (adam)
    v = v - (1 - beta2) delta^2 sign(v - delta^2)     (yogi)
    w = w + eta m / (sqrt(v) + tau)

as in the paper's Algorithm 2 (no bias correction; m starts at 0 and v at tau^2).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.strategies.base import WEIGHT, Strategy, delta_key

SERVER_OPTIMIZERS = ("adam", "yogi", "adagrad")


class FedOpt(Strategy):
    """FedAvg's sums, then a server Adam, Yogi or Adagrad step on the averaged change."""

    name = "fedopt"

    def __init__(self, optimizer: str = "adam", eta: float = 0.01, beta1: float = 0.9,
                 beta2: float = 0.99, tau: float = 1e-3, weighted: bool = True) -> None:
        super().__init__(1.0, weighted)
        if optimizer not in SERVER_OPTIMIZERS:
            raise ValueError(f"FedOpt optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}, "
                             f"got {optimizer!r}")
        for value, what in ((eta, "eta"), (tau, "tau")):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"FedOpt {what} must be a number > 0, got {value!r}")
        for value, what in ((beta1, "beta1"), (beta2, "beta2")):
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"FedOpt {what} must lie in [0, 1), got {value!r}")
        self.optimizer, self.eta, self.tau = optimizer, float(eta), float(tau)
        self.beta1, self.beta2 = float(beta1), float(beta2)
        self.m: NamedArrays = {}
        self.v: NamedArrays = {}

    def setup(self, weights: NamedArrays, num_clients: int) -> None:
        super().setup(weights, num_clients)
        self.m = {n: np.zeros(a.shape) for n, a in weights.items()}
        self.v = {n: np.full(a.shape, self.tau ** 2) for n, a in weights.items()}

    def aggregate(self, weights: NamedArrays, sums: Mapping[str, np.ndarray]) -> NamedArrays:
        total = float(sums[WEIGHT][0])
        if total <= 0:
            return dict(weights)
        out = {}
        for n, w in weights.items():
            d = sums[delta_key(n)] / total
            m, v, d2 = self.m[n], self.v[n], np.square(sums[delta_key(n)] / total)
            m *= self.beta1
            m += (1 - self.beta1) * d
            if self.optimizer == "adagrad":
                v += d2
            elif self.optimizer == "adam":
                v *= self.beta2
                v += (1 - self.beta2) * d2
            else:
                v -= (1 - self.beta2) * d2 * np.sign(v - d2)
            out[n] = w + self.eta * m / (np.sqrt(v) + self.tau)
        return out

    def describe(self) -> str:
        return (f"fedopt:optimizer={self.optimizer},eta={self.eta:g},beta1={self.beta1:g},"
                f"beta2={self.beta2:g},tau={self.tau:g}")
