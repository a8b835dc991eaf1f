"""All-reduce and friends written over MPI point-to-point messages.

Ring, recursive halving-doubling (Rabenseifner), binomial tree, ring reduce-scatter and
all-gather with per-rank counts, and a hierarchical all-reduce (reduce inside each host,
all-reduce among host leaders, broadcast inside each host). Every all-reduce has the
signature ``algorithm(comm, sendbuf, recvbuf, op) -> recvbuf`` on contiguous 1-D numpy
arrays, and ``DLCOMM_ALLREDUCE_ALGORITHM`` picks one by name (``native`` = MPI's own).
See docs/collectives.md.
"""
from dlcomm.collectives.halving_doubling import rhd_allreduce
from dlcomm.collectives.hierarchical import (
    HierarchicalAllreduce,
    cached_hierarchical_allreduce,
    hierarchical_allreduce,
)
from dlcomm.collectives.native import native_allreduce
from dlcomm.collectives.reduction import (
    SUPPORTED_OPS,
    as_collective_op,
    reduction_ufunc,
)
from dlcomm.collectives.registry import (
    ALLREDUCE_ALGORITHM_ENV,
    ALLREDUCE_ALGORITHMS,
    AllreduceAlgorithm,
    algorithm_from_env,
    algorithm_name_from_env,
    get_allreduce_algorithm,
)
from dlcomm.collectives.ring import ring_allgather, ring_allreduce, ring_reduce_scatter
from dlcomm.collectives.tree import (
    binomial_broadcast,
    binomial_reduce,
    tree_allreduce,
)

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "ALLREDUCE_ALGORITHM_ENV",
    "SUPPORTED_OPS",
    "AllreduceAlgorithm",
    "HierarchicalAllreduce",
    "algorithm_from_env",
    "algorithm_name_from_env",
    "as_collective_op",
    "binomial_broadcast",
    "binomial_reduce",
    "cached_hierarchical_allreduce",
    "get_allreduce_algorithm",
    "hierarchical_allreduce",
    "native_allreduce",
    "reduction_ufunc",
    "rhd_allreduce",
    "ring_allgather",
    "ring_allreduce",
    "ring_reduce_scatter",
    "tree_allreduce",
]
