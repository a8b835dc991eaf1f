"""SCAFFOLD (Karimireddy et al. 2020, option II): control variates correct client drift.
The server keeps c, each client its own c_i (stateful clients: the state store keeps them).
A client's gradient gains c - c_i; after K local steps at learning rate lr,

    c_i+ = c_i - c + (w - w_i) / (K lr)
    w  <- w + server_lr * sum_i n_i (w_i - w) / sum_i n_i
    c  <- c + sum_i (c_i+ - c_i) / N                        (N: all clients)
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import ClientResult, GradientCorrection
from dlcomm.fl.strategies.base import WEIGHT, Strategy, delta_key


def control_key(name: str) -> str:
    return f"control/{name}"


class Scaffold(Strategy):
    """SCAFFOLD with plain local SGD at ``client_lr`` (the clients' learning rate)."""

    name = "scaffold"
    stateful_clients = True

    def __init__(self, client_lr: float, server_lr: float = 1.0, weighted: bool = True) -> None:
        super().__init__(server_lr, weighted)
        if not isinstance(client_lr, (int, float)) or not client_lr > 0:
            raise ValueError(f"SCAFFOLD client_lr must be the clients' learning rate (> 0), "
                             f"got {client_lr!r}")
        self.client_lr = float(client_lr)
        self.c: NamedArrays = {}

    def setup(self, weights: NamedArrays, num_clients: int) -> None:
        super().setup(weights, num_clients)
        self.c = {n: np.zeros(a.shape) for n, a in weights.items()}

    def payload(self) -> NamedArrays:
        return {control_key(n): c for n, c in self.c.items()}

    def contribution_layout(self, weights: NamedArrays) -> dict[str, tuple[int, ...]]:
        layout = super().contribution_layout(weights)
        layout.update({control_key(n): a.shape for n, a in weights.items()})
        return layout

    def correction(self, weights: NamedArrays, payload: NamedArrays,
                   client_state: NamedArrays | None) -> GradientCorrection | None:
        constant = {}
        for n in weights:
            c = payload[control_key(n)]
            constant[n] = c - client_state[n] if client_state else c.copy()
        return GradientCorrection(constant=constant)

    def contribution(self, weights: NamedArrays, payload: NamedArrays, delta: NamedArrays,
                     result: ClientResult, client_state: NamedArrays | None,
                     ) -> tuple[dict[str, np.ndarray], NamedArrays | None]:
        if not result.num_steps:
            raise ValueError("SCAFFOLD needs each client's local steps: return "
                             "ClientResult(num_steps=...) >= 1 (the torch front end counts "
                             "optimizer steps itself)")
        p = self.client_weight(result)
        scale = 1.0 / (int(result.num_steps) * self.client_lr)
        out: dict[str, np.ndarray] = {delta_key(n): p * d for n, d in delta.items()}
        out[WEIGHT] = np.array([p])
        new_state = {}
        for n, d in delta.items():
            old = client_state[n] if client_state else np.zeros(d.shape)
            new = old - payload[control_key(n)] - scale * d
            out[control_key(n)] = new - old
            new_state[n] = new
        return out, new_state

    def aggregate(self, weights: NamedArrays, sums: Mapping[str, np.ndarray]) -> NamedArrays:
        new = super().aggregate(weights, sums)
        if float(sums[WEIGHT][0]) > 0:
            for n in self.c:
                self.c[n] = self.c[n] + sums[control_key(n)] / self.num_clients
        return new

    def describe(self) -> str:
        return f"scaffold:client_lr={self.client_lr:g}"
