"""Parrot's simulation: many clients on few ranks.

Each round every rank derives the same sample and the same schedule (from the cost model, fed
by the previous rounds' all-reduced timings), trains its share of the clients one after
another on one model, adds up their weighted contributions locally, and joins one fused
all-reduce of the sums; then every rank applies the strategy to the same sums, so the server
needs no process of its own.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from dlcomm.fl.client import ClientUpdate
from dlcomm.fl.client_step import HAS_STATE, SECONDS, add_into
from dlcomm.fl.cost_model import CostModel
from dlcomm.fl.knobs import knob_value
from dlcomm.fl.report import RoundReport
from dlcomm.fl.runner import Runner
from dlcomm.fl.scheduler import SCHEDULERS, ideal_makespan, makespan, schedule_clients
from dlcomm.fl.strategies import Strategy
from dlcomm.fl.trace import ClientTrace


class Simulation(Runner):
    """``num_clients`` federated clients simulated on this job's ranks (collective: build
    and run it on every rank with the same arguments)."""

    def __init__(self, client_update: ClientUpdate, initial_weights: Mapping[str, np.ndarray],
                 num_clients: int, clients_per_round: int, strategy: str | Strategy = "fedavg",
                 *, client_sizes: Sequence[float] | None = None, seed: int = 0,
                 trace: ClientTrace | None = None, metric_names: Sequence[str] = (),
                 fl_scheduler: str | None = None,
                 fl_state_memory_budget: int | str | None = None,
                 fl_state_dir: str | None = None) -> None:
        scheduler = knob_value("fl_scheduler", fl_scheduler)
        if scheduler not in SCHEDULERS:
            raise ValueError(f"unknown fl_scheduler {scheduler!r}; known: "
                             f"{', '.join(SCHEDULERS)}")
        super().__init__(client_update, initial_weights, num_clients, clients_per_round,
                         strategy, client_sizes=client_sizes, seed=seed, trace=trace,
                         metric_names=metric_names,
                         fl_state_memory_budget=fl_state_memory_budget,
                         fl_state_dir=fl_state_dir)
        self.scheduler = scheduler
        self.cost_model = CostModel(self.client_sizes, self.size)
        self.owner = np.full(self.num_clients, -1, dtype=np.int64)  # rank holding its state

    def run_round(self) -> RoundReport:
        """One round on every rank (collective)."""
        start = time.perf_counter()
        clients = self.sample(self.round_index)
        work = self.cost_model.predict(clients)
        speeds = self.cost_model.rank_speed.copy()  # observe() below updates it in place
        plan = schedule_clients(work, speeds, self.scheduler)
        rank_of = np.empty(clients.size, dtype=np.int64)
        for r, positions in enumerate(plan):
            rank_of[positions] = r
        for c, r in zip(clients, rank_of):  # states moving away are written out first
            if self.has_state[c] and self.owner[c] == self.rank and r != self.rank:
                self.store.release(int(c))
        sums = self.zero_sums()
        records = np.zeros((clients.size, self._columns))
        client_weights = self.client_weights()
        payload = self.strategy.payload()
        for i in plan[self.rank]:
            out = self.train(int(clients[i]), client_weights, payload)
            add_into(sums, out.contribution)
            records[i] = out.record
        sums, records = self.allreduce_sums(sums, records, (clients, rank_of))
        self.owner[clients] = rank_of
        self.last_round[clients] = self.round_index
        self.has_state[clients] = records[:, HAS_STATE] > 0
        self.cost_model.observe(clients, rank_of, records[:, SECONDS])
        self.weights64 = self.strategy.aggregate(self.weights64, sums)
        busy = np.bincount(rank_of, weights=records[:, SECONDS], minlength=self.size)
        rep = self.report(clients, records, time.perf_counter() - start, busy,
                          makespan(plan, work, speeds), ideal_makespan(work, speeds))
        self.round_index += 1
        return rep
