"""All-to-all: member i sends its j-th block of rows to member j (block sizes may differ)."""
from __future__ import annotations

import math

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import EngineState, PerResponse
from dlcomm.engine.request import Request


class Alltoall(PerResponse):
    def __init__(self, state: EngineState) -> None:
        self.state = state

    def run(self, response: Response,
            request: Request | None) -> tuple[np.ndarray, list[int]]:
        assert request is not None  # joined ranks are refused for all-to-alls
        ps = self.state.process_set(response)
        comm = ps.data_comm(response.reference.device)
        x = request.arrays[0]
        rest = x.shape[1:]
        row = math.prod(rest)
        me = ps.set_rank(self.state.rank)
        send_rows = list(response.signatures[self.state.rank].splits or ())
        recv_rows = [response.signatures[r].splits[me] for r in ps.ranks]
        out = array_namespace(x).empty((sum(recv_rows), *rest), dtype=x.dtype)
        with self.state.timeline.phase(response.name, "communicate", {"bytes": x.nbytes}):
            comm.alltoallv(x.reshape(-1), [n * row for n in send_rows],
                           out.reshape(-1), [n * row for n in recv_rows])
        return out, recv_rows
