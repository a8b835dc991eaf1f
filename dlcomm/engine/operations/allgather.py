"""All-gather: every member's tensor concatenated along dimension 0 (sizes may differ)."""
from __future__ import annotations

import math

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import EngineState, PerResponse
from dlcomm.engine.request import Request


class Allgather(PerResponse):
    def __init__(self, state: EngineState) -> None:
        self.state = state

    def run(self, response: Response, request: Request | None) -> np.ndarray:
        assert request is not None  # joined ranks are refused for all-gathers
        ps = self.state.process_set(response)
        comm = ps.data_comm(response.reference.device)
        x = request.arrays[0]
        rest = x.shape[1:]
        row = math.prod(rest)
        rows = [response.signatures[r].shapes[0][0] for r in ps.ranks]
        out = array_namespace(x).empty((sum(rows), *rest), dtype=x.dtype)
        with self.state.timeline.phase(response.name, "communicate", {"bytes": x.nbytes}):
            comm.allgatherv(x.reshape(-1), out.reshape(-1), [n * row for n in rows])
        return out
