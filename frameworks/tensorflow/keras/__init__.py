"""``dlcomm.tensorflow.keras``: a drop-in for ``horovod.tensorflow.keras``
(``import dlcomm.tensorflow.keras as hvd``), for Keras 3 as TensorFlow ships it."""
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
from dlcomm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow.compression import Compression
from dlcomm.tensorflow.functions import allgather_object, broadcast_object, broadcast_variables
from dlcomm.tensorflow.keras import callbacks, elastic
from dlcomm.tensorflow.keras.optimizer import DistributedOptimizer
from dlcomm.tensorflow.keras.value_ops import allgather, allreduce, broadcast, reducescatter
from dlcomm.tensorflow.mpi_ops import barrier, join

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Max", "Min", "ProcessSet",
    "Product", "ReduceOp", "Sum", "add_process_set", "allgather", "allgather_object",
    "allreduce", "barrier", "broadcast", "broadcast_object", "broadcast_variables",
    "callbacks", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "init", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "rank", "reducescatter", "remove_process_set", "rocm_built", "shutdown",
    "size", "start_timeline", "stop_timeline", "elastic",
]
