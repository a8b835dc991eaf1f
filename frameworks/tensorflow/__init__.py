"""``dlcomm.tensorflow``: a drop-in for ``horovod.tensorflow`` (``import dlcomm.tensorflow as
hvd``), eager and inside ``tf.function``; Keras lives in ``dlcomm.tensorflow.keras``."""
from dlcomm.basics import (
    add_process_set,
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
from dlcomm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow import elastic
from dlcomm.tensorflow.compression import Compression, Compressor
from dlcomm.tensorflow.functions import (
    _executing_eagerly,  # noqa: F401 - Horovod exposes it and its tests call it
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_variables,
)
from dlcomm.tensorflow.gradient_tape import (
    DistributedGradientTape,
    PartialDistributedGradientTape,
)
from dlcomm.tensorflow.mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)


def __getattr__(name: str):  # Keras loads on first use: `hvd.DistributedOptimizer`
    if name == "DistributedOptimizer":
        # Optional dependency: Keras loads on first use.
        from dlcomm.tensorflow.keras.optimizer import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'dlcomm.tensorflow' has no attribute {name!r}")


__all__ = [
    "Adasum", "Average", "Compression", "Compressor", "DLCommError", "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "DistributedOptimizer", "HorovodInternalError", "Max", "Min", "MismatchError",
    "ProcessSet", "Product", "ReduceOp", "ShutdownError", "StallError", "Sum",
    "add_process_set", "allgather", "allgather_object", "allreduce", "alltoall", "barrier",
    "broadcast", "broadcast_", "broadcast_global_variables", "broadcast_object",
    "broadcast_variables", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "init",
    "is_homogeneous", "is_initialized", "join", "local_rank", "local_rank_op", "local_size",
    "local_size_op", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "process_set_included_op", "rank", "rank_op", "reducescatter", "remove_process_set",
    "rocm_built", "shutdown", "size", "size_op", "start_timeline", "stop_timeline", "elastic",
]
