"""The engine's operations, one module per collective family, found by request kind.

As in Horovod's operation manager, the executor looks each agreed response up in the table
``build_operations`` returns (``operation_name``: the request kind, with compressed
all-reduces apart from dense ones) and hands it over; the operation does the rest.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.allgather import Allgather
from dlcomm.engine.operations.allreduce import DenseAllreduce
from dlcomm.engine.operations.alltoall import Alltoall
from dlcomm.engine.operations.base import EngineState, Operation
from dlcomm.engine.operations.broadcast import Broadcast
from dlcomm.engine.operations.compressed_allreduce import CompressedAllreduce
from dlcomm.engine.operations.control import Barrier, EngineAction, Join
from dlcomm.engine.operations.reducescatter import Reducescatter
from dlcomm.engine.request import Kind, Request

COMPRESSED_ALLREDUCE = "compressed_allreduce"


def operation_name(response: Response) -> str:
    """The table entry that executes ``response``."""
    if response.kind is Kind.ALLREDUCE and response.reference.compression != "none":
        return COMPRESSED_ALLREDUCE
    return response.kind.value


def build_operations(
    state: EngineState,
    engine_actions: dict[Kind, Callable[[Response, Request | None], Any]],
) -> dict[str, Operation]:
    """Every operation of one engine; ``engine_actions`` are the engine's own handlers of
    ``add_process_set``, ``remove_process_set`` and ``set_tunables``."""
    table: dict[str, Operation] = {
        Kind.ALLREDUCE.value: DenseAllreduce(state),
        COMPRESSED_ALLREDUCE: CompressedAllreduce(state),
        Kind.ALLGATHER.value: Allgather(state),
        Kind.BROADCAST.value: Broadcast(state),
        Kind.ALLTOALL.value: Alltoall(state),
        Kind.REDUCESCATTER.value: Reducescatter(state),
        Kind.BARRIER.value: Barrier(),
        Kind.JOIN.value: Join(),
    }
    for kind, action in engine_actions.items():
        table[kind.value] = EngineAction(action)
    return table
