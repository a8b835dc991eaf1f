"""Which clients take part in a round, and the seed each client's local training uses.

Both depend only on (seed, round, client), never on which rank runs what, so a simulation on
any number of ranks, a deployment and the single-process reference see the same clients and
the same random numbers.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

_SAMPLING_STREAM = 0x5341  # separates the sampling stream from the clients' seeds
_CLIENT_STREAM = 0x434C


def _check_count(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{what} must be an int >= {minimum}, got {value!r}")
    return int(value)


def client_seed(seed: int, round_index: int, client_id: int) -> int:
    """The 63-bit seed of ``client_id``'s local training in round ``round_index``."""
    _check_count(seed, "seed", 0)
    _check_count(round_index, "round_index", 0)
    _check_count(client_id, "client_id", 0)
    ss = np.random.SeedSequence([seed, _CLIENT_STREAM, round_index, client_id])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def sample_clients(num_clients: int, clients_per_round: int, round_index: int, seed: int,
                   available: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """``clients_per_round`` distinct client ids (sorted) drawn uniformly for round
    ``round_index``; only from ``available`` when given (fewer if fewer are available)."""
    num_clients = _check_count(num_clients, "num_clients", 1)
    per_round = _check_count(clients_per_round, "clients_per_round", 1)
    if per_round > num_clients:
        raise ValueError(f"clients_per_round ({per_round}) exceeds num_clients ({num_clients})")
    _check_count(round_index, "round_index", 0)
    _check_count(seed, "seed", 0)
    if available is None:
        candidates = np.arange(num_clients, dtype=np.int64)
    else:
        candidates = np.unique(np.asarray(available, dtype=np.int64))
        if candidates.size and (candidates[0] < 0 or candidates[-1] >= num_clients):
            raise ValueError(f"available client ids must lie in [0, {num_clients})")
    rng = np.random.default_rng([seed, _SAMPLING_STREAM, round_index])
    k = min(per_round, candidates.size)
    return np.sort(rng.choice(candidates, size=k, replace=False))
