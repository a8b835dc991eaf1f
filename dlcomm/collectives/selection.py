"""``auto`` and ``fastest``: the all-reduce algorithm chosen per message size from a cost model
measured on the communicator at its first all-reduce.

At first use the ranks time every candidate algorithm on a few probe sizes and every rank
gets the same ``CostModel`` (``cost_model.measured_model``), so every rank picks the same
algorithm for every message (a disagreement would mismatch their messages). The model is
cached on the communicator and, by rank 0, in a file named after the topology (rank count,
every rank's host, the emulated network) in ``DLCOMM_ALLREDUCE_MODEL_CACHE``, so later jobs
on the same machines skip the measurement.

- ``auto`` (the default) chooses among ``ordered``, ``pipelined`` and ``ordered_tcp`` (the
  ordered messages over the TCP mesh), which give the same bits (every element reduced in
  rank order): the choice changes the time, never the model.
- ``fastest`` also considers ``mpi``, ``ring``, ``rhd`` and, across several hosts,
  ``hierarchical``, whose results depend on the message size and on where a tensor sits in
  a fused buffer: with 3 or more ranks, schedules and fusion thresholds then no longer give
  bit-identical models (docs/collectives.md).
- Where some machine runs more ranks than it has cores and the ranks span several hosts,
  ``auto`` keeps only its candidate over the TCP mesh (when it connects): idle ranks cannot
  show what MPI's waits cost busy ones.

"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

import numpy as np

from dlcomm.collectives.allgather import mesh_allgather
from dlcomm.collectives.buffers import CommLike, check_comm, check_send_recv_pair
from dlcomm.collectives.cost_model import (
    Algorithm,
    CostModel,
    cache_directory,
    measured_model,
    topology_key,
    wait_mode_of,
)
from dlcomm.collectives.halving_doubling import rhd_allreduce
from dlcomm.collectives.hierarchical import hierarchical_allreduce
from dlcomm.collectives.mpi_allreduce import mpi_allreduce
from dlcomm.collectives.ordered import (
    ordered_allreduce,
    ordered_reduce_scatter,
    ordered_tcp_allreduce,
    ordered_tcp_reduce_scatter,
)
from dlcomm.collectives.pipelined import (
    check_segment_bytes,
    pipelined_allreduce,
    segment_bytes_from_env,
)
from dlcomm.collectives.reduction import reduction_ufunc
from dlcomm.collectives.ring import ring_allreduce, ring_tcp_allreduce
from dlcomm.comm.machine import crowded_across_hosts
from dlcomm.comm.mesh_communicator import mesh_communicator
from dlcomm.ops import ReduceOp

DETERMINISTIC_CANDIDATES = ("ordered", "pipelined", "ordered_tcp")
MESH_CANDIDATES = ("ordered_tcp", "ring_tcp")  # their waits sleep in the kernel
ANY_CANDIDATES = ("ordered", "pipelined", "ordered_tcp", "mpi", "ring", "ring_tcp", "rhd",
                  "hierarchical")


def _candidate_functions(segment_bytes: int) -> dict[str, Algorithm]:
    def pipelined(comm: CommLike, send: np.ndarray, recv: np.ndarray,
                  op: ReduceOp | str) -> np.ndarray:
        return pipelined_allreduce(comm, send, recv, op,
                                   allreduce_segment_bytes=segment_bytes)

    return {"ordered": ordered_allreduce, "pipelined": pipelined,
            "ordered_tcp": ordered_tcp_allreduce, "mpi": mpi_allreduce,
            "ring": ring_allreduce, "ring_tcp": ring_tcp_allreduce, "rhd": rhd_allreduce,
            "hierarchical": hierarchical_allreduce}


class AutoAllreduce:
    """The per-size choice among ``candidates`` on one communicator, built collectively: from
    the file cache, or by measuring. Settings left None come from ``DLCOMM_ALLREDUCE_*``;
    call it like ``HierarchicalAllreduce``: ``auto(sendbuf, recvbuf, op)``."""

    def __init__(self, comm: CommLike, candidates: Sequence[str] = DETERMINISTIC_CANDIDATES,
                 *, allreduce_segment_bytes: int | None = None,
                 allreduce_model_cache: str | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.comm = check_comm(comm)
        environ = os.environ if environ is None else environ
        self.segment_bytes = (segment_bytes_from_env(environ) if allreduce_segment_bytes is None
                              else check_segment_bytes(allreduce_segment_bytes))
        functions = _candidate_functions(self.segment_bytes)
        hosts = self.comm.allgather(socket.gethostname())
        names = [c for c in candidates if c != "hierarchical"
                 or 1 < len(set(hosts)) < len(hosts)]  # it needs hosts with several ranks
        if (any(c in MESH_CANDIDATES for c in names)
                and mesh_communicator(self.comm, environ) is None):  # off, or not connected
            names = [c for c in names if c not in MESH_CANDIDATES]
        if set(names) <= set(DETERMINISTIC_CANDIDATES) and crowded_across_hosts(self.comm):
            # The probe runs on idle ranks. In training, ranks that share cores are busy: every
            # test of an MPI wait takes CPU from the rank being waited for, and between hosts
            # MPI moves bytes only inside those tests. The mesh's threads sleep in the kernel
            # until the bytes arrive (docs/collectives.md). Among candidates with the same
            # bits only the time changes; `fastest` measures all.
            names = [c for c in names if c in MESH_CANDIDATES] or names
        unknown = sorted(set(names) - set(functions))
        if unknown:
            raise ValueError(f"unknown candidate all-reduce(s) {unknown}")
        self.functions = {name: functions[name] for name in names}
        key = topology_key(hosts, names, self.segment_bytes, environ.get("DLCOMM_EMULATE", ""),
                           wait_mode_of(self.comm))
        self.model, self.measured = measured_model(
            self.comm, self.functions, key, cache_directory(allreduce_model_cache, environ))
        self._choices: dict[int, str] = {}

    def choose(self, nbytes: int) -> str:
        """The algorithm for a message of ``nbytes`` (the same on every rank)."""
        name = self._choices.get(nbytes)
        if name is None:
            if len(self._choices) > 4096:  # sizes of one training run repeat; others may not
                self._choices.clear()
            name = self._choices[nbytes] = self.model.choose(nbytes)
        return name

    def __call__(self, sendbuf: np.ndarray, recvbuf: np.ndarray,
                 op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
        """All-reduce with the algorithm chosen for this size; same contract as the flat
        algorithms (every rank must pass the same size, or ranks may pick different
        algorithms: the engine's negotiation guarantees it)."""
        reduction_ufunc(op)
        send, recv = check_send_recv_pair(sendbuf, recvbuf)
        return self.functions[self.choose(recv.nbytes)](self.comm, send, recv, op)


def cached_auto_allreduce(comm: CommLike, candidates: Sequence[str] = DETERMINISTIC_CANDIDATES
                          ) -> AutoAllreduce:
    """The ``AutoAllreduce`` of ``comm`` for ``candidates`` (settings from the environment),
    built on first use and cached on the communicator (collective the first time)."""
    comm = check_comm(comm)
    segment = segment_bytes_from_env()
    return comm.cached((AutoAllreduce, tuple(candidates), segment),
                       lambda: AutoAllreduce(comm, candidates, allreduce_segment_bytes=segment))


def _built_auto(comm: CommLike) -> AutoAllreduce | None:
    """The ``AutoAllreduce`` (``auto``'s or ``fastest``'s) already built on ``comm``, or
    None. Never collective."""
    comm = check_comm(comm)
    auto = comm.peek_cached((AutoAllreduce, DETERMINISTIC_CANDIDATES, segment_bytes_from_env()))
    if auto is None:
        auto = comm.peek_cached((AutoAllreduce, ANY_CANDIDATES, segment_bytes_from_env()))
    return auto


def built_model(comm: CommLike) -> CostModel | None:
    """The cost model ``auto`` measured (or read) for ``comm``, or None before its first
    all-reduce, or when another algorithm runs. Never collective."""
    auto = _built_auto(comm)
    return None if auto is None else auto.model


def auto_allreduce(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                   op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
    """All-reduce with ``ordered`` or ``pipelined``, whichever the cost model predicts faster
    for this size: ``ordered``'s bits either way. The first call on a communicator measures
    (or reads the cached model). Returns ``recvbuf``."""
    return _checked(comm, sendbuf, recvbuf, op, DETERMINISTIC_CANDIDATES)


def _over_mesh(comm: CommLike, nbytes: int) -> bool:
    """Whether ``auto``'s cost model sends an all-reduce of ``nbytes`` over the TCP mesh on
    ``comm``: the model ``auto`` built there, else built now (collective, as the first
    all-reduce would; every rank holds the same model, so all choose alike)."""
    auto = _built_auto(comm) or cached_auto_allreduce(comm)
    return auto.choose(nbytes) in MESH_CANDIDATES  # its per-size choices are cached


def auto_reduce_scatter(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                        counts: Sequence[int], op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
    """``auto``'s reduce-scatter: rank-order bits like its all-reduce, over the TCP mesh
    where the cost model sends an all-reduce of the same bytes there, else over MPI.
    Returns ``recvbuf``."""
    if _over_mesh(comm, int(np.asarray(sendbuf).nbytes)):
        return ordered_tcp_reduce_scatter(comm, sendbuf, recvbuf, counts, op)
    return ordered_reduce_scatter(comm, sendbuf, recvbuf, counts, op)


def auto_allgather(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                   counts: Sequence[int]) -> np.ndarray:
    """``auto``'s all-gather: over the TCP mesh where the cost model sends an all-reduce of
    the gathered bytes there (the all-reduce this all-gather is the second half of), else
    MPI's own. Exact either way. Returns ``recvbuf``."""
    comm = check_comm(comm)
    if _over_mesh(comm, int(np.asarray(recvbuf).nbytes)):
        return mesh_allgather(comm, sendbuf, recvbuf, counts)
    comm.allgatherv(sendbuf, recvbuf, list(counts))
    return recvbuf


def fastest_allreduce(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray,
                      op: ReduceOp | str = ReduceOp.SUM) -> np.ndarray:
    """All-reduce with whichever algorithm the cost model predicts fastest for this size,
    ``mpi``, ``ring``, ``rhd`` and ``hierarchical`` included: results equal to float
    tolerance, not bit for bit across sizes and fusions. Returns ``recvbuf``."""
    return _checked(comm, sendbuf, recvbuf, op, ANY_CANDIDATES)


def _checked(comm: CommLike, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp | str,
             candidates: Sequence[str]) -> np.ndarray:
    """Arguments checked before the first call's collective measurement can start."""
    comm = check_comm(comm)
    reduction_ufunc(op)
    check_send_recv_pair(sendbuf, recvbuf)
    return cached_auto_allreduce(comm, candidates)(sendbuf, recvbuf, op)
