"""What the simulation and the deployment share: arguments, the global model, sampling, the
client-state store, and turning a round's all-reduced sums into the next global model."""
from __future__ import annotations

import shutil
import tempfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

import dlcomm
from dlcomm.fl.arguments import check_count, check_run_arguments
from dlcomm.fl.arrays import NamedArrays, nbytes
from dlcomm.fl.client import ClientUpdate
from dlcomm.fl.client_step import (
    FIXED_COLUMNS,
    NUM_SAMPLES,
    TRAINED,
    ClientOutcome,
    run_client,
)
from dlcomm.fl.knobs import knob_value
from dlcomm.fl.report import RoundReport, peak_rss_bytes
from dlcomm.fl.sampling import sample_clients
from dlcomm.fl.state_store import ClientStateStore
from dlcomm.fl.strategies import Strategy
from dlcomm.fl.trace import ClientTrace


class Runner:
    """Shared state of a federated run on a dlcomm job (``dlcomm.init()`` first)."""

    def __init__(self, client_update: ClientUpdate, initial_weights: Mapping[str, np.ndarray],
                 num_clients: int, clients_per_round: int, strategy: str | Strategy = "fedavg",
                 *, client_sizes: Sequence[float] | None = None, seed: int = 0,
                 trace: ClientTrace | None = None, metric_names: Sequence[str] = (),
                 fl_state_memory_budget: int | str | None = None,
                 fl_state_dir: str | None = None) -> None:
        if not dlcomm.is_initialized():
            raise RuntimeError("call dlcomm.init() (or dlcomm.torch.init()) before building a "
                               "federated runner")
        (weights, self.num_clients, self.clients_per_round, self.strategy, self.client_sizes,
         self.metric_names) = check_run_arguments(
            client_update, initial_weights, num_clients, clients_per_round, strategy,
            client_sizes, seed, trace, metric_names)
        self.update = client_update
        self.seed = int(seed)
        self.trace = trace
        self._dtypes = {n: a.dtype for n, a in weights.items()}
        self.weights64: NamedArrays = {n: a.astype(np.float64) for n, a in weights.items()}
        self.model_bytes = nbytes(weights)
        self.strategy.setup(self.weights64, self.num_clients)
        self.layout = self.strategy.contribution_layout(self.weights64)
        self.rank, self.size = dlcomm.rank(), dlcomm.size()
        self.round_index = 0
        self.last_round = np.full(self.num_clients, -1, dtype=np.int64)
        self.has_state = np.zeros(self.num_clients, dtype=bool)
        budget = knob_value("fl_state_memory_budget", fl_state_memory_budget)
        parent = knob_value("fl_state_dir", fl_state_dir) or None
        # a directory of this run's own, so files a crashed earlier run left are never read
        made = None
        if self.rank == 0:
            try:
                made = tempfile.mkdtemp(prefix="dlcomm-fl-state-", dir=parent)
            except OSError as exc:
                made = OSError(f"cannot create the client-state directory in "
                               f"{parent or tempfile.gettempdir()}: {exc} (DLCOMM_FL_STATE_DIR)")
        made = dlcomm.broadcast_object(made, root_rank=0, name="fl.state_dir")
        if isinstance(made, OSError):
            raise made
        self.store = ClientStateStore(made, int(budget))
        self._columns = FIXED_COLUMNS + len(self.metric_names)

    # --- the model ------------------------------------------------------------------------
    @property
    def weights(self) -> NamedArrays:
        """The global model in its own dtypes (a copy)."""
        return {n: a.astype(self._dtypes[n]) for n, a in self.weights64.items()}

    def client_weights(self) -> NamedArrays:
        """The read-only copy of the global model every client of a round starts from."""
        out = self.weights
        for a in out.values():
            a.flags.writeable = False
        return out

    # --- a round's pieces -------------------------------------------------------------------
    def sample(self, round_index: int) -> np.ndarray:
        available = None if self.trace is None else self.trace.available(round_index)
        return sample_clients(self.num_clients, self.clients_per_round, round_index, self.seed,
                              available)

    def train(self, client: int, client_weights: NamedArrays,
              payload: NamedArrays) -> ClientOutcome:
        """Train one client of the current round and keep its new state in the store."""
        c = int(client)
        saved = self.store.get(c, int(self.last_round[c])) if self.has_state[c] else None
        out = run_client(self.update, self.strategy, c, self.round_index, self.seed,
                         self.weights64, client_weights, payload, saved, self.metric_names)
        if out.state is not None:
            self.store.put(c, out.state, self.round_index)
        return out

    def zero_sums(self) -> dict[str, np.ndarray]:
        return {k: np.zeros(shape) for k, shape in self.layout.items()}

    def allreduce_sums(self, sums: dict[str, np.ndarray], records: np.ndarray,
                       plan: tuple[np.ndarray, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The round's one all-reduce: every sum, every client's record, and each rank's
        fingerprint of the round's ``plan`` (sample, schedule), fused. Ranks whose plans
        differ get the same error on every rank."""
        keys = list(self.layout)
        fingerprints = np.zeros(self.size)
        fingerprints[self.rank] = zlib.crc32(b"".join(np.ascontiguousarray(a).tobytes()
                                                      for a in plan))
        out = dlcomm.grouped_allreduce(
            [sums[k] for k in keys] + [records.ravel(), fingerprints],
            name="fl.round", op=dlcomm.Sum)
        fingerprints = out.pop()
        differ = np.flatnonzero(fingerprints != fingerprints[0])
        if differ.size:
            raise RuntimeError(f"round {self.round_index}: ranks {differ.tolist()} sampled or "
                               "scheduled other clients than rank 0: the ranks disagree on the "
                               "run (same seed, num_clients, clients_per_round, trace and "
                               "dlcomm version on every rank?)")
        records = out[-1].reshape(records.shape)
        trained = records[:, TRAINED]
        if not np.all(trained == 1.0):
            bad = np.flatnonzero(trained != 1.0)
            raise RuntimeError(f"round {self.round_index}: sampled clients at positions "
                               f"{bad.tolist()} were trained {trained[bad].tolist()} times, "
                               "not once: the ranks disagree on the sample or schedule (same "
                               "seed, num_clients and dlcomm version on every rank?)")
        return dict(zip(keys, out[:-1])), records

    def metrics_of(self, records: np.ndarray) -> dict[str, float]:
        n = records[:, NUM_SAMPLES]
        total = n.sum()
        return {m: float((records[:, FIXED_COLUMNS + j] * n).sum() / total) if total else 0.0
                for j, m in enumerate(self.metric_names)}

    def simulated_seconds(self, clients: np.ndarray, records: np.ndarray) -> float | None:
        if self.trace is None:
            return None
        return self.trace.round_seconds(clients, records[:, NUM_SAMPLES], self.model_bytes)

    def report(self, clients: np.ndarray, records: np.ndarray, seconds: float,
               busy: np.ndarray, predicted: float, ideal: float) -> RoundReport:
        return RoundReport(
            round_index=self.round_index, clients=clients,
            num_samples=int(records[:, NUM_SAMPLES].sum()), metrics=self.metrics_of(records),
            seconds=seconds, busy_seconds=busy, predicted_makespan=predicted,
            ideal_makespan=ideal, simulated_seconds=self.simulated_seconds(clients, records),
            state_bytes=self.store.bytes_in_memory,
            state_peak_bytes=self.store.peak_bytes_in_memory, state_spills=self.store.spills,
            peak_rss_bytes=peak_rss_bytes())

    # --- the whole run ----------------------------------------------------------------------
    def run_round(self) -> RoundReport:  # pragma: no cover - each runner defines it
        raise NotImplementedError

    def run(self, rounds: int,
            on_round: Callable[[RoundReport], None] | None = None) -> list[RoundReport]:
        """Run ``rounds`` rounds (collective: every rank calls it); ``on_round`` sees each
        round's report as it ends."""
        check_count(rounds, "rounds", 0)
        reports = []
        for _ in range(rounds):
            rep = self.run_round()
            reports.append(rep)
            if on_round is not None:
                on_round(rep)
        return reports

    def memory_summary(self) -> dict[str, Any]:
        """Every rank's peak resident memory and peak client-state bytes (collective)."""
        mine = (peak_rss_bytes(), self.store.peak_bytes_in_memory, self.store.spills)
        every = dlcomm.allgather_object(mine, name="fl.memory")
        return {"peak_rss_bytes": [e[0] for e in every],
                "total_peak_rss_bytes": int(sum(e[0] for e in every)),
                "state_peak_bytes": [e[1] for e in every],
                "state_spills": [e[2] for e in every]}

    def close(self) -> None:
        """Remove the state directory this run created (collective)."""
        dlcomm.barrier()
        if self.rank == 0:
            shutil.rmtree(self.store.directory, ignore_errors=True)

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
