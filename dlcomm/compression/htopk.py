"""Hierarchical top-k (``htopk``): dense inside a host, sparse between hosts, dense back.

After "Towards scalable distributed training of deep learning on public cloud clusters"
(Shi et al.): links inside a host are fast, so a host sums its ranks' gradients densely;
only the selected values of that sum cross the slow links between hosts. The flat tensor is
cut into ``shards`` contiguous shards (the smallest host's rank count); local rank ``j`` of
every host owns shard ``j``, and the owners of shard ``j`` on all hosts are its PEER group.
Four rounds:

1. HOST reduce-scatter: the owner of shard ``j`` gets shard ``j`` of the host sum ``S`` of its
   ranks' (error feedback corrected) tensors; a host's other ranks get nothing.
2. HOST all-gather: each owner selects the top ``ratio * len`` magnitudes of its shard and
   sends their indices, so every rank of the host knows the host's selection ``I``.
3. PEER all-gather: each owner sends its (values, indices) to the owners of the same shard on
   the other hosts and adds every host's values into a zero shard, in host order.
4. HOST all-gather: the owners' dense shard sums go to every rank of the host, which
   concatenates them. Every owner of a shard adds the same arrays in the same order, so
   every rank of the world gets the same bits.

With one host (or one rank) it is a dense sum followed by top-k of each shard of the sum.
Round 2 exists for error feedback: every rank must know ``I`` before the last round's
payloads, when ``ErrorFeedback`` sets the residual (its k indices are small beside the
shard sums of round 4).

Error feedback stays per rank and unchanged (``ErrorFeedback`` wraps this compressor): a rank
sent, inside its host's sum, its own ``acc`` at the host's selected indices ``I``
(``local_estimate``), so its residual is ``acc`` zeroed at ``I``. Summed over the host,
``sent + new residuals == S`` (what the host sent at ``I``, and all of ``S`` elsewhere), and
``S`` is the sum of the host's gradients and old residuals: the conservation of error feedback
holds per rank exactly and per host up to the rounding of the dense sum. The residuals of a
host add up to the one residual a shard owner would keep of the host sum; keeping them per
rank costs each rank a full-size residual (as ``topk``) but keeps momentum correction (DGC's
masking zeroes the velocity at ``I``) and checkpoints as they are for every compressor.
"""
from __future__ import annotations

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.compression.base import (
    ALLGATHER,
    HOST,
    PEER,
    REDUCE_SCATTER,
    Compressor,
    Context,
    check_op,
)
from dlcomm.compression.sparsify import check_ratio, k_for, scatter_dense, zero_at
from dlcomm.compression.topk_select import (
    approx_topk_indices,
    exact_topk_indices,
    index_dtype,
)
from dlcomm.compression.topology import HostTopology


def shard_bounds(n: int, shards: int) -> list[int]:
    """Boundaries of ``shards`` contiguous shards of ``n`` elements (sizes differ by at most
    one; shards are empty when ``n < shards``): shard ``j`` is ``[b[j], b[j + 1])``."""
    return [n * j // shards for j in range(shards + 1)]


def shard_topk(host_sum: object, ratio: float, shards: int, approx: bool = False) -> list:
    """Per shard, the sorted flat indices of its ``k_for(ratio, len)`` largest magnitudes
    (none for an empty shard); ``approx``: about that many, by the threshold search of
    ``topk:approx=1``."""
    select = approx_topk_indices if approx else exact_topk_indices
    xp = array_namespace(host_sum)
    bounds = shard_bounds(host_sum.size, shards)
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        if hi == lo:
            out.append(xp.arange(0))
        else:
            out.append(select(host_sum[lo:hi], k_for(ratio, hi - lo)) + lo)
    return out


class HierarchicalTopK(Compressor):
    """Top-k of each shard of a host's dense sum, exchanged sparsely between hosts."""

    name = "htopk"
    rounds = (REDUCE_SCATTER, ALLGATHER, ALLGATHER, ALLGATHER)
    round_groups = (HOST, HOST, PEER, HOST)

    def __init__(self, ratio: float = 0.01, approx: bool = False, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.ratio = check_ratio(ratio)
        self.approx = bool(approx)

    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        flat = tensor.reshape(-1)
        ctx = self._context(tensor, name)
        ctx.data["flat"] = flat
        return [flat], ctx

    @staticmethod
    def _topology(ctx: Context) -> HostTopology:
        if not isinstance(ctx.topology, HostTopology):
            raise ValueError(f"tensor {ctx.name!r}: htopk needs the host topology, which the "
                             "exchange driver (run_rounds) puts in the context")
        return ctx.topology

    def scatter_counts(self, n: int, size: int, ctx: Context) -> list[int]:
        """Local rank ``j < shards`` receives shard ``j`` of the host sum; the others none."""
        topology = self._topology(ctx)
        sizes = np.diff(shard_bounds(n, topology.shards)).tolist()
        return sizes + [0] * (size - topology.shards)

    def _resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        topology = self._topology(ctx)
        xp = array_namespace(ctx.data["flat"])
        n = ctx.size
        itype = index_dtype(n)
        bounds = shard_bounds(n, topology.shards)
        j = topology.local_rank
        lo = bounds[j] if topology.owns_shard else 0
        if ctx.round == 1:  # reduced: my shard of the host sum; tell the host what I select
            if not topology.owns_shard:
                return [xp.empty(0, dtype=itype)], ctx
            shard = reduced[0].reshape(-1)
            picked = shard_topk(shard, self.ratio, 1, self.approx)[0]
            ctx.data["sent"] = [shard[picked], (picked + lo).astype(itype)]
            return [ctx.data["sent"][1]], ctx
        if ctx.round == 2:  # reduced: every local rank's indices; send my selection to peers
            ctx.data["indices"] = xp.concatenate([r[0] for r in reduced]).astype(itype)
            if not topology.owns_shard:
                return [xp.empty(0, dtype=ctx.dtype), xp.empty(0, dtype=itype)], ctx
            return ctx.data.pop("sent"), ctx
        # reduced: every host's [values, indices] of my shard, in host order; send the sum.
        if not topology.owns_shard:
            return [xp.empty(0, dtype=ctx.dtype)], ctx
        shard = xp.zeros(bounds[j + 1] - lo, dtype=ctx.dtype)
        for values, indices in reduced:
            shard[indices - lo] += values
        return [shard], ctx

    def decompress_all(self, per_rank: list, ctx: Context, op: str = "average") -> object:
        """The host's ranks' final payloads: the owners' shard sums, in shard order."""
        check_op(op)
        topology = self._topology(ctx)
        xp = array_namespace(per_rank[0][0])
        out = xp.concatenate([per_rank[j][0] for j in range(topology.shards)])
        if out.size != ctx.size:
            raise ValueError(f"tensor {ctx.name!r}: shards hold {out.size} elements, "
                             f"expected {ctx.size}")
        if op == "average":
            out /= out.dtype.type(topology.world_size)
        return out.reshape(ctx.shape)

    def decompress(self, payloads: list, ctx: Context) -> object:
        """One rank's final payloads alone rebuild nothing: the result needs every shard
        (``decompress_all``)."""
        raise NotImplementedError("htopk rebuilds its result from every rank of the host "
                                  "(decompress_all)")

    def local_estimate(self, payloads: list, ctx: Context) -> object:
        """What this rank sent inside its host's sum: its own input at the host's selection."""
        flat, indices = ctx.data["flat"], ctx.data["indices"]
        return scatter_dense(flat[indices], indices, ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object:
        return zero_at(tensor, ctx.data["indices"])

    def describe(self) -> str:
        return f"htopk:ratio={self.ratio},approx={int(self.approx)}"
