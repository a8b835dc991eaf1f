"""Low-rank compressors: ``powersgd`` (Vogels et al.) and ``acpsgd`` (Shi et al., alternating).

A tensor is viewed as the matrix M = tensor.reshape(shape[0], -1) (1-D: a column) and
approximated with rank r = min(rank, rows, cols) factors P (rows x r) and Q (cols x r).

PowerSGD, two all-reduce rounds per step, warm-started Q:
  round 0: P = M Q            -> all-reduce P; P^ = orthogonalise(P)
  round 1: Q = M^T P^         -> all-reduce Q; result = P^ Q^T
ACP-SGD, one all-reduce per step, alternating which factor is computed:
  even step: P = M orth(Q_prev) -> all-reduce P; result = P orth(Q_prev)^T; keep P
  odd step:  Q = M^T orth(P_prev) -> all-reduce Q; result = orth(P_prev) Q^T; keep Q
The fixed factor is the previous all-reduced one (identical on all ranks) or, at step 0, a
random matrix drawn from (seed, tensor name), never from a global RNG. Orthogonalisation is a
reduced QR, so sums (not means) can be all-reduced: only the column span matters.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import (
    array_namespace,
    compute_dtype,
    from_host,
    name_seed,
)
from dlcomm.compression.base import ALLREDUCE, Compressor, Context


def check_rank(rank: object) -> int:
    """Return ``rank`` as int; ValueError unless it is an int >= 1."""
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"rank must be an int >= 1, got {rank!r}")
    return int(rank)


def orthogonalize(matrix: object) -> object:
    """Orthonormal columns spanning (at least) the column space of ``matrix`` (reduced QR)."""
    xp = array_namespace(matrix)
    q, _ = xp.linalg.qr(matrix)
    return q


def as_matrix(tensor: object) -> object:
    """The 2-D view (shape[0], prod(rest)) in the dtype low-rank maths runs in."""
    rows = tensor.shape[0] if tensor.ndim else 1
    return tensor.reshape(rows, -1).astype(compute_dtype(tensor.dtype), copy=False)


def random_factor(seed: int, name: str, which: int, shape: tuple[int, int], like: object) -> object:
    """A standard-normal matrix that is identical on every rank for (seed, name, which)."""
    host = name_seed(seed, name, which).standard_normal(shape)
    return from_host(host.astype(like.dtype), like)


def minus_projection(tensor: object, basis: object, side: str) -> object:
    """``tensor`` (as its matrix) less its projection onto the orthonormal columns ``basis``:
    ``M - B (B^T M)`` for ``side="left"``, ``M - (M B) B^T`` for ``side="right"``; same shape
    and dtype as ``tensor``."""
    m = as_matrix(tensor)
    projected = basis @ (basis.T @ m) if side == "left" else (m @ basis) @ basis.T
    return (m - projected).reshape(tensor.shape).astype(tensor.dtype, copy=False)


def low_rank_product(p: object, q: object, ctx: Context) -> object:
    """P Q^T reshaped and cast back to the original tensor."""
    return (p @ q.T).reshape(ctx.shape).astype(ctx.dtype, copy=False)


class PowerSGD(Compressor):
    """Rank-``rank`` power iteration with warm start; rounds: all-reduce P, then Q."""

    name = "powersgd"
    rounds = (ALLREDUCE, ALLREDUCE)

    def __init__(self, rank: int = 4, seed: int = 0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.rank = check_rank(rank)
        self.seed = int(seed)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        m = as_matrix(tensor)
        r = min(self.rank, *m.shape)
        q = self.states.get(name)
        if q is None or q.shape != (m.shape[1], r) or q.dtype != m.dtype:
            q = random_factor(self.seed, name, 0, (m.shape[1], r), m)
        ctx = self._context(tensor, name)
        ctx.data["matrix"] = m
        return [m @ q], ctx

    def _resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        p_hat = orthogonalize(reduced[0])
        ctx.data["p"] = p_hat
        return [ctx.data.pop("matrix").T @ p_hat], ctx

    def decompress(self, payloads: list, ctx: Context) -> object:
        # Warm start: next step's Q spans this step's all-reduced Q (kept orthonormal so its
        # scale never grows, which matters under fp16 payloads).
        self.states[ctx.name] = orthogonalize(payloads[0])
        return low_rank_product(ctx.data["p"], payloads[0], ctx)

    def local_estimate(self, payloads: list, ctx: Context) -> object:
        return low_rank_product(ctx.data["p"], payloads[0], ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object:
        return minus_projection(tensor, ctx.data["p"], "left")

    def describe(self) -> str:
        return f"powersgd:rank={self.rank},seed={self.seed}"


class ACPSGD(Compressor):
    """Alternating compressed PowerSGD: one all-reduce per step, P on even steps, Q on odd."""

    name = "acpsgd"
    rounds = (ALLREDUCE,)

    def __init__(self, rank: int = 4, seed: int = 0, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.rank = check_rank(rank)
        self.seed = int(seed)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        xp = array_namespace(tensor)
        m = as_matrix(tensor)
        rows, cols = m.shape
        r = min(self.rank, rows, cols)
        state = self.states.get(name)
        if state is None or state["p"].shape != (rows, r) or state["p"].dtype != m.dtype:
            state = {
                "step": 0,
                "p": random_factor(self.seed, name, 1, (rows, r), m),
                "q": random_factor(self.seed, name, 0, (cols, r), m),
            }
            self.states[name] = state
        ctx = self._context(tensor, name)
        if state["step"] % 2 == 0:
            fixed = orthogonalize(state["q"])
            payload = m @ fixed
            ctx.data["computes"] = "p"
        else:
            fixed = orthogonalize(state["p"])
            payload = m.T @ fixed
            ctx.data["computes"] = "q"
        state["step"] += 1
        ctx.data["fixed"] = fixed
        return [xp.ascontiguousarray(payload)], ctx

    def decompress(self, payloads: list, ctx: Context) -> object:
        self.states[ctx.name][ctx.data["computes"]] = payloads[0].copy()
        return self.local_estimate(payloads, ctx)

    def local_estimate(self, payloads: list, ctx: Context) -> object:
        if ctx.data["computes"] == "p":
            return low_rank_product(payloads[0], ctx.data["fixed"], ctx)
        return low_rank_product(ctx.data["fixed"], payloads[0], ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object:
        side = "right" if ctx.data["computes"] == "p" else "left"
        return minus_projection(tensor, ctx.data["fixed"], side)

    def describe(self) -> str:
        return f"acpsgd:rank={self.rank},seed={self.seed}"
