"""The server strategy interface: how client results become one new global model.

Parrot's decomposition: every strategy's aggregate is a function of *sums* over the round's
clients, so each rank adds up its own clients' contributions and one all-reduce of the sums
finishes the round. A strategy says which sums it needs (``contribution_layout``), what one
client contributes (``contribution``) and how the sums update the server (``aggregate``).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import ClientResult, GradientCorrection

WEIGHT = "weight"  # the sum of the clients' aggregation weights (sample counts)


def delta_key(name: str) -> str:
    return f"delta/{name}"


class Strategy:
    """Server side and client side of a federated optimisation algorithm (FedAvg here;
    subclasses override what differs). Arrays in and out are float64."""

    name = "fedavg"
    stateful_clients = False  # True: keeps per-client state between rounds (the store)

    def __init__(self, server_lr: float = 1.0, weighted: bool = True) -> None:
        if not isinstance(server_lr, (int, float)) or not server_lr > 0:
            raise ValueError(f"server_lr must be a number > 0, got {server_lr!r}")
        self.server_lr = float(server_lr)
        self.weighted = bool(weighted)
        self.num_clients = 0

    # --- server ------------------------------------------------------------------------
    def setup(self, weights: NamedArrays, num_clients: int) -> None:
        """Create the server state for a model like ``weights`` and ``num_clients`` clients."""
        self.num_clients = int(num_clients)

    def payload(self) -> NamedArrays:
        """Arrays besides the weights that every round's clients receive (default none)."""
        return {}

    def contribution_layout(self, weights: NamedArrays) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every sum this strategy aggregates (the same on every rank)."""
        layout = {delta_key(n): a.shape for n, a in weights.items()}
        layout[WEIGHT] = (1,)
        return layout

    def aggregate(self, weights: NamedArrays, sums: Mapping[str, np.ndarray]) -> NamedArrays:
        """New global weights from the old and the round's sums (no clients: unchanged)."""
        total = float(sums[WEIGHT][0])
        if total <= 0:
            return dict(weights)
        return {n: w + self.server_lr * sums[delta_key(n)] / total for n, w in weights.items()}

    # --- client ------------------------------------------------------------------------
    def correction(self, weights: NamedArrays, payload: NamedArrays,
                   client_state: NamedArrays | None) -> GradientCorrection | None:
        """The term the client's local training adds to its gradients (default none)."""
        return None

    def client_weight(self, result: ClientResult) -> float:
        """A client's aggregation weight: its sample count, or 1 when not ``weighted``."""
        return float(result.num_samples) if self.weighted else 1.0

    def contribution(self, weights: NamedArrays, payload: NamedArrays, delta: NamedArrays,
                     result: ClientResult, client_state: NamedArrays | None,
                     ) -> tuple[dict[str, np.ndarray], NamedArrays | None]:
        """One client's addends to the round's sums, and its new state (None: stateless)."""
        p = self.client_weight(result)
        out = {delta_key(n): p * d for n, d in delta.items()}
        out[WEIGHT] = np.array([p])
        return out, None

    def describe(self) -> str:
        return self.name
