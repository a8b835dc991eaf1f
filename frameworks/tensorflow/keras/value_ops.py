"""``horovod.tensorflow.keras``'s value collectives: a number, array or tensor in, the
collective's ``tf.Tensor`` out, as Horovod returns it in eager mode (``.numpy()`` gives the
array); inside a graph the symbolic tensor."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow import mpi_ops
from dlcomm.tensorflow.compression import Compression


def _tensor(value: Any) -> tf.Tensor:
    return value if isinstance(value, (tf.Tensor, tf.Variable)) else tf.constant(value)


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: ReduceOp | None = None, compression: Any = Compression.none,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """The reduction of ``value`` over ranks (default: the average)."""
    return mpi_ops.allreduce(_tensor(value), average=average, compression=compression, op=op,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set)


def allgather(value: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Every rank's ``value`` concatenated along dimension 0."""
    return mpi_ops.allgather(_tensor(value), name=name, process_set=process_set)


def broadcast(value: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """``root_rank``'s ``value`` on every rank."""
    return mpi_ops.broadcast(_tensor(value), root_rank, name=name, process_set=process_set)


def reducescatter(value: Any, name: str | None = None, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """``value`` reduced over ranks; this rank's part of dimension 0."""
    return mpi_ops.reducescatter(_tensor(value), op=op, name=name, process_set=process_set)
