"""Simulated client heterogeneity from a seeded trace, so a run reproduces exactly.

Real federated clients differ in compute speed, in when they are online and in their network.
``ClientTrace`` draws each client's relative speed (log-normal), its probability of being
online in a round (Beta), and its bandwidth (log-normal) from one seed. The runner samples only
online clients and reports a simulated round time (FedScale's virtual clock): the slowest
sampled client's compute (samples / its speed, in units of ``seconds_per_sample``) plus the
model's download and upload at its bandwidth. ``rank_speeds`` draws heterogeneous devices.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ClientTrace:
    """Per-client speed, availability and bandwidth; ``available(round)`` is seeded too."""

    speed: np.ndarray  # relative compute speed, median 1
    availability: np.ndarray  # probability of being online in a round
    bandwidth: np.ndarray  # bytes per second, each way
    seed: int
    seconds_per_sample: float = 0.01  # a speed-1 client's compute per sample

    @classmethod
    def generate(cls, num_clients: int, seed: int, speed_sigma: float = 0.5,
                 mean_availability: float = 0.8, median_bandwidth: float = 2.5e6,
                 bandwidth_sigma: float = 0.7, seconds_per_sample: float = 0.01) -> ClientTrace:
        """A trace for ``num_clients`` clients; ``speed_sigma`` 0 and ``mean_availability`` 1
        give identical, always-online clients."""
        if not isinstance(num_clients, int) or num_clients < 1:
            raise ValueError(f"num_clients must be an int >= 1, got {num_clients!r}")
        if not 0 < mean_availability <= 1:
            raise ValueError(f"mean_availability must lie in (0, 1], got {mean_availability!r}")
        for value, what in ((speed_sigma, "speed_sigma"), (bandwidth_sigma, "bandwidth_sigma")):
            if value < 0:
                raise ValueError(f"{what} must be >= 0, got {value!r}")
        if median_bandwidth <= 0 or seconds_per_sample <= 0:
            raise ValueError("median_bandwidth and seconds_per_sample must be > 0")
        rng = np.random.default_rng([seed, 0x5452])
        speed = np.exp(rng.normal(0.0, speed_sigma, num_clients))
        if mean_availability >= 1:
            avail = np.ones(num_clients)
        else:  # Beta(a, b) with mean a / (a + b) and a + b = 4: a spread of habits
            a = 4 * mean_availability
            avail = rng.beta(a, 4 - a, num_clients)
        bandwidth = median_bandwidth * np.exp(rng.normal(0.0, bandwidth_sigma, num_clients))
        return cls(speed, avail, bandwidth, int(seed), float(seconds_per_sample))

    @property
    def num_clients(self) -> int:
        return int(self.speed.size)

    def available(self, round_index: int) -> np.ndarray:
        """Ids of the clients online in ``round_index`` (never empty: the likeliest one is)."""
        rng = np.random.default_rng([self.seed, 0x4156, round_index])
        online = np.flatnonzero(rng.random(self.num_clients) < self.availability)
        return online if online.size else np.array([int(np.argmax(self.availability))])

    def client_seconds(self, clients: Sequence[int], num_samples: Sequence[int],
                       model_bytes: int) -> np.ndarray:
        """Simulated time of each client: compute at its speed plus the model both ways."""
        c = np.asarray(clients, dtype=np.int64)
        n = np.asarray(num_samples, dtype=np.float64)
        return (self.seconds_per_sample * n / self.speed[c]
                + 2.0 * model_bytes / self.bandwidth[c])

    def round_seconds(self, clients: Sequence[int], num_samples: Sequence[int],
                      model_bytes: int) -> float:
        """Simulated round time: the slowest of the round's clients."""
        if len(clients) == 0:
            return 0.0
        return float(self.client_seconds(clients, num_samples, model_bytes).max())


def rank_speeds(num_ranks: int, seed: int, sigma: float = 0.3) -> np.ndarray:
    """Seeded relative speeds of ``num_ranks`` devices (log-normal, median 1)."""
    if not isinstance(num_ranks, int) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an int >= 1, got {num_ranks!r}")
    return np.exp(np.random.default_rng([seed, 0x5253]).normal(0.0, sigma, num_ranks))
