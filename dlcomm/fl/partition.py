"""Split a labelled data set among clients: non-IID by a Dirichlet draw over labels (Hsu et
al. 2019, the usual FL benchmark split), or IID. Seeded, so every rank derives the same split.
"""
from __future__ import annotations

import numbers

import numpy as np


def _check(num_samples: int, num_clients: object, seed: object, min_samples: object) -> None:
    for value, what, low in ((num_clients, "num_clients", 1), (seed, "seed", 0),
                             (min_samples, "min_samples", 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{what} must be an int >= {low}, got {value!r}")
    if num_samples < num_clients * min_samples:  # type: ignore[operator]
        raise ValueError(f"{num_samples} samples cannot give {num_clients} clients "
                         f"{min_samples} each: use fewer clients or a smaller min_samples")


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, seed: int,
                        min_samples: int = 1) -> list[np.ndarray]:
    """Each client's sample indices (sorted, disjoint, covering every sample): for every
    label, the proportions going to the clients are drawn from Dirichlet(``alpha``), so a
    small ``alpha`` (0.1) gives each client few labels and a large one (100) is near IID.
    Clients left with fewer than ``min_samples`` take samples from the largest clients."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if not isinstance(alpha, numbers.Real) or not alpha > 0:
        raise ValueError(f"alpha must be a number > 0, got {alpha!r}")
    _check(labels.size, num_clients, seed, min_samples)
    rng = np.random.default_rng([seed, 0x4449])
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
        idx = np.flatnonzero(labels == label)
        rng.shuffle(idx)
        shares = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = np.floor(np.cumsum(shares)[:-1] * idx.size).astype(np.int64)
        for client, piece in enumerate(np.split(idx, cuts)):
            parts[client].append(piece)
    clients = [np.concatenate(p) for p in parts]
    sizes = np.array([c.size for c in clients])
    for client in np.flatnonzero(sizes < min_samples):
        while clients[client].size < min_samples:
            donor = int(np.argmax([c.size for c in clients]))
            take = min(min_samples - clients[client].size, clients[donor].size - min_samples)
            clients[client] = np.concatenate([clients[client], clients[donor][-take:]])
            clients[donor] = clients[donor][:-take]
    return [np.sort(c) for c in clients]


def iid_partition(num_samples: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """Each client's sample indices (sorted): a seeded shuffle cut into near-equal parts."""
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise ValueError(f"num_samples must be an int, got {num_samples!r}")
    _check(int(num_samples), num_clients, seed, 1)
    order = np.random.default_rng([seed, 0x4949]).permutation(int(num_samples))
    return [np.sort(p) for p in np.array_split(order, num_clients)]
