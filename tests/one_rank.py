"""``dlcomm.init()`` on the pytest process itself: one rank (an MPI singleton, not an
elastic job), for unit tests of code that needs a running dlcomm but no peers."""
from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import dlcomm
from dlcomm import runtime
from dlcomm.comm.rendezvous import RENDEZVOUS_ENV, WORKER_ENV
from dlcomm.launcher.dlcommrun import without_enclosing_mpi_job


@contextlib.contextmanager
def one_rank_dlcomm() -> Iterator[None]:
    """dlcomm initialised on this process alone inside the block, shut down after it."""
    saved = {k: os.environ.pop(k) for k in (RENDEZVOUS_ENV, WORKER_ENV) if k in os.environ}
    started = not dlcomm.is_initialized()
    dlcomm.init()
    try:
        assert dlcomm.size() == 1 and dlcomm.rank() == 0
        assert runtime.state().elastic is None
        yield
    finally:
        if started:
            dlcomm.shutdown()
            _drop_singleton_variables()
        os.environ.update(saved)


def _drop_singleton_variables() -> None:
    """MPI_Init as a singleton puts its PMIx/ORTE variables in the C environment (not in
    ``os.environ``); a later test's subprocess started without ``env=`` would inherit them
    and take itself for a member of this process's MPI job. Remove them."""
    out = subprocess.run(["env", "-0"], capture_output=True, check=True, timeout=30).stdout
    names = {entry.partition(b"=")[0].decode(errors="replace")
             for entry in out.split(b"\0") if entry}
    kept = without_enclosing_mpi_job(dict.fromkeys(names, ""))
    for name in names - set(kept) - set(os.environ):
        os.unsetenv(name)
