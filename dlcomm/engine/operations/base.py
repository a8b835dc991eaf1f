"""What every operation shares: the engine's state they run against, and how a response's
handle is completed.

An operation executes agreed responses of one kind (every rank runs the same responses in
the same order, so the collectives here match up across ranks without further messages).
``execute(items)`` takes ``(response, request)`` pairs; the request is None on a rank that
takes part without a request of its own (it joined).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dlcomm.engine.fusion import FusionBuffer
from dlcomm.engine.negotiation import Response
from dlcomm.engine.process_sets import ProcessSetState
from dlcomm.engine.request import Request
from dlcomm.errors import PeerLostError

Item = tuple[Response, "Request | None"]


@dataclass
class EngineState:
    """What the operations of one engine read and share (the executor owns it)."""

    rank: int
    process_sets: dict[int, ProcessSetState]
    timeline: Any  # dlcomm.engine.timeline.Timeline or NullTimeline
    fusion_threshold: int  # bytes; changed at run time by set_tunables
    buffers: FusionBuffer = field(default_factory=FusionBuffer)

    def process_set(self, response: Response) -> ProcessSetState:
        return self.process_sets[response.process_set_id]


class Operation:
    """One collective family. ``batched`` operations get every ready response of a cycle at
    once, after the others (all-reduces, whose fusion spans the whole cycle)."""

    batched = False

    def execute(self, items: Sequence[Item]) -> None:
        raise NotImplementedError


class PerResponse(Operation):
    """An operation that runs each response on its own and returns its result.

    A failure completes the request's handle with the error and the engine keeps serving
    others; on a rank without a request (joined) it is raised to the engine.
    """

    def execute(self, items: Sequence[Item]) -> None:
        for response, request in items:
            try:
                result = self.run(response, request)
            except Exception as exc:
                if request is None or isinstance(exc, PeerLostError):  # the job is broken
                    raise
                request.handle.set_error(exc)
                continue
            if request is not None:
                request.handle.set_result(result)

    def run(self, response: Response, request: Request | None) -> Any:
        raise NotImplementedError
