"""Requests that move no tensor: barrier, join, process sets and tunables.

A barrier completes once every member reached it (negotiation already waited for them); a
join returns the rank that joined last. Adding and removing process sets and changing
tunables change the engine's own state, so the engine passes those actions in.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import PerResponse
from dlcomm.engine.request import Request


class Barrier(PerResponse):
    def run(self, response: Response, request: Request | None) -> None:
        return None


class Join(PerResponse):
    def run(self, response: Response, request: Request | None) -> int:
        return response.last_joined


class EngineAction(PerResponse):
    """Runs ``action(response, request)``, an engine method, on every member in order."""

    def __init__(self, action: Callable[[Response, Request | None], Any]) -> None:
        self.action = action

    def run(self, response: Response, request: Request | None) -> Any:
        return self.action(response, request)
