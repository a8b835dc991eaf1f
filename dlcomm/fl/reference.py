"""The single-process reference: the same sampling, client seeds, client update and strategy,
in one plain loop over the clients in id order with every state in a dict; no dlcomm, no
scheduler, no store. A simulation on any number of ranks must end at its weights (to float
tolerance: only the order of the additions differs)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dlcomm.fl.arguments import check_run_arguments
from dlcomm.fl.arrays import NamedArrays
from dlcomm.fl.client import ClientUpdate
from dlcomm.fl.client_step import FIXED_COLUMNS, NUM_SAMPLES, add_into, run_client
from dlcomm.fl.sampling import sample_clients
from dlcomm.fl.strategies import Strategy
from dlcomm.fl.trace import ClientTrace


def run_reference(client_update: ClientUpdate, initial_weights: Mapping[str, np.ndarray],
                  num_clients: int, clients_per_round: int, rounds: int,
                  strategy: str | Strategy = "fedavg", *, seed: int = 0,
                  trace: ClientTrace | None = None, metric_names: Sequence[str] = (),
                  ) -> tuple[NamedArrays, list[dict]]:
    """Final weights (model dtypes) and, per round, the clients, samples and metrics."""
    weights, n, k, strat, _, names = check_run_arguments(
        client_update, initial_weights, num_clients, clients_per_round, strategy, None, seed,
        trace, metric_names)
    dtypes = {name: a.dtype for name, a in weights.items()}
    w64 = {name: a.astype(np.float64) for name, a in weights.items()}
    strat.setup(w64, n)
    layout = strat.contribution_layout(w64)
    states: dict[int, NamedArrays] = {}
    history = []
    for t in range(rounds):
        available = None if trace is None else trace.available(t)
        clients = sample_clients(n, k, t, seed, available)
        client_weights = {name: a.astype(dtypes[name]) for name, a in w64.items()}
        for a in client_weights.values():
            a.flags.writeable = False
        payload = strat.payload()
        sums = {key: np.zeros(shape) for key, shape in layout.items()}
        records = []
        for c in clients:
            out = run_client(client_update, strat, int(c), t, seed, w64, client_weights,
                             payload, states.get(int(c)), names)
            add_into(sums, out.contribution)
            records.append(out.record)
            if out.state is not None:
                states[int(c)] = out.state
        w64 = strat.aggregate(w64, sums)
        rec = np.array(records)
        total = rec[:, NUM_SAMPLES].sum()
        history.append({"round": t, "clients": clients.tolist(), "num_samples": int(total),
                        "metrics": {m: float((rec[:, FIXED_COLUMNS + j] * rec[:, NUM_SAMPLES]).sum()
                                             / total) if total else 0.0
                                    for j, m in enumerate(names)}})
    return {name: a.astype(dtypes[name]) for name, a in w64.items()}, history
