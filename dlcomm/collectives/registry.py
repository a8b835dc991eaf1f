"""All-reduce algorithms found by name, and the one ``DLCOMM_ALLREDUCE_ALGORITHM`` selects.

Every entry has the signature ``algorithm(comm, sendbuf, recvbuf, op) -> recvbuf``, so the
engine can swap them without knowing which one runs. An algorithm whose reduce-scatter must
reduce like its all-reduce (the rank-order ones: ``auto``, ``ordered``, ``pipelined``) names
that reduce-scatter in ``REDUCE_SCATTERS``; the engine's reduce-scatter then uses it, others
use MPI's own. ``ALLGATHERS`` names the all-gather of those that send over the TCP mesh.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from dlcomm.collectives.allgather import mesh_allgather
from dlcomm.collectives.buffers import CommLike
from dlcomm.collectives.halving_doubling import rhd_allreduce
from dlcomm.collectives.hierarchical import hierarchical_allreduce
from dlcomm.collectives.mpi_allreduce import mpi_allreduce
from dlcomm.collectives.ordered import (
    ordered_allreduce,
    ordered_reduce_scatter,
    ordered_tcp_allreduce,
    ordered_tcp_reduce_scatter,
)
from dlcomm.collectives.pipelined import pipelined_allreduce
from dlcomm.collectives.ring import ring_allreduce, ring_tcp_allreduce
from dlcomm.collectives.selection import (
    auto_allgather,
    auto_allreduce,
    auto_reduce_scatter,
    fastest_allreduce,
)
from dlcomm.collectives.tree import tree_allreduce
from dlcomm.ops import ReduceOp

AllreduceAlgorithm = Callable[[CommLike, np.ndarray, np.ndarray, "ReduceOp | str"], np.ndarray]
ReduceScatterAlgorithm = Callable[
    [CommLike, np.ndarray, np.ndarray, Sequence[int], "ReduceOp | str"], np.ndarray]
AllgatherAlgorithm = Callable[[CommLike, np.ndarray, np.ndarray, Sequence[int]], np.ndarray]

ALLREDUCE_ALGORITHMS: dict[str, AllreduceAlgorithm] = {
    "auto": auto_allreduce,
    "ordered": ordered_allreduce,
    "ordered_tcp": ordered_tcp_allreduce,
    "pipelined": pipelined_allreduce,
    "mpi": mpi_allreduce,
    "ring": ring_allreduce,
    "ring_tcp": ring_tcp_allreduce,
    "rhd": rhd_allreduce,
    "tree": tree_allreduce,
    "hierarchical": hierarchical_allreduce,
    "fastest": fastest_allreduce,
}
ALLREDUCE_ALGORITHM_ENV = "DLCOMM_ALLREDUCE_ALGORITHM"
DEFAULT_ALLREDUCE_ALGORITHM = "auto"
ALIASES = {"native": "mpi"}  # earlier names, still accepted
# The reduce-scatter that reduces exactly like the all-reduce of the same name: every
# rank-order algorithm pairs with ordered's, so a reduce-scatter + all-gather (DeAR) gives
# the all-reduce's bits.
REDUCE_SCATTERS: dict[str, ReduceScatterAlgorithm] = {
    "auto": auto_reduce_scatter, "ordered": ordered_reduce_scatter,
    "pipelined": ordered_reduce_scatter, "ordered_tcp": ordered_tcp_reduce_scatter}
# The all-gather that runs where the all-reduce of the same name sends its bytes (over the
# TCP mesh); others use MPI's own.
ALLGATHERS: dict[str, AllgatherAlgorithm] = {"auto": auto_allgather,
                                             "ordered_tcp": mesh_allgather}


def get_allreduce_algorithm(allreduce_algorithm: str) -> AllreduceAlgorithm:
    """The all-reduce function of that name (case-insensitive); ValueError lists valid names.

    The argument is named like the ``DLCOMM_ALLREDUCE_ALGORITHM`` knob it mirrors.
    """
    name = allreduce_algorithm
    if not isinstance(name, str):
        raise TypeError(f"algorithm name must be a string, got {type(name).__name__}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in ALLREDUCE_ALGORITHMS:
        valid = ", ".join(ALLREDUCE_ALGORITHMS)
        aliases = ", ".join(f"{a} = {b}" for a, b in ALIASES.items())
        raise ValueError(f"unknown all-reduce algorithm {name!r}; valid names: {valid} "
                         f"(also {aliases})")
    return ALLREDUCE_ALGORITHMS[key]


def algorithm_name_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The algorithm name in ``DLCOMM_ALLREDUCE_ALGORITHM`` (default ``auto``), validated;
    an earlier name comes back as the current one (``native`` -> ``mpi``)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ALLREDUCE_ALGORITHM_ENV, "").strip() or DEFAULT_ALLREDUCE_ALGORITHM
    try:
        get_allreduce_algorithm(raw)
    except ValueError as exc:
        raise ValueError(f"{ALLREDUCE_ALGORITHM_ENV}: {exc}") from None
    return ALIASES.get(raw.lower(), raw.lower())


def algorithm_from_env(environ: Mapping[str, str] | None = None) -> AllreduceAlgorithm:
    """The all-reduce function that ``DLCOMM_ALLREDUCE_ALGORITHM`` names (default ``auto``)."""
    return get_allreduce_algorithm(algorithm_name_from_env(environ))
