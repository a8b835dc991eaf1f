"""``horovod.tensorflow.keras``'s value collectives: numbers or arrays in, numpy arrays out
(for use in callbacks and between epochs, outside the compiled train step)."""
from __future__ import annotations

from typing import Any

import numpy as np

from dlcomm.ops import ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set
from dlcomm.tensorflow import mpi_ops
from dlcomm.tensorflow.compression import Compression


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: ReduceOp | None = None, compression: Any = Compression.none,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """The reduction of ``value`` over ranks (default: the average), as a numpy array."""
    return np.asarray(mpi_ops.allreduce(value, average=average, compression=compression, op=op,
                                        prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor, name=name,
                                        process_set=process_set))


def allgather(value: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every rank's ``value`` concatenated along dimension 0, as a numpy array."""
    return np.asarray(mpi_ops.allgather(value, name=name, process_set=process_set))


def broadcast(value: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """``root_rank``'s ``value`` on every rank, as a numpy array."""
    return np.asarray(mpi_ops.broadcast(value, root_rank, name=name, process_set=process_set))
