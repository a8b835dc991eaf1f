"""gTop-k: global top-k sparsification merged over a tree of pairwise exchanges (Shi et al.).

Round 0 (SPARSE_MERGE): each rank selects its local top-k (values, indices); the driver merges
pairs of ranks' sparse vectors (sum at common indices, keep the k largest magnitudes) over
log2(P) recursive-doubling rounds, so every rank ends with the same k global indices.
Round 1 (ALLREDUCE): each rank sends its own values at those k indices (a dense k-vector), so
the result at every selected index is the exact sum over ranks, and the rest of the local
gradient, including values that fell out of the global selection, stays in the error-feedback
residual. The extra round costs k elements, keeping the O(k log P) volume of the tree.
"""
from __future__ import annotations

from dlcomm.array_api import array_namespace
from dlcomm.compression.base import ALLREDUCE, SPARSE_MERGE, Compressor, Context
from dlcomm.compression.sparsify import check_ratio, k_for, scatter_dense, zero_at
from dlcomm.compression.topk_select import exact_topk_indices, index_dtype


def merge_sparse(lower: list, higher: list, k: int) -> list:
    """Sum two sparse vectors (values, sorted unique indices) and keep the k largest |values|.

    Deterministic for a given (lower, higher) order, so both partners of a pair agree.
    """
    (va, ia), (vb, ib) = lower, higher
    xp = array_namespace(va)
    values = xp.concatenate([va, vb])
    indices = xp.concatenate([ia, ib])
    order = xp.argsort(indices, kind="stable")
    values, indices = values[order], indices[order]
    # Each side has unique indices, so a shared index appears exactly twice, adjacently.
    dup = indices[1:] == indices[:-1]
    if bool(dup.any()):
        first = xp.flatnonzero(dup)
        values[first] = values[first] + values[first + 1]
        keep = xp.ones(indices.size, dtype=bool)
        keep[first + 1] = False
        values, indices = values[keep], indices[keep]
    if values.size > k:
        sel = exact_topk_indices(values, k)
        values, indices = values[sel], indices[sel]
    return [values, indices]


class GTopK(Compressor):
    """Global top-k of the summed gradient, approximated by a pairwise merge tree."""

    name = "gtopk"
    rounds = (SPARSE_MERGE, ALLREDUCE)

    def __init__(self, ratio: float = 0.01, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.ratio = check_ratio(ratio)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        flat = tensor.reshape(-1)
        k = k_for(self.ratio, flat.size)
        idx = exact_topk_indices(flat, k)
        ctx = self._context(tensor, name)
        ctx.data["flat"] = flat
        ctx.data["k"] = k
        return [flat[idx], idx.astype(index_dtype(flat.size))], ctx

    def merge(self, lower: list, higher: list, ctx: Context) -> list:
        return merge_sparse(lower, higher, ctx.data["k"])

    def _resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        _, global_indices = reduced
        ctx.data["indices"] = global_indices
        return [ctx.data.pop("flat")[global_indices]], ctx

    def decompress(self, payloads: list, ctx: Context) -> object:
        return scatter_dense(payloads[0], ctx.data["indices"], ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object:
        return zero_at(tensor, ctx.data["indices"])

    def describe(self) -> str:
        return f"gtopk:ratio={self.ratio}"
