"""Hierarchical all-reduce: reduce inside each host, all-reduce among host leaders, broadcast.

Only one rank per host (its leader) talks over the network, so the slow inter-host link
carries ``hosts`` participants instead of ``p``, while the fast shared-memory links inside
a host take the reduce and broadcast. Hosts are the ranks that share memory
(``comm.split_by_host``); the sub-communicators are built once per parent communicator and
cached on it (``comm.cached``), so they are freed with the parent.

16-bit buffers (float16, and bfloat16 carried as uint16 bit patterns when the caller says
so) are summed in float32 by default (``hierarchical_fp32_accumulation``): the reduce inside
a host adds in float32, the leaders' ring sends 16-bit blocks but adds them into a float32
accumulator, and the result is rounded to 16 bits once before the broadcast. The inter-host
messages stay 16-bit, so the network carries the same bytes as the 16-bit path.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable

import numpy as np

from dlcomm.collectives.buffers import (
    CommLike,
    check_comm,
    check_send_recv_pair,
    is_same_buffer,
    raise_collective_errors,
)
from dlcomm.collectives.cost_model import (
    CostModel,
    cache_directory,
    measured_model,
    topology_key,
    wait_mode_of,
)
from dlcomm.collectives.halving_doubling import rhd_allreduce
from dlcomm.collectives.mpi_allreduce import mpi_allreduce
from dlcomm.collectives.reduction import reduction_ufunc
from dlcomm.collectives.ring import ring_allreduce
from dlcomm.collectives.tree import (
    binomial_broadcast_inplace,
    binomial_reduce_inplace,
    tree_allreduce,
)
from dlcomm.collectives.widening import (
    Widening,
    widened_binomial_reduce,
    widened_rhd_allreduce,
    widened_ring_allreduce,
)
from dlcomm.comm.mpi_backend import NULL
from dlcomm.config import knob_value
from dlcomm.ops import ReduceOp

# Flat algorithms the host leaders may run among themselves.
LEADER_ALGORITHMS: dict[str, Callable[..., np.ndarray]] = {
    "mpi": mpi_allreduce,
    "ring": ring_allreduce,
    "rhd": rhd_allreduce,
    "tree": tree_allreduce,
}
# ``auto``: ``ring`` or ``rhd`` for each message size, from a cost model the leaders measure
# among themselves (or read from the all-reduce model cache) when the instance is built.
AUTO_LEADER_ALGORITHM = "auto"
AUTO_LEADER_CANDIDATES = ("ring", "rhd")
DEFAULT_LEADER_ALGORITHM = AUTO_LEADER_ALGORITHM
# Leader algorithms that add 16-bit messages into a float32 accumulator; with the others a
# widened reduction rounds the host's sum once and the leaders reduce in 16 bits.
WIDENED_LEADER_ALGORITHMS: dict[str, Callable[..., None]] = {
    "ring": widened_ring_allreduce,
    "rhd": widened_rhd_allreduce,
}
LEADER_ALGORITHM_ENV = "DLCOMM_HIERARCHICAL_LEADER_ALGORITHM"
RANKS_PER_HOST_ENV = "DLCOMM_HIERARCHICAL_RANKS_PER_HOST"
FP32_ACCUMULATION_KNOB = "hierarchical_fp32_accumulation"  # DLCOMM_HIERARCHICAL_FP32_ACCUMULATION
# Reductions whose result a 16-bit accumulator rounds at every step; min and max are exact
# in any precision, so float16 min/max keep the 16-bit path (half the bytes in the host).
_ROUNDING_UFUNCS = (np.add, np.multiply)


def _check_leader_algorithm(name: object) -> str:
    """Require one of the flat algorithm names (``native``: the earlier name of ``mpi``)."""
    key = name.strip().lower() if isinstance(name, str) else name
    key = "mpi" if key == "native" else key
    if key not in LEADER_ALGORITHMS and key != AUTO_LEADER_ALGORITHM:
        valid = ", ".join([AUTO_LEADER_ALGORITHM, *LEADER_ALGORITHMS])
        raise ValueError(f"unknown hierarchical_leader_algorithm {name!r}; valid: {valid}")
    return key


def _check_ranks_per_host(value: object) -> int | None:
    """Require ``None`` or 0 (use the shared-memory split) or a positive integer."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"hierarchical_ranks_per_host must be a positive integer, or 0/None for the "
            f"shared-memory split, got {value!r}"
        )
    return int(value) or None


class HierarchicalAllreduce:
    """A host-aware all-reduce over one parent communicator, with its sub-communicators.

    Constructing it is collective over ``comm`` (it splits the communicator twice); call
    it like the flat algorithms: ``h(sendbuf, recvbuf, op)``.
    ``hierarchical_leader_algorithm`` is the flat algorithm among leaders, or ``auto``
    (default): ``ring`` or ``rhd`` chosen per message size by a cost model the leaders
    measure among themselves when this is built (read from the file cache of ``auto``'s
    models when one is there; with one or two hosts the two exchange the same messages and
    ``ring`` is used without measuring);
    ``hierarchical_ranks_per_host`` replaces the shared-memory split by groups of that many
    consecutive ranks (0 or None: no override), which lets a single machine, where every
    rank shares memory, exercise the multi-host path.

    ``hierarchical_fp32_accumulation`` (default True) sums and multiplies float16 buffers in
    float32: the host's ranks reduce into a float32 buffer, the leaders' ring adds each
    16-bit block it receives into a float32 accumulator, and the result is rounded to 16
    bits once, before the broadcast. Rounding then happens once per inter-host hop and at
    the end, instead of after every addition, so the error no longer grows with the ranks
    per host. The network carries the same 16-bit bytes; the costs are a float32 copy of
    the buffer (twice its bytes) and a float32 receive scratch on every rank that receives
    inside its host (and on the leaders), a cast of each element in and out, and float32
    partial sums (twice the bytes) on the shared-memory messages of ranks that forward
    one (a rank that only sends its own input sends it in 16 bits). The ``rhd`` leaders
    accumulate in float32 the same way; with ``tree`` or ``mpi`` the host's float32 sum is
    rounded once and the leaders reduce in float16. False: every step reduces in float16,
    as before. float32/float64 and integer buffers, and min/max, are never affected.
    Argument names match the ``DLCOMM_HIERARCHICAL_*`` knobs; the constructor itself does
    not read the environment.
    """

    def __init__(
        self,
        comm: CommLike,
        *,
        hierarchical_leader_algorithm: str = DEFAULT_LEADER_ALGORITHM,
        hierarchical_ranks_per_host: int | None = None,
        hierarchical_fp32_accumulation: bool = True,
    ) -> None:
        self.comm = check_comm(comm)
        if not isinstance(hierarchical_fp32_accumulation, (bool, np.bool_)):
            raise TypeError(f"hierarchical_fp32_accumulation must be True or False, got "
                            f"{hierarchical_fp32_accumulation!r}")
        self.fp32_accumulation = bool(hierarchical_fp32_accumulation)
        self.leader_algorithm = _check_leader_algorithm(hierarchical_leader_algorithm)
        self.ranks_per_host = _check_ranks_per_host(hierarchical_ranks_per_host)
        comm = self.comm
        rank = comm.rank
        if self.ranks_per_host is None:
            self.local_comm = comm.split_by_host(key=rank)
        else:
            self.local_comm = comm.split(rank // self.ranks_per_host, key=rank)
        self.is_leader = self.local_comm.rank == 0
        self.leader_comm = comm.split(0 if self.is_leader else None, key=rank) or NULL
        # Every rank learns the host count, so all ranks can report the same topology.
        self.host_count = sum(comm.allgather(1 if self.is_leader else 0))
        self.leader_model: CostModel | None = None
        if self.leader_algorithm == AUTO_LEADER_ALGORITHM and self.host_count > 2:
            model = _measure_leaders(self.leader_comm) if self.is_leader else None
            # Every rank holds the leaders' model, so every rank can say what they will run.
            data = self.local_comm.bcast_object(None if model is None else model.to_json())
            self.leader_model = CostModel.from_json(data)

    def leader_algorithm_for(self, nbytes: int) -> str:
        """The flat algorithm the leaders run on a message of ``nbytes`` (the same on every
        leader: they share one cost model)."""
        if self.leader_algorithm != AUTO_LEADER_ALGORITHM:
            return self.leader_algorithm
        if self.leader_model is None:  # one or two hosts: ring and rhd send the same
            return "ring"
        return self.leader_model.choose(nbytes)

    def __call__(
        self,
        sendbuf: np.ndarray,
        recvbuf: np.ndarray,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        bfloat16: bool = False,
    ) -> np.ndarray:
        """All-reduce ``sendbuf`` into ``recvbuf`` over the parent communicator; see module."""
        return self.allreduce(sendbuf, recvbuf, op, bfloat16=bfloat16)

    @raise_collective_errors
    def allreduce(
        self,
        sendbuf: np.ndarray,
        recvbuf: np.ndarray,
        op: ReduceOp | str = ReduceOp.SUM,
        *,
        bfloat16: bool = False,
    ) -> np.ndarray:
        """Reduce to the host leader, all-reduce among leaders, broadcast from the leader.

        Buffers are contiguous 1-D numpy arrays of equal size and dtype on every rank;
        ``sendbuf is recvbuf`` reduces in place. ``bfloat16=True`` says that uint16 buffers
        hold bfloat16 bit patterns (``dlcomm.bfloat16``): they are then reduced as numbers,
        always in float32 (numpy has no bfloat16 arithmetic), with 16-bit messages; it needs
        the ``ring`` or ``rhd`` leader algorithm when there are several hosts. Returns
        ``recvbuf``.
        """
        if self.local_comm.freed:
            raise ValueError("this HierarchicalAllreduce was freed; build a new one")
        ufunc = reduction_ufunc(op)
        send, recv = check_send_recv_pair(sendbuf, recvbuf)
        widening = self._widening(send.dtype, ufunc, bfloat16)
        if widening is not None:
            accumulator = widened_binomial_reduce(self.local_comm, send, ufunc, widening)
            if self.is_leader:
                name = self.leader_algorithm_for(recv.nbytes)
                widened = WIDENED_LEADER_ALGORITHMS.get(name)
                if widened is not None:
                    widened(self.leader_comm, accumulator, recv, ufunc, widening)
                else:
                    widening.narrow(accumulator, recv)
                    LEADER_ALGORITHMS[name](self.leader_comm, recv, recv, op)
            binomial_broadcast_inplace(self.local_comm, recv, 0)
            return recv
        if not is_same_buffer(send, recv):
            np.copyto(recv, send)
        binomial_reduce_inplace(self.local_comm, recv, ufunc, 0)
        if self.is_leader:
            LEADER_ALGORITHMS[self.leader_algorithm_for(recv.nbytes)](
                self.leader_comm, recv, recv, op)
        binomial_broadcast_inplace(self.local_comm, recv, 0)
        return recv

    def _widening(self, dtype: np.dtype, ufunc: np.ufunc, bfloat16: bool) -> Widening | None:
        """The float32 accumulation for this call, or None for the reduction in ``dtype``."""
        if bfloat16:
            if dtype != np.uint16:
                raise TypeError(f"bfloat16=True needs uint16 bfloat16 bit patterns, got {dtype}")
            if (self.leader_algorithm not in (AUTO_LEADER_ALGORITHM, *WIDENED_LEADER_ALGORITHMS)
                    and self.host_count > 1):
                raise ValueError(
                    f"bfloat16 buffers need hierarchical_leader_algorithm 'auto', 'ring' or "
                    f"'rhd' among several hosts (got {self.leader_algorithm!r}): the others "
                    "would add bit patterns as integers"
                )
            return Widening(np.dtype(np.uint16))
        if dtype == np.float16 and self.fp32_accumulation and ufunc in _ROUNDING_UFUNCS:
            return Widening(np.dtype(np.float16))
        return None

    def free(self) -> None:
        """Free the sub-communicators (collective over the parent's ranks); idempotent."""
        for name in ("leader_comm", "local_comm"):
            getattr(self, name).free()
            setattr(self, name, NULL)

    def __repr__(self) -> str:
        return (
            f"HierarchicalAllreduce(size={self.comm.size}, hosts={self.host_count}, "
            f"leader_algorithm={self.leader_algorithm!r}, ranks_per_host={self.ranks_per_host}, "
            f"fp32_accumulation={self.fp32_accumulation})"
        )


def _measure_leaders(leader_comm: CommLike) -> CostModel:
    """The ring/rhd cost model among the host leaders (collective over ``leader_comm``),
    cached like ``auto``'s models (``DLCOMM_ALLREDUCE_MODEL_CACHE``)."""
    hosts = leader_comm.allgather(socket.gethostname())
    key = topology_key(hosts, AUTO_LEADER_CANDIDATES, 0, os.environ.get("DLCOMM_EMULATE", ""),
                       wait_mode_of(leader_comm))
    functions = {name: LEADER_ALGORITHMS[name] for name in AUTO_LEADER_CANDIDATES}
    model, _ = measured_model(leader_comm, functions, key, cache_directory())
    return model


def cached_hierarchical_allreduce(
    comm: CommLike,
    *,
    hierarchical_leader_algorithm: str | None = None,
    hierarchical_ranks_per_host: int | None = None,
    hierarchical_fp32_accumulation: bool | None = None,
) -> HierarchicalAllreduce:
    """The ``HierarchicalAllreduce`` for ``comm`` and these settings, built on first use.

    Collective over ``comm`` on the first call for a given setting. Settings left as
    ``None`` come from ``DLCOMM_HIERARCHICAL_LEADER_ALGORITHM`` (default ``auto``: ring or
    rhd by size), ``DLCOMM_HIERARCHICAL_RANKS_PER_HOST`` (default 0: the shared-memory split) and
    ``DLCOMM_HIERARCHICAL_FP32_ACCUMULATION`` (default 1).
    """
    comm = check_comm(comm)
    leader_algorithm = hierarchical_leader_algorithm
    if leader_algorithm is None:
        leader_algorithm = os.environ.get(LEADER_ALGORITHM_ENV, "").strip()
        leader_algorithm = leader_algorithm or DEFAULT_LEADER_ALGORITHM
    leader_algorithm = _check_leader_algorithm(leader_algorithm)
    ranks_per_host = hierarchical_ranks_per_host
    if ranks_per_host is None and os.environ.get(RANKS_PER_HOST_ENV, "").strip():
        text = os.environ[RANKS_PER_HOST_ENV].strip()
        if not text.isdigit():
            raise ValueError(
                f"{RANKS_PER_HOST_ENV}={text!r} must be a non-negative integer (0: no override)"
            )
        ranks_per_host = int(text)
    ranks_per_host = _check_ranks_per_host(ranks_per_host)
    fp32_accumulation = knob_value(FP32_ACCUMULATION_KNOB, hierarchical_fp32_accumulation)
    return comm.cached(
        (HierarchicalAllreduce, leader_algorithm, ranks_per_host, fp32_accumulation),
        lambda: HierarchicalAllreduce(
            comm,
            hierarchical_leader_algorithm=leader_algorithm,
            hierarchical_ranks_per_host=ranks_per_host,
            hierarchical_fp32_accumulation=fp32_accumulation,
        ),
    )


def hierarchical_allreduce(
    comm: CommLike,
    sendbuf: np.ndarray,
    recvbuf: np.ndarray,
    op: ReduceOp | str = ReduceOp.SUM,
    *,
    bfloat16: bool = False,
) -> np.ndarray:
    """All-reduce through the cached ``HierarchicalAllreduce`` of ``comm`` (settings from env).

    Same contract as the flat algorithms (``bfloat16``: see ``HierarchicalAllreduce.allreduce``);
    the first call on a communicator is where the sub-communicators are built. Returns
    ``recvbuf``.
    """
    return cached_hierarchical_allreduce(comm)(sendbuf, recvbuf, op, bfloat16=bfloat16)
