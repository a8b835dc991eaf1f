"""dlcomm: Horovod-style data-parallel training that is fast when communication is the
bottleneck. This package is the framework-free API over numpy arrays; framework adapters
live in ``dlcomm.torch``, ``dlcomm.tensorflow`` and ``dlcomm.mxnet``.
"""
from dlcomm.basics import (
    add_process_set,
    bytes_sent,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from dlcomm.engine.request import Handle
from dlcomm.errors import (
    DLCommError,
    HorovodInternalError,
    MismatchError,
    ShutdownError,
    StallError,
)
from dlcomm.functions import allgather_object, broadcast_object
from dlcomm.mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_async,
    allreduce_async_batch,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from dlcomm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.training_timeline import timeline_range

__version__ = "0.1.0"

__all__ = [
    "Adasum", "Average", "DLCommError", "Handle", "HorovodInternalError", "Max", "Min",
    "MismatchError", "ProcessSet", "Product", "ReduceOp", "ShutdownError", "StallError", "Sum",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_async", "allreduce_async_batch", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_async", "broadcast_object", "bytes_sent", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_reducescatter", "grouped_reducescatter_async", "init",
    "is_homogeneous", "is_initialized", "join", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size",
    "start_timeline", "stop_timeline", "synchronize", "timeline_range",
]
