"""The running dlcomm of this process: what ``init()`` started, until ``shutdown()``.

Apart from ``basics`` so that the modules ``basics`` builds on (process sets) can ask for the
running rank without importing ``basics`` back.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from dlcomm.config import Config
from dlcomm.errors import ShutdownError


@dataclasses.dataclass
class State:
    """One ``init()``: its settings, engine, communicator and where this rank sits."""

    config: Config
    engine: Any  # dlcomm.engine.engine.Engine (imported in init: it loads MPI)
    comm: Any  # the transport communicator dlcomm was started on (dlcomm.comm)
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    process_sets: dict[int, Any]  # set id -> dlcomm.ProcessSet
    mpi_threads: bool
    elastic: Any = None  # dlcomm.comm.world.Elastic in a job of the elastic driver


_current: State | None = None


def start(state: State) -> None:
    """Make ``state`` the running one (``init``)."""
    global _current
    _current = state


def stop() -> State | None:
    """Forget the running state and return it (``shutdown``); None when not running."""
    global _current
    state, _current = _current, None
    return state


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return _current is not None


def state() -> State:
    """The running state; raises ``ShutdownError`` before ``init()``."""
    if _current is None:
        raise ShutdownError("dlcomm is not initialized: call dlcomm.init() first")
    return _current
