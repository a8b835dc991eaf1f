"""Broadcast: the root member's tensor copied into every member's output, in place."""
from __future__ import annotations

import numpy as np

from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import EngineState, PerResponse
from dlcomm.engine.request import Request


class Broadcast(PerResponse):
    def __init__(self, state: EngineState) -> None:
        self.state = state

    def run(self, response: Response, request: Request | None) -> np.ndarray:
        assert request is not None  # joined ranks are refused for broadcasts
        ps = self.state.process_set(response)
        comm = ps.data_comm(response.reference.device)
        out = request.outputs[0]
        root = ps.set_rank(response.reference.root)  # the root is named by its world rank
        with self.state.timeline.phase(response.name, "communicate", {"bytes": out.nbytes}):
            comm.bcast(out.reshape(-1), root)
        return out
