"""All-gather: every member's tensor concatenated along dimension 0 (sizes may differ)."""
from __future__ import annotations

import math
from typing import Any

from dlcomm.array_api import array_namespace
from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import EngineState, PerResponse
from dlcomm.engine.request import Request


class Allgather(PerResponse):
    """One all-gather per tensor of the request (a grouped request has several)."""

    def __init__(self, state: EngineState) -> None:
        self.state = state

    def run(self, response: Response, request: Request | None) -> Any:
        assert request is not None  # joined ranks are refused for all-gathers
        ps = self.state.process_set(response)
        comm = ps.data_comm(response.reference.device)
        results = []
        with self.state.timeline.phase(response.name, "communicate",
                                       {"bytes": sum(x.nbytes for x in request.arrays)}):
            for i, x in enumerate(request.arrays):
                rest = x.shape[1:]
                row = math.prod(rest)
                rows = [response.signatures[r].shapes[i][0] for r in ps.ranks]
                out = array_namespace(x).empty((sum(rows), *rest), dtype=x.dtype)
                comm.allgatherv(x.reshape(-1), out.reshape(-1), [n * row for n in rows])
                results.append(out)
        return results if request.grouped else results[0]
