"""Hosts for compressed exchange: which ranks share a host, and the two sub-communicators
that rounds over a HOST or PEER group (``Compressor.groups``) run on.

A host is the ranks that share memory (``comm.split_by_host``) or, with
``DLCOMM_HIERARCHICAL_RANKS_PER_HOST=n`` (``hierarchical_ranks_per_host``, the knob of the
hierarchical all-reduce), groups of ``n`` consecutive ranks, so one machine can play several
hosts. A rank's peers are the ranks with its local rank on every host (one per host that has
that many ranks). Both communicators are built once per parent communicator and cached on it
(``comm.cached``), so they are freed with it; a parent that counts its bytes
(``CountingCommunicator``, the engine's) hands them to counting wrappers of the same counter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlcomm.comm.counting import CountingCommunicator
from dlcomm.config import knob_value

RANKS_PER_HOST_KNOB = "hierarchical_ranks_per_host"


@dataclass(frozen=True)
class HostTopology:
    """This rank's place among hosts; the same ``world_size``, ``host_count`` and
    ``shards`` on every rank.

    ``shards`` is the smallest host's rank count: local ranks ``0 .. shards - 1`` of every
    host own one shard of a tensor each (the same shard on every host), so the owners of a
    shard on all hosts are exactly a PEER group; a host's other ranks own none.
    """

    world_size: int
    host_count: int
    local_rank: int
    local_size: int
    shards: int

    @property
    def owns_shard(self) -> bool:
        """True when this rank owns shard ``local_rank``."""
        return self.local_rank < self.shards


@dataclass
class HostGroups:
    """The topology and the HOST and PEER communicators of one parent communicator."""

    topology: HostTopology
    host: Any
    peer: Any

    def free(self) -> None:
        """Free both sub-communicators (collective over the parent; the parent frees its
        cached values this way)."""
        for comm in (self.peer, self.host):
            free = getattr(comm, "free", None)
            if free is not None:
                free()


def host_groups(comm: Any, ranks_per_host: int | None = None) -> HostGroups:
    """The ``HostGroups`` of ``comm``, built on first use (collective over ``comm`` then).

    ``ranks_per_host`` None reads ``DLCOMM_HIERARCHICAL_RANKS_PER_HOST`` (0: the
    shared-memory split). A one-rank communicator (``SelfComm``) is its own host and peer.
    ValueError for a negative ``ranks_per_host`` or a multi-rank communicator that cannot
    split.
    """
    per_host = int(knob_value(RANKS_PER_HOST_KNOB, ranks_per_host))
    if per_host < 0:
        raise ValueError(f"{RANKS_PER_HOST_KNOB} must be >= 0 (0: the shared-memory split), "
                         f"got {per_host}")
    if comm.size == 1:
        return HostGroups(HostTopology(1, 1, 0, 1, 1), comm, comm)
    if not hasattr(comm, "split") or not hasattr(comm, "split_by_host"):
        raise ValueError(f"{type(comm).__name__} cannot split into hosts: HOST and PEER "
                         "rounds need a transport communicator (MPICommAdapter)")
    if not hasattr(comm, "cached"):
        return _build(comm, per_host)
    groups = comm.cached(("compression_host_groups", per_host), lambda: _build(comm, per_host))
    if isinstance(comm, CountingCommunicator):  # dlcomm.bytes_sent() counts host and peer rounds
        return HostGroups(groups.topology, CountingCommunicator(groups.host, comm.counter),
                          CountingCommunicator(groups.peer, comm.counter))
    return groups


def _build(comm: Any, per_host: int) -> HostGroups:
    """Split ``comm`` into hosts and peers and agree on the topology (collective)."""
    rank = comm.rank
    host = comm.split(rank // per_host, key=rank) if per_host else comm.split_by_host(key=rank)
    peer = comm.split(host.rank, key=rank)
    # (local rank, local size) of every rank: host leaders give the hosts and their sizes.
    places = comm.allgather((host.rank, host.size))
    sizes = [size for local, size in places if local == 0]
    topology = HostTopology(world_size=comm.size, host_count=len(sizes),
                            local_rank=host.rank, local_size=host.size, shards=min(sizes))
    return HostGroups(topology, host, peer)
