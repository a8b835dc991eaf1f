"""A tiny federated task in plain numpy for the dlcomm.fl tests: linear regression clients
whose data and local SGD are seeded, so any runner must reproduce the reference exactly."""
from __future__ import annotations

import numpy as np

from dlcomm.fl import ClientResult

FEATURES = 5


def client_data(client: int) -> tuple[np.ndarray, np.ndarray]:
    """Client ``client``'s samples (2 + client mod 7 of them, a client-specific optimum)."""
    rng = np.random.default_rng([7, client])
    n = 2 + client % 7
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    w_true = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    return x, (x @ w_true + 0.1 * rng.normal(size=(n, 1))).astype(np.float32)


def initial_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"w": rng.normal(size=(FEATURES, 1)).astype(np.float32),
            "b": np.zeros(1, dtype=np.float32)}


def client_sizes(num_clients: int) -> list[int]:
    return [2 + c % 7 for c in range(num_clients)]


def make_update(lr: float = 0.05, epochs: int = 2, batch: int = 2, keep_state: bool = False):
    """A client update: ``epochs`` of minibatch SGD in float32 with the strategy's gradient
    correction; with ``keep_state`` it also counts its visits in ``ctx.state``."""

    def update(client, weights, ctx):
        x, y = client_data(client)
        w = {k: v.copy() for k, v in weights.items()}
        rng = np.random.default_rng(ctx.seed)
        steps = 0
        loss = 0.0
        for _ in range(epochs):
            order = rng.permutation(len(x))
            for s in range(0, len(x), batch):
                idx = order[s:s + batch]
                err = x[idx] @ w["w"] + w["b"] - y[idx]
                loss = float((err ** 2).mean())
                grads = {"w": (2 * x[idx].T @ err / len(idx)).astype(np.float32),
                         "b": (2 * err.mean(axis=0)).astype(np.float32)}
                if ctx.correction is not None:
                    ctx.correction.apply(w, grads)
                for k in w:
                    w[k] -= np.float32(lr) * grads[k]
                steps += 1
        state = None
        if keep_state:
            visits = ctx.state.get("visits", np.zeros(1)) + 1.0
            state = {"visits": visits}
        return ClientResult(num_samples=len(x), weights=w, num_steps=steps,
                            metrics={"loss": loss}, state=state)

    return update
