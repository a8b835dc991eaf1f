"""One client's turn, the same in the reference, the simulation and the deployment: build its
context, run the user's update, validate the answer, and turn it into the strategy's addends
and the client's next saved state."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np

from dlcomm.fl.arrays import NamedArrays, check_named_arrays
from dlcomm.fl.client import ClientContext, ClientUpdate, result_delta
from dlcomm.fl.sampling import client_seed
from dlcomm.fl.strategies.base import Strategy

USER, STRATEGY = "user/", "strategy/"
# Columns of the per-client record that travels in the round's all-reduce (then metrics).
TRAINED, SECONDS, NUM_SAMPLES, NUM_STEPS, HAS_STATE = range(5)
FIXED_COLUMNS = 5


@dataclasses.dataclass
class ClientOutcome:
    """What one client's turn adds to its rank's sums, its record row and its next state."""

    contribution: dict[str, np.ndarray]
    record: np.ndarray
    state: NamedArrays | None  # combined saved state (user/ and strategy/ parts), or None


def _split(saved: Mapping[str, np.ndarray] | None, prefix: str) -> NamedArrays | None:
    if not saved:
        return None
    part = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
    return part or None


def run_client(update: ClientUpdate, strategy: Strategy, client: int, round_index: int,
               seed: int, weights: NamedArrays, client_weights: NamedArrays,
               payload: NamedArrays, saved: Mapping[str, np.ndarray] | None,
               metric_names: Sequence[str]) -> ClientOutcome:
    """Train ``client`` from the global ``weights`` (float64; ``client_weights`` is the
    read-only copy in the model's dtype that the user's update receives)."""
    strategy_state = _split(saved, STRATEGY)
    user_state = _split(saved, USER) or {}
    ctx = ClientContext(client_id=int(client), round_index=round_index,
                        seed=client_seed(seed, round_index, int(client)),
                        correction=strategy.correction(weights, payload, strategy_state),
                        state=dict(user_state))
    start = time.perf_counter()
    result = update(int(client), client_weights, ctx)
    seconds = time.perf_counter() - start
    delta = result_delta(result, weights, int(client))
    contribution, new_strategy_state = strategy.contribution(
        weights, payload, delta, result, strategy_state)
    record = np.zeros(FIXED_COLUMNS + len(metric_names))
    record[TRAINED] = 1.0
    record[SECONDS] = seconds
    record[NUM_SAMPLES] = result.num_samples
    record[NUM_STEPS] = result.num_steps or 0
    for j, name in enumerate(metric_names):
        if name not in result.metrics:
            raise ValueError(f"client {client}'s update returned metrics "
                             f"{sorted(result.metrics)}, missing declared metric {name!r}")
        record[FIXED_COLUMNS + j] = float(result.metrics[name])
    undeclared = sorted(set(result.metrics) - set(metric_names))
    if undeclared:
        raise ValueError(f"client {client}'s update returned metrics {undeclared} that were "
                         f"not declared: pass metric_names={sorted(result.metrics)!r}")
    new_user = (check_named_arrays(result.state, f"client {client}'s state")
                if result.state else None)
    state: NamedArrays = {}
    for prefix, new, old in ((STRATEGY, new_strategy_state, strategy_state),
                             (USER, new_user, user_state or None)):
        part = new if new is not None else old
        if part:
            state.update({prefix + k: np.asarray(v) for k, v in part.items()})
    record[HAS_STATE] = 1.0 if state else 0.0
    return ClientOutcome(contribution, record, state or None)


def add_into(sums: dict[str, np.ndarray], contribution: Mapping[str, np.ndarray]) -> None:
    """``sums += contribution`` key by key; a key or shape outside the layout is an error."""
    for key, value in contribution.items():
        target = sums.get(key)
        if target is None or np.shape(value) != target.shape:
            raise ValueError(f"strategy contribution {key!r} with shape {np.shape(value)} is "
                             "not in its contribution_layout")
        target += value
