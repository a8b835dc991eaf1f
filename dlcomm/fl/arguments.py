"""Validation of the arguments every federated runner (and the reference) takes."""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from dlcomm.fl.arrays import NamedArrays, check_named_arrays
from dlcomm.fl.strategies import Strategy, get_strategy
from dlcomm.fl.trace import ClientTrace


def check_count(value: Any, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_run_arguments(client_update: Any, initial_weights: Any, num_clients: Any,
                        clients_per_round: Any, strategy: Any, client_sizes: Any, seed: Any,
                        trace: Any, metric_names: Any,
                        ) -> tuple[NamedArrays, int, int, Strategy, np.ndarray, list[str]]:
    """Validated arguments common to every runner (the reference included)."""
    if not callable(client_update):
        raise TypeError("client_update must be callable as fn(client_id, weights, ctx)")
    weights = check_named_arrays(initial_weights, "initial_weights")
    n = check_count(num_clients, "num_clients", 1)
    k = check_count(clients_per_round, "clients_per_round", 1)
    if k > n:
        raise ValueError(f"clients_per_round ({k}) exceeds num_clients ({n})")
    check_count(seed, "seed", 0)
    strat = get_strategy(strategy)
    sizes = np.ones(n) if client_sizes is None else np.asarray(client_sizes, dtype=np.float64)
    if sizes.shape != (n,) or np.any(sizes < 0):
        raise ValueError(f"client_sizes must give {n} sample counts >= 0, one per client")
    if trace is not None:
        if not isinstance(trace, ClientTrace):
            raise TypeError(f"trace must be a dlcomm.fl.ClientTrace, got {type(trace).__name__}")
        if trace.num_clients != n:
            raise ValueError(f"trace describes {trace.num_clients} clients, not {n}")
    names = list(metric_names)
    if not all(isinstance(m, str) and m for m in names) or len(set(names)) != len(names):
        raise ValueError(f"metric_names must be distinct non-empty str, got {metric_names!r}")
    return weights, n, k, strat, sizes, names
