"""Sparsifiers: ``topk`` (largest magnitudes) and ``randomk`` (a random subset).

``topk`` payloads are (values, indices) chosen per rank, so ranks pick different indices and
the payloads are all-gathered. ``randomk`` draws its indices from a seed, the tensor name and
a per-name step counter, so every rank picks the same indices: only values travel, and they
are summable (GRACE's random-k works the same way).
"""
from __future__ import annotations

from dlcomm.array_api import array_namespace, name_seed
from dlcomm.compression.base import ALLGATHER, ALLREDUCE, Compressor, Context, check_op
from dlcomm.compression.topk_select import (
    approx_topk_indices,
    exact_topk_indices,
    index_dtype,
)
from dlcomm.kernels import scatter_add_


def check_ratio(ratio: object) -> float:
    """Return ``ratio`` as float; ValueError unless it lies in (0, 1]."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}")
    return float(ratio)


def k_for(ratio: float, n: int) -> int:
    """Number of elements kept out of ``n`` at ``ratio`` (at least 1)."""
    return max(1, min(n, int(ratio * n)))


def scatter_dense(values: object, indices: object, ctx: Context) -> object:
    """A zero tensor of ``ctx.shape``/``ctx.dtype`` with ``values`` at flat ``indices``."""
    xp = array_namespace(values)
    out = xp.zeros(ctx.size, dtype=ctx.dtype)
    out[indices] = values
    return out.reshape(ctx.shape)


def zero_at(tensor: object, indices: object) -> object:
    """A copy of ``tensor`` with the elements at flat ``indices`` set to zero."""
    out = tensor.copy()
    out.reshape(-1)[indices] = 0
    return out


def sum_sparse(pairs: list, ctx: Context, op: str) -> object:
    """The sum (or mean) over ranks of ``(values, flat indices)`` pairs as a dense tensor,
    added in rank order into one zero buffer: the same bits as adding the ranks' dense
    tensors (``x + 0 == x``), without a dense temporary per rank. (A position repeated
    within one pair keeps its last value, as ``scatter_dense`` does.)"""
    if not pairs:
        raise ValueError("sum_sparse needs at least one rank's payloads")
    out = array_namespace(pairs[0][0]).empty(ctx.shape, dtype=ctx.dtype)
    sum_sparse_into(pairs, out, op)  # zeroes it first
    return out


def fits_into(out: object, ctx: Context) -> bool:
    """Whether ``out`` can take a result of ``ctx`` in place: same shape and dtype, one
    contiguous writable block (so its flat view is a view, not a copy)."""
    flags = getattr(out, "flags", None)
    return (flags is not None and tuple(out.shape) == tuple(ctx.shape)
            and out.dtype == ctx.dtype and bool(flags.c_contiguous)
            and bool(getattr(flags, "writeable", True)))


def sum_sparse_into(pairs: list, out: object, op: str) -> object:
    """``sum_sparse`` written into ``out`` (contiguous, the result's shape and dtype), with
    the same bits. Returns the flat positions written (outside them ``out`` is zero)."""
    check_op(op)
    if not pairs:
        raise ValueError("sum_sparse_into needs at least one rank's payloads")
    flat = out.reshape(-1)
    flat[...] = 0
    for values, indices in pairs:
        scatter_add_(flat, indices, values)
    if op == "average":
        flat /= flat.dtype.type(len(pairs))
    return array_namespace(out).concatenate([indices for _, indices in pairs])


class TopK(Compressor):
    """Keep the ``ratio * n`` largest magnitudes (``approx=True``: MSTopK-style, about k)."""

    name = "topk"
    rounds = (ALLGATHER,)

    def __init__(self, ratio: float = 0.01, approx: bool = False, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.ratio = check_ratio(ratio)
        self.approx = bool(approx)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        flat = tensor.reshape(-1)
        k = k_for(self.ratio, flat.size)
        select = approx_topk_indices if self.approx else exact_topk_indices
        idx = select(flat, k)
        return [flat[idx], idx.astype(index_dtype(flat.size))], self._context(tensor, name)

    def decompress(self, payloads: list, ctx: Context) -> object:
        values, indices = payloads
        return scatter_dense(values, indices, ctx)

    def decompress_all(self, per_rank: list, ctx: Context, op: str = "average") -> object:
        return sum_sparse([(values, indices) for values, indices in per_rank], ctx, op)

    def decompress_all_into(self, per_rank: list, ctx: Context, op: str, out: object
                            ) -> object | None:
        if not fits_into(out, ctx):
            return None
        return sum_sparse_into([(values, indices) for values, indices in per_rank], out, op)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object:
        return zero_at(tensor, payloads[1])

    def describe(self) -> str:
        return f"topk:ratio={self.ratio},approx={int(self.approx)}"


class RandomK(Compressor):
    """Keep ``ratio * n`` elements at indices shared by all ranks (seed, name, step).

    The default (no scaling, and no error feedback in the registry) is, in expectation, SGD
    on each tensor at ``k/n`` of the learning rate: slower than dense, but it trains at the
    dense learning rate. An element is picked once every ``n/k`` steps on average (a
    geometric wait), so error feedback hands it the residual of that many steps at once, and
    ``unbiased=True`` scales every pick by ``n/k``: either way one step moves it about ``n/k``
    times as far as a dense step (momentum then carries it ``1/(1-m)`` times further), which
    diverges where dense SGD converges (issue 17). Both stay available for small learning
    rates: ``unbiased=True`` scales kept values by n/k so the expectation equals the input;
    leave it off under error feedback, where the residual already carries what was not sent.
    """

    name = "randomk"
    rounds = (ALLREDUCE,)

    def __init__(
        self, ratio: float = 0.01, seed: int = 0, unbiased: bool = False, **kwargs: object
    ) -> None:
        super().__init__(**kwargs)
        self.ratio = check_ratio(ratio)
        self.seed = int(seed)
        self.unbiased = bool(unbiased)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        xp = array_namespace(tensor)
        step = self.states.get(name, 0)
        self.states[name] = step + 1
        flat = tensor.reshape(-1)
        n = flat.size
        k = k_for(self.ratio, n)
        rng = name_seed(self.seed, name, step)
        host_idx = rng.choice(n, size=k, replace=False, shuffle=False)
        host_idx.sort()
        idx = xp.asarray(host_idx.astype(index_dtype(n)))
        values = flat[idx]
        if self.unbiased:
            values = values * values.dtype.type(n / k)
        ctx = self._context(tensor, name)
        ctx.data["indices"] = idx
        return [values], ctx

    def decompress(self, payloads: list, ctx: Context) -> object:
        return scatter_dense(payloads[0], ctx.data["indices"], ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object:
        return zero_at(tensor, ctx.data["indices"])

    def describe(self) -> str:
        return f"randomk:ratio={self.ratio},seed={self.seed},unbiased={int(self.unbiased)}"
