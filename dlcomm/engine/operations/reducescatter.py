"""Reduce-scatter: a reduction after which member i keeps the i-th part of dimension 0."""
from __future__ import annotations

import math
from typing import Any

from dlcomm.array_api import array_namespace
from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import EngineState, PerResponse
from dlcomm.engine.request import Request
from dlcomm.kernels import scale_into
from dlcomm.ops import ReduceOp


def reducescatter_rows(rows: int, parts: int) -> list[int]:
    """Horovod's split of the first dimension: the first ``rows % parts`` ranks get one more."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class Reducescatter(PerResponse):
    """One reduce-scatter per tensor of the request (a grouped request has several)."""

    def __init__(self, state: EngineState) -> None:
        self.state = state

    def run(self, response: Response, request: Request | None) -> Any:
        assert request is not None  # joined ranks are refused for reduce-scatters
        ps = self.state.process_set(response)
        comm = ps.data_comm(response.reference.device)
        sig = response.reference
        op = ReduceOp(sig.op)
        wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
        post = sig.postscale / (len(ps.ranks) if op is ReduceOp.AVERAGE else 1)
        me = ps.set_rank(self.state.rank)
        results = []
        with self.state.timeline.phase(response.name, "communicate",
                                       {"bytes": sum(x.nbytes for x in request.arrays)}):
            for x in request.arrays:
                rows = reducescatter_rows(x.shape[0], len(ps.ranks))
                rest = x.shape[1:]
                row = math.prod(rest)
                src = x.reshape(-1)
                if sig.prescale != 1.0:
                    src = array_namespace(x).empty_like(src)
                    scale_into(x.reshape(-1), sig.prescale, src)
                out = array_namespace(x).empty((rows[me], *rest), dtype=x.dtype)
                comm.reduce_scatter(src, out.reshape(-1), [n * row for n in rows], wire_op)
                if post != 1.0:
                    scale_into(out, post, out)
                results.append(out)
        return results if request.grouped else results[0]
