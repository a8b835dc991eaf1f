"""FedProx (Li et al. 2020): FedAvg whose clients add mu/2 ||w - w_global||^2 to their loss,
which keeps heterogeneous clients from drifting far from the global model."""
from __future__ import annotations

from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import GradientCorrection
from dlcomm.fl.strategies.base import Strategy


class FedProx(Strategy):
    """FedAvg's aggregate; each client's gradient gains mu * (w - w_global)."""

    name = "fedprox"

    def __init__(self, mu: float = 0.01, server_lr: float = 1.0, weighted: bool = True) -> None:
        super().__init__(server_lr, weighted)
        if not isinstance(mu, (int, float)) or mu < 0:
            raise ValueError(f"FedProx mu must be a number >= 0, got {mu!r}")
        self.mu = float(mu)

    def correction(self, weights: NamedArrays, payload: NamedArrays,
                   client_state: NamedArrays | None) -> GradientCorrection | None:
        return GradientCorrection(prox_mu=self.mu, anchor=weights) if self.mu else None

    def describe(self) -> str:
        return f"fedprox:mu={self.mu:g}"
