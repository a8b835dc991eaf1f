"""FedNova (Wang et al. 2020): clients that take different numbers of local steps would pull
FedAvg towards the busiest; FedNova averages each client's change per unit of local work and
scales the average by the mean work.

    a_i = sum_{k=1..tau_i} (1 - rho^k) / (1 - rho)      (= tau_i for plain SGD, rho = 0)
    w <- w + (sum_i p_i a_i) * sum_i p_i (w_i - w) / a_i,   p_i = n_i / sum_j n_j
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import ClientResult
from dlcomm.fl.strategies.base import WEIGHT, Strategy, delta_key

WORK = "work"  # sum_i n_i a_i


def local_work(steps: int, momentum: float) -> float:
    """a_i's L1 norm: the weight FedNova gives the local steps of SGD with ``momentum``."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


class FedNova(Strategy):
    """Normalised averaging; clients must report ``num_steps``. ``momentum``: the clients'
    SGD momentum (0 for plain SGD)."""

    name = "fednova"

    def __init__(self, momentum: float = 0.0, server_lr: float = 1.0,
                 weighted: bool = True) -> None:
        super().__init__(server_lr, weighted)
        if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"FedNova momentum must lie in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)

    def contribution_layout(self, weights: NamedArrays) -> dict[str, tuple[int, ...]]:
        layout = super().contribution_layout(weights)
        layout[WORK] = (1,)
        return layout

    def contribution(self, weights: NamedArrays, payload: NamedArrays, delta: NamedArrays,
                     result: ClientResult, client_state: NamedArrays | None,
                     ) -> tuple[dict[str, np.ndarray], NamedArrays | None]:
        if not result.num_steps:
            raise ValueError("FedNova needs each client's local steps: return "
                             "ClientResult(num_steps=...) >= 1 (the torch front end counts "
                             "optimizer steps itself)")
        p = self.client_weight(result)
        a = local_work(int(result.num_steps), self.momentum)
        out = {delta_key(n): (p / a) * d for n, d in delta.items()}
        out[WEIGHT] = np.array([p])
        out[WORK] = np.array([p * a])
        return out, None

    def aggregate(self, weights: NamedArrays, sums: Mapping[str, np.ndarray]) -> NamedArrays:
        total = float(sums[WEIGHT][0])
        if total <= 0:
            return dict(weights)
        tau_eff = float(sums[WORK][0]) / total
        return {n: w + self.server_lr * tau_eff * sums[delta_key(n)] / total
                for n, w in weights.items()}

    def describe(self) -> str:
        return f"fednova:momentum={self.momentum:g}"
