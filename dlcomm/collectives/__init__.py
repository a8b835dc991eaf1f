"""All-reduce and friends written over the transport's point-to-point messages.

Ring, recursive halving-doubling (Rabenseifner), binomial tree, ring reduce-scatter and
all-gather with per-rank counts, a hierarchical all-reduce (reduce inside each host,
all-reduce among host leaders, broadcast inside each host), the ``ordered`` all-reduce and
reduce-scatter that reduce every element in rank order (``ordered_tcp``: the same over a
TCP mesh, ``dlcomm.comm.tcp_mesh``), ``pipelined`` (``ordered``'s bits
with segments overlapped on non-blocking messages), and ``auto`` / ``fastest``, which pick
one per message size from a cost model measured at first use. Every all-reduce has the
signature ``algorithm(comm, sendbuf, recvbuf, op) -> recvbuf`` on contiguous 1-D numpy
arrays, where ``comm`` is a ``dlcomm.comm`` communicator or an mpi4py intracommunicator, and
``DLCOMM_ALLREDUCE_ALGORITHM`` picks one by name (default ``auto``; ``mpi`` = MPI's own,
``native`` its earlier name, still accepted). See docs/collectives.md.

Names are imported lazily: the transport imports ``mpi4py.MPI``, which initialises MPI, and a
launcher process (``python -m dlcomm.tools.bench.algorithms`` before it starts mpirun, or the
pytest process) must not do that.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "rhd_allreduce": "halving_doubling",
    "HierarchicalAllreduce": "hierarchical",
    "cached_hierarchical_allreduce": "hierarchical",
    "hierarchical_allreduce": "hierarchical",
    "mpi_allreduce": "mpi_allreduce",
    "native_allreduce": "mpi_allreduce",
    "ordered_allreduce": "ordered",
    "ordered_reduce_scatter": "ordered",
    "ordered_tcp_allreduce": "ordered",
    "ordered_tcp_reduce_scatter": "ordered",
    "pipelined_allreduce": "pipelined",
    "AutoAllreduce": "selection",
    "CostModel": "cost_model",
    "auto_allreduce": "selection",
    "auto_reduce_scatter": "selection",
    "auto_allgather": "selection",
    "mesh_allgather": "allgather",
    "built_model": "selection",
    "cached_auto_allreduce": "selection",
    "fastest_allreduce": "selection",
    "SUPPORTED_OPS": "reduction",
    "as_collective_op": "reduction",
    "reduction_ufunc": "reduction",
    "ALLREDUCE_ALGORITHM_ENV": "registry",
    "ALLREDUCE_ALGORITHMS": "registry",
    "REDUCE_SCATTERS": "registry",
    "ALLGATHERS": "registry",
    "AllreduceAlgorithm": "registry",
    "algorithm_from_env": "registry",
    "algorithm_name_from_env": "registry",
    "get_allreduce_algorithm": "registry",
    "ring_allgather": "ring",
    "ring_allreduce": "ring",
    "ring_reduce_scatter": "ring",
    "ring_tcp_allreduce": "ring",
    "binomial_broadcast": "tree",
    "binomial_reduce": "tree",
    "tree_allreduce": "tree",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first access."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
