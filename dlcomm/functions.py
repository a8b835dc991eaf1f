"""Python-object collectives built on the array ones (pickled into uint8 arrays)."""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from dlcomm import basics, mpi_ops
from dlcomm.process_sets import ProcessSet, global_process_set


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s object on every rank (it must be picklable); ``root_rank`` is a
    world rank, as in Horovod."""
    name = name or mpi_ops._auto_name("broadcast_object", process_set.process_set_id)
    is_root = basics.rank() == mpi_ops.check_root_rank(root_rank, process_set)
    payload = (np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if is_root
               else np.empty(0, dtype=np.uint8))
    length = mpi_ops.broadcast(np.array([payload.size], dtype=np.int64), root_rank,
                               f"{name}.length", process_set)
    buf = payload.copy() if is_root else np.empty(int(length[0]), dtype=np.uint8)
    data = mpi_ops.broadcast(buf, root_rank, f"{name}.data", process_set, output=buf)
    return obj if is_root else pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return the list of every rank's object, in rank order."""
    name = name or mpi_ops._auto_name("allgather_object", process_set.process_set_id)
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    sizes = mpi_ops.allgather(np.array([payload.size], dtype=np.int64), f"{name}.sizes",
                              process_set)
    data = mpi_ops.allgather(payload, f"{name}.data", process_set)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(data[offsets[i]:offsets[i + 1]].tobytes()) for i in range(len(sizes))]
