"""Process-level calls: ``init``, ``shutdown``, ranks and sizes, process sets."""
from __future__ import annotations

import atexit
import itertools
import logging
from collections.abc import Sequence
from typing import Any

from dlcomm import runtime
from dlcomm.comm.backend_select import nccl_available, nccl_version
from dlcomm.config import load_config
from dlcomm.engine.request import Kind, Request, Signature
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.runtime import is_initialized, state

__all__ = ["add_process_set", "bytes_sent", "ccl_built", "cross_rank", "cross_size",
           "cuda_built", "ddl_built", "gloo_built", "gloo_enabled", "init", "is_homogeneous",
           "is_initialized", "local_rank", "local_size", "mpi_built", "mpi_enabled",
           "mpi_threads_supported", "nccl_built", "rank", "remove_process_set", "rocm_built",
           "shutdown", "size", "start_timeline", "state", "stop_timeline"]


_set_requests = itertools.count()  # names add_process_set requests (same order on all ranks)
_init_settings: dict[str, Any] = {}  # the settings of the last init() (elastic re-init)


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | None = None,
         **settings: Any) -> None:
    """Start dlcomm on this process; every rank must call it.

    ``comm`` is an mpi4py communicator or a list of world ranks to run on (default: all).
    ``settings`` override ``DLCOMM_*`` knobs by name (``fusion_threshold=...``), see
    ``docs/knobs.md``. Calling ``init`` again while initialised does nothing.
    """
    if is_initialized():
        return
    config = load_config(**settings)
    _init_settings.clear()
    _init_settings.update(settings)
    _start_logging(config.log_level)
    # Importing mpi4py.MPI initialises MPI, so the transport loads here and not at
    # `import dlcomm`: a process that only launches jobs (dlcommrun) must not become an MPI
    # process. The engine imports the transport too.
    from dlcomm.comm.world import open_world  # noqa: PLC0415 - MPI start-up
    from dlcomm.engine.engine import Engine  # noqa: PLC0415 - MPI start-up

    world = open_world(comm, dead_peer_s=config.elastic_dead_peer_seconds)
    rank, size = world.comm.rank, world.comm.size
    global_process_set.ranks = list(range(size))
    runtime.start(runtime.State(
        config=config, engine=Engine(config, world.comm), comm=world.comm, rank=rank,
        size=size, local_rank=world.local_rank, local_size=world.local_size,
        cross_rank=world.cross_rank, cross_size=world.cross_size,
        process_sets={0: global_process_set}, mpi_threads=world.threads_multiple,
        elastic=world.elastic,
    ))
    atexit.register(shutdown)
    for ps in process_sets or ():
        add_process_set(ps)


def init_settings() -> dict[str, Any]:
    """The keyword settings the last ``init()`` was given (an elastic job re-initialises
    with them)."""
    return dict(_init_settings)


def shutdown() -> None:
    """Stop dlcomm on this process; pending requests on other ranks fail with a clear error."""
    stopped = runtime.stop()
    if stopped is None:
        return
    stopped.engine.shutdown()
    if stopped.elastic is not None:  # the world's TCP mesh is this process's own
        stopped.comm.free()
    for set_id, ps in stopped.process_sets.items():
        if set_id != 0:
            ps.process_set_id = None


def rank() -> int:
    """This process's rank among all ranks."""
    return state().rank


def size() -> int:
    """Number of ranks."""
    return state().size


def local_rank() -> int:
    """Rank among the processes on this host."""
    return state().local_rank


def local_size() -> int:
    """Number of processes on this host."""
    return state().local_size


def cross_rank() -> int:
    """Rank among the processes with the same local rank (the host's index)."""
    return state().cross_rank


def cross_size() -> int:
    """Number of processes with the same local rank (the number of hosts, if uniform)."""
    return state().cross_size


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    s = state()
    return s.local_size * s.cross_size == s.size


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    return state().mpi_threads


# --- what this build has (Horovod's *_built/*_enabled family; callable before init) -----
def mpi_enabled() -> bool:
    """True: MPI is dlcomm's controller and host data path (always, at run time)."""
    return True


def mpi_built() -> bool:
    """True: dlcomm always runs on MPI (mpi4py)."""
    return True


def gloo_enabled() -> bool:
    """False: dlcomm has no Gloo controller (``dlcommrun`` starts jobs with ``mpirun``)."""
    return False


def gloo_built() -> bool:
    """False: dlcomm is not built with Gloo."""
    return False


def nccl_built() -> int:
    """NCCL's version code when CuPy's NCCL bindings import and a GPU is visible (the GPU data
    path), else 0, as Horovod returns ``NCCL_VERSION_CODE`` or 0."""
    return nccl_version()


def cuda_built() -> bool:
    """True when the CUDA data path (CuPy with NCCL on a visible GPU) is available."""
    return nccl_available()


def rocm_built() -> bool:
    """False: dlcomm has no ROCm data path."""
    return False


def ddl_built() -> bool:
    """False: dlcomm has no IBM DDL backend."""
    return False


def ccl_built() -> bool:
    """False: dlcomm has no oneCCL backend."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Write the engine's timeline (Chrome trace JSON) to ``file_path`` from now on, as
    ``DLCOMM_TIMELINE`` does from ``init()`` ('{rank}' in the path: one file per rank, else
    rank 0 writes); ``mark_cycles`` marks each negotiation round with work."""
    if not isinstance(file_path, str) or not file_path:
        raise TypeError(f"file_path must be a non-empty str, got {file_path!r}")
    if not is_initialized():
        raise ValueError("dlcomm has not been initialized; call init() first")
    st = state()
    path = file_path if "{rank}" in file_path or st.rank == 0 else None
    st.engine.set_timeline(path, bool(mark_cycles))


def stop_timeline() -> None:
    """Close the timeline started by ``start_timeline`` (or ``DLCOMM_TIMELINE``)."""
    if not is_initialized():
        raise ValueError("dlcomm has not been initialized; call init() first")
    state().engine.set_timeline(None, False)


def bytes_sent() -> int:
    """Payload bytes this rank has contributed to collectives since ``init()``."""
    return state().engine.bytes_sent


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set; a collective call on every rank, in the same order."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise ValueError("a process set needs its ranks")
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set!r} is already registered")
    s = state()
    bad = [r for r in process_set.ranks if not 0 <= r < s.size]
    if bad:
        raise ValueError(f"process set ranks {bad} are outside [0, {s.size})")
    if not process_set.ranks:
        raise ValueError("a process set needs at least one rank")
    name = f"add_process_set.{process_set.ranks}.{next(_set_requests)}"
    req = Request(name, Signature(Kind.ADD_PROCESS_SET, 0, extra=tuple(process_set.ranks)))
    set_id = s.engine.submit(req).wait()
    process_set.process_set_id = set_id
    s.process_sets[set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set (collective on every rank); False if it was not registered."""
    s = state()
    set_id = process_set.process_set_id
    if set_id in (None, 0) or set_id not in s.process_sets:
        return False
    req = Request(f"remove_process_set.{set_id}",
                  Signature(Kind.REMOVE_PROCESS_SET, 0, extra=set_id))
    s.engine.submit(req).wait()
    del s.process_sets[set_id]
    process_set.process_set_id = None
    return True


def _start_logging(level: str) -> None:
    """Set the 'dlcomm' logger's level (``DLCOMM_LOG_LEVEL``) and, when neither it nor the
    root logger has a handler (the application configured no logging), print its records to
    stderr, so that ``DLCOMM_LOG_LEVEL=info`` shows INFO records as Horovod's
    ``HOROVOD_LOG_LEVEL`` does (Python's last-resort handler prints WARNING and above only)."""
    logger = logging.getLogger("dlcomm")
    logger.setLevel(level.upper())
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("dlcomm %(levelname)s: %(message)s"))
        logger.addHandler(handler)
