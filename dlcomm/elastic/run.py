"""``@elastic.run``: run a training function until it returns, re-forming the job each time
a rank is lost (``PeerLostError``) or the driver changes the hosts
(``HostsUpdatedInterrupt``), with the state rolled back to its last commit."""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dlcomm import basics, mpi_ops, runtime
from dlcomm.elastic.state import State
from dlcomm.errors import HostsUpdatedInterrupt, PeerLostError

log = logging.getLogger("dlcomm")
F = TypeVar("F", bound=Callable[..., Any])


def reset() -> None:
    """Leave the current round and join the driver's next one (``shutdown`` + ``init`` with
    the settings of the first ``init``)."""
    settings = basics.init_settings()
    basics.shutdown()
    mpi_ops.reset_auto_names()
    basics.init(**settings)


def run(func: F) -> F:
    """Decorate ``func(state, ...)``, the training loop, so that it survives lost and added
    workers: the state is synchronised from a survivor before ``func`` starts, and after a
    failure every survivor rolls back to its last ``state.commit()``, re-forms the job with
    the workers the driver keeps, and calls ``func`` again. Outside an elastic job (plain
    ``dlcommrun``/mpirun) it syncs once and runs ``func`` without recovery."""
    if not callable(func):
        raise TypeError(f"elastic.run decorates a function, got {func!r}")

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"the first argument of an elastic.run function must be a "
                            f"dlcomm elastic State, got {type(state).__name__}")
        elastic = runtime.state().elastic is not None
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as exc:
                if not elastic:
                    raise
                skip_sync = exc.skip_sync
            except Exception as exc:
                lost = _lost_peer(exc)
                if not elastic or lost is None:
                    raise
                log.warning("dlcomm elastic: %s; rolling back to the last commit (number %d)",
                            lost, state.commits)
                state.restore()
                skip_sync = False
            _reform(state)

    return wrapper  # type: ignore[return-value]


def _lost_peer(exc: Exception) -> PeerLostError | None:
    """The ``PeerLostError`` behind ``exc``: itself, or the one the engine stopped with when a
    framework wrapped it into its own error (TensorFlow's graph functions raise an
    ``UnknownError`` carrying only its text); None for any other failure."""
    if isinstance(exc, PeerLostError):
        return exc
    error = runtime.state().engine.error if runtime.is_initialized() else None
    return error if isinstance(error, PeerLostError) else None


def _reform(state: State) -> None:
    """Join the next round (again, if a member is lost while it forms), then ``on_reset``."""
    started = time.monotonic()
    while True:
        try:
            reset()
            break
        except PeerLostError as exc:
            log.warning("dlcomm elastic: the next round lost a member while it formed (%s); "
                        "joining the one after", exc)
    log.info("dlcomm elastic: rank %d of %d after %.1f s", basics.rank(), basics.size(),
             time.monotonic() - started)
    state.on_reset()
