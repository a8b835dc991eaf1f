"""Runs the agreed responses of one cycle on this rank by handing each to its operation.

Every rank runs the same responses in the same order, so the collectives the operations
issue match up across ranks without further coordination. All-reduces wait for the end of
the cycle, where they are fused into groups (``fusion.allreduce_groups``) first.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dlcomm.engine import fusion
from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations import build_operations, operation_name
from dlcomm.engine.operations.base import EngineState, Item, Operation
from dlcomm.engine.process_sets import ProcessSetState
from dlcomm.engine.request import Kind, Request
from dlcomm.errors import MismatchError


class Executor:
    """Executes responses for one rank: dispatch only, the operations do the work."""

    def __init__(self, rank: int, fusion_threshold: int, timeline: Any,
                 process_sets: dict[int, ProcessSetState],
                 engine_actions: dict[Kind, Callable[[Response, Request | None], Any]]) -> None:
        self.rank = rank
        self.state = EngineState(rank, process_sets, timeline, fusion_threshold)
        self.operations = build_operations(self.state, engine_actions)

    @property
    def fusion_threshold(self) -> int:
        """Bytes up to which all-reduces are fused (``DLCOMM_FUSION_THRESHOLD``)."""
        return self.state.fusion_threshold

    @fusion_threshold.setter
    def fusion_threshold(self, value: int) -> None:
        self.state.fusion_threshold = value

    @property
    def buffers(self) -> fusion.FusionBuffer:
        return self.state.buffers

    def run(self, responses: Sequence[Response], local: dict[str, Request]) -> None:
        """Execute ``responses``; complete the handles of this rank's requests."""
        allreduces: list[Item] = []
        for resp in responses:
            req = local.get(resp.name)
            if req is not None:
                self.state.timeline.end(resp.name, "negotiate")
            if resp.error is not None:
                if req is not None:
                    req.handle.set_error(MismatchError(resp.error))
                continue
            if self.rank not in resp.members:
                continue
            operation = self._operation(resp)
            if operation.batched:
                allreduces.append((resp, req))
            else:
                operation.execute([(resp, req)])
        if allreduces:
            threshold = self.state.fusion_threshold
            for group in fusion.allreduce_groups([r for r, _ in allreduces], threshold):
                items = [allreduces[i] for i in group]
                self._operation(items[0][0]).execute(items)

    def _operation(self, response: Response) -> Operation:
        return self.operations[operation_name(response)]
