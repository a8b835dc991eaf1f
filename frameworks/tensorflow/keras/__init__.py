"""``dlcomm.tensorflow.keras``: a drop-in for ``horovod.tensorflow.keras``
(``import dlcomm.tensorflow.keras as hvd``), for Keras 3 as TensorFlow ships it."""
from dlcomm.basics import (
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from dlcomm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow.compression import Compression
from dlcomm.tensorflow.functions import allgather_object, broadcast_object, broadcast_variables
from dlcomm.tensorflow.keras import callbacks
from dlcomm.tensorflow.keras.optimizer import DistributedOptimizer
from dlcomm.tensorflow.keras.value_ops import allgather, allreduce, broadcast
from dlcomm.tensorflow.mpi_ops import barrier, join

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Max", "Min", "ProcessSet",
    "Product", "ReduceOp", "Sum", "allgather", "allgather_object", "allreduce", "barrier",
    "broadcast", "broadcast_object", "broadcast_variables", "callbacks", "cross_rank",
    "cross_size", "global_process_set", "init", "is_initialized", "join", "local_rank",
    "local_size", "mpi_threads_supported", "rank", "shutdown", "size",
]
