"""``dlcomm.torch``: a drop-in for ``horovod.torch`` (``import dlcomm.torch as hvd``)."""
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
from dlcomm.ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.torch import elastic
from dlcomm.torch.compression import Compression, Compressor
from dlcomm.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from dlcomm.torch.heterogeneity.lbbsp import BalancedBatchSampler
from dlcomm.torch.layerwise import LAMB, LARS, exclude_bias_and_norm
from dlcomm.torch.loss_scaler import LossScaler
from dlcomm.torch.lr_warmup import warmup_decay_factor, warmup_lr_scheduler
from dlcomm.torch.mpi_ops import (
    Handle,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from dlcomm.torch.optimizer import DistributedOptimizer
from dlcomm.torch.sync_batch_norm import SyncBatchNorm
from dlcomm.training_timeline import timeline_range

__all__ = [
    "Adasum", "Average", "BalancedBatchSampler", "Compression", "Compressor", "DLCommError",
    "DistributedOptimizer", "Handle", "HorovodInternalError", "LAMB", "LARS", "LossScaler",
    "Max", "Min", "MismatchError",
    "ProcessSet", "Product", "ReduceOp", "ShutdownError", "StallError", "Sum", "SyncBatchNorm",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "bytes_sent",
    "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "global_process_set",
    "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "init",
    "is_homogeneous", "is_initialized", "join", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size",
    "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize",
    "timeline_range", "exclude_bias_and_norm", "warmup_decay_factor", "warmup_lr_scheduler",
    "elastic",
]
