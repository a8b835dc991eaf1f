"""``dlcomm.mxnet``: a drop-in for ``horovod.mxnet`` (``import dlcomm.mxnet as hvd``).

MXNet 1.9.1 is imported through ``dlcomm.mxnet.compat``, which restores the ``numpy.bool``
alias it needs (numpy 1.24-1.26) and explains the fix when MXNet cannot be imported.
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
from dlcomm.errors import (
    DLCommError,
    HorovodInternalError,
    MismatchError,
    ShutdownError,
    StallError,
)
from dlcomm.mxnet.compression import Compression, Compressor
from dlcomm.mxnet.functions import allgather_object, broadcast_object, broadcast_parameters
from dlcomm.mxnet.mpi_ops import (
    Handle,
    allgather,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async_,
    grouped_reducescatter,
    join,
    poll,
    reducescatter,
    synchronize,
)
from dlcomm.mxnet.optimizer import DistributedOptimizer
from dlcomm.mxnet.trainer import DistributedTrainer
from dlcomm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet, global_process_set

__all__ = [
    "Adasum", "Average", "Compression", "Compressor", "DLCommError", "DistributedOptimizer",
    "DistributedTrainer", "Handle", "HorovodInternalError", "Max", "Min", "MismatchError",
    "ProcessSet", "Product", "ReduceOp", "ShutdownError", "StallError", "Sum",
    "add_process_set", "allgather", "allgather_object", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "alltoall", "barrier", "broadcast", "broadcast_",
    "broadcast_async_", "broadcast_object", "broadcast_parameters", "bytes_sent", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async_", "grouped_reducescatter", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline",
    "synchronize",
]
