"""Deployment: the same client update and strategy with one rank per real client.

Rank 0 is the server; rank ``i + 1`` is client ``i`` (so the job has ``num_clients + 1``
ranks). Each round the server broadcasts the global model and the strategy's payload, the
sampled clients train on their own data, one all-reduce sums their contributions (the server
and unsampled clients add zeros), and the server applies the strategy. Client state stays on
the client's own rank. Moving from ``Simulation`` to ``Deployment`` changes no user code.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

import dlcomm
from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import ClientUpdate
from dlcomm.fl.client_step import HAS_STATE, SECONDS, add_into
from dlcomm.fl.report import RoundReport
from dlcomm.fl.runner import Runner
from dlcomm.fl.strategies import Strategy
from dlcomm.fl.trace import ClientTrace

SERVER_RANK = 0


class Deployment(Runner):
    """A federated run with a server rank and one rank per client (collective)."""

    def __init__(self, client_update: ClientUpdate, initial_weights: Mapping[str, np.ndarray],
                 num_clients: int, clients_per_round: int, strategy: str | Strategy = "fedavg",
                 *, client_sizes: Sequence[float] | None = None, seed: int = 0,
                 trace: ClientTrace | None = None, metric_names: Sequence[str] = (),
                 fl_state_memory_budget: int | str | None = None,
                 fl_state_dir: str | None = None) -> None:
        if dlcomm.is_initialized() and isinstance(num_clients, int) and \
                dlcomm.size() != num_clients + 1:  # the same verdict on every rank
            raise ValueError(f"a deployment needs one rank per client plus the server: "
                             f"{num_clients + 1} ranks for {num_clients} clients, this job "
                             f"has {dlcomm.size()} (dlcommrun -np {num_clients + 1})")
        super().__init__(client_update, initial_weights, num_clients, clients_per_round,
                         strategy, client_sizes=client_sizes, seed=seed, trace=trace,
                         metric_names=metric_names,
                         fl_state_memory_budget=fl_state_memory_budget,
                         fl_state_dir=fl_state_dir)
        self.client_id = self.rank - 1  # -1 on the server

    @property
    def is_server(self) -> bool:
        return self.rank == SERVER_RANK

    def _broadcast_global(self) -> NamedArrays:
        """The server's weights and payload, packed into one broadcast; returns the payload."""
        payload = self.strategy.payload()
        parts = list(self.weights64.items()) + list(payload.items())
        flat = np.concatenate([a.ravel() for _, a in parts]) if parts else np.zeros(0)
        flat = dlcomm.broadcast(flat, root_rank=SERVER_RANK, name="fl.global")
        out: dict[str, np.ndarray] = {}
        offset = 0
        for name, a in parts:
            out[name] = flat[offset:offset + a.size].reshape(a.shape)
            offset += a.size
        self.weights64 = {n: out[n] for n in self.weights64}
        return {n: out[n] for n in payload}

    def run_round(self) -> RoundReport:
        """One round on every rank (collective)."""
        start = time.perf_counter()
        clients = self.sample(self.round_index)
        payload = self._broadcast_global()
        sums = self.zero_sums()
        records = np.zeros((clients.size, self._columns))
        position = np.flatnonzero(clients == self.client_id)
        if position.size:
            out = self.train(self.client_id, self.client_weights(), payload)
            add_into(sums, out.contribution)
            records[position[0]] = out.record
        sums, records = self.allreduce_sums(sums, records, (clients,))
        self.last_round[clients] = self.round_index
        self.has_state[clients] = records[:, HAS_STATE] > 0
        if self.is_server:
            self.weights64 = self.strategy.aggregate(self.weights64, sums)
        busy = np.zeros(self.size)
        busy[clients + 1] = records[:, SECONDS]
        top = float(records[:, SECONDS].max()) if clients.size else 0.0
        rep = self.report(clients, records, time.perf_counter() - start, busy, top, top)
        self.round_index += 1
        return rep

    def run(self, rounds: int, on_round=None) -> list[RoundReport]:  # noqa: ANN001
        """As ``Runner.run``; afterwards every rank holds the server's final weights."""
        reports = super().run(rounds, on_round)
        self._broadcast_global()
        return reports
