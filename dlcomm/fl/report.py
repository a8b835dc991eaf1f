"""What one round of a federated run reports: clients, samples, metrics, time and memory."""
from __future__ import annotations

import dataclasses
import resource

import numpy as np


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclasses.dataclass
class RoundReport:
    """One round as every rank sees it (``seconds`` and the state figures are this rank's)."""

    round_index: int
    clients: np.ndarray  # the sampled client ids
    num_samples: int  # summed over the round's clients
    metrics: dict[str, float]  # declared metrics, averaged weighted by sample count
    seconds: float  # this rank's wall time for the round, all-reduce included
    busy_seconds: np.ndarray  # measured training time of each rank (or client rank)
    predicted_makespan: float  # the schedule's predicted busiest rank, cost-model units
    ideal_makespan: float  # the balanced lower bound of the same predictions
    simulated_seconds: float | None  # the trace's virtual round time, None without a trace
    state_bytes: int  # client state this rank holds in memory after the round
    state_peak_bytes: int
    state_spills: int  # state files this rank has written so far
    peak_rss_bytes: int  # this process's peak resident memory so far
