"""Collectives on MXNet NDArrays, with ``horovod.mxnet``'s names and meanings.

Each call waits for MXNet's pending work on its input, hands the core a numpy view of the
NDArray's memory (``ndarray_bridge``), and returns when the collective is done. In-place
variants (``allreduce_``, ``broadcast_``) reduce straight into the NDArray; the others return
a new NDArray on the input's context (one copy); an ``*_async`` call returns the core's
``Handle`` with that conversion chained by ``then``. ``priority`` is accepted for Horovod
compatibility: dlcomm's engine orders requests by negotiation, not by priority.
"""
from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

import dlcomm
from dlcomm import mpi_ops as core
from dlcomm.mpi_ops import Handle, poll, synchronize  # noqa: F401 - one handle for all adapters
from dlcomm.mxnet.compat import import_mxnet
from dlcomm.mxnet.compression import Compression, Compressor, core_compressor
from dlcomm.mxnet.ndarray_bridge import check_ndarray, new_ndarray, numpy_view, write_back
from dlcomm.ops import Average, ReduceOp
from dlcomm.process_sets import ProcessSet, global_process_set


def _op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    if average is not None and op is not None:
        raise ValueError("give either average= (deprecated) or op=, not both")
    if average is not None:
        if not isinstance(average, bool):
            raise TypeError(f"average must be a bool, got {type(average).__name__}")
        return Average if average else dlcomm.Sum
    return Average if op is None else op


def _check_priority(priority: Any) -> None:
    if isinstance(priority, bool) or not isinstance(priority, numbers.Integral):
        raise TypeError(f"priority must be an int, got {type(priority).__name__}")


def _check_list(tensors: Any) -> list[Any]:
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of NDArrays, got {type(tensors).__name__}")
    return [check_ndarray(t, f"tensors[{i}]") for i, t in enumerate(tensors)]


# --- all-reduce ------------------------------------------------------------------------------
def allreduce_async_(tensor: Any, average: bool | None = None, name: str | None = None,
                     priority: int = 0, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set, op: ReduceOp | None = None,
                     compression: Any = None) -> Handle:
    """Start an in-place all-reduce of ``tensor`` (``compression``: a core compressor/spec)."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    view = numpy_view(t)
    h = core.allreduce_async(view, name, _op(average, op), prescale_factor, postscale_factor,
                             process_set, output=view, compression=compression)
    return h.then(lambda result: write_back(t, result))


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None,
               priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set,
               op: ReduceOp | None = None) -> Any:
    """All-reduce ``tensor`` in place and return it (Average unless ``op``/``average``)."""
    return allreduce_async_(tensor, average, name, priority, prescale_factor, postscale_factor,
                            process_set, op).wait()


def allreduce_async(tensor: Any, average: bool | None = None, name: str | None = None,
                    priority: int = 0, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set, op: ReduceOp | None = None,
                    compression: type[Compressor] | Compressor = Compression.none) -> Handle:
    """Start an all-reduce into a new NDArray (``tensor`` is left unchanged)."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    if not (isinstance(compression, Compressor)
            or (isinstance(compression, type) and issubclass(compression, Compressor))):
        raise TypeError(f"compression must be hvd.Compression.<name>, got {compression!r}")
    compressed, ctx = compression.compress(t)
    h = core.allreduce_async(numpy_view(compressed), name, _op(average, op), prescale_factor,
                             postscale_factor, process_set,
                             compression=core_compressor(compression))
    return h.then(lambda result: compression.decompress(new_ndarray(result, compressed), ctx))


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None,
              priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, op: ReduceOp | None = None,
              compression: type[Compressor] | Compressor = Compression.none) -> Any:
    """All-reduce ``tensor`` and return the result as a new NDArray."""
    return allreduce_async(tensor, average, name, priority, prescale_factor, postscale_factor,
                           process_set, op, compression).wait()


def grouped_allreduce_async_(tensors: Sequence[Any], average: bool | None = None,
                             name: str | None = None, priority: int = 0,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set,
                             op: ReduceOp | None = None, compression: Any = None) -> Handle:
    """Start an in-place all-reduce of several NDArrays, negotiated and fused as one."""
    ts = _check_list(tensors)
    _check_priority(priority)
    views = [numpy_view(t) for t in ts]
    h = core.grouped_allreduce_async(views, name, _op(average, op), prescale_factor,
                                     postscale_factor, process_set, outputs=views,
                                     compression=compression)
    return h.then(lambda results: [write_back(t, r) for t, r in zip(ts, results)])


def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None,
                       name: str | None = None, priority: int = 0,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set,
                       op: ReduceOp | None = None) -> list[Any]:
    """All-reduce several NDArrays together, in place; returns them."""
    return grouped_allreduce_async_(tensors, average, name, priority, prescale_factor,
                                    postscale_factor, process_set, op).wait()


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None,
                      name: str | None = None, priority: int = 0,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      op: ReduceOp | None = None) -> list[Any]:
    """All-reduce several NDArrays together; returns new NDArrays."""
    ts = _check_list(tensors)
    _check_priority(priority)
    h = core.grouped_allreduce_async([numpy_view(t) for t in ts], name, _op(average, op),
                                     prescale_factor, postscale_factor, process_set)
    return [new_ndarray(r, t) for t, r in zip(ts, h.wait())]


# --- other collectives -----------------------------------------------------------------------
def allgather(tensor: Any, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Concatenate every rank's NDArray along dimension 0 (sizes may differ)."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    return new_ndarray(core.allgather(numpy_view(t), name, process_set), t)


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None,
                     priority: int = 0, process_set: ProcessSet = global_process_set) -> Handle:
    """Start overwriting ``tensor`` with ``root_rank``'s NDArray."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    view = numpy_view(t)
    h = core.broadcast_async(view, root_rank, name, process_set, output=view)
    return h.then(lambda result: write_back(t, result))


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite ``tensor`` with ``root_rank``'s NDArray, in place; return it."""
    return broadcast_async_(tensor, root_rank, name, priority, process_set).wait()


def broadcast(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Return ``root_rank``'s NDArray as a new NDArray on every rank."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    return new_ndarray(core.broadcast(numpy_view(t), root_rank, name, process_set), t)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, priority: int = 0,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[j]`` rows to rank j (even split by default). As ``horovod.mxnet``:
    returns the rows received, rank by rank, and with ``splits`` given
    ``(output, received_splits)`` (``splits``: ints or an NDArray)."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    wanted_splits = splits is not None
    if splits is not None and not isinstance(splits, (list, tuple, np.ndarray)):
        splits = check_ndarray(splits, "splits").asnumpy()
    out, received = core.alltoall(numpy_view(t), splits, name, process_set)
    output = new_ndarray(out, t)
    if not wanted_splits:
        return output
    mx = import_mxnet()
    return output, mx.nd.array(np.asarray(received, dtype=np.int32), dtype="int32")


def reducescatter(tensor: Any, op: ReduceOp = Average, name: str | None = None,
                  priority: int = 0, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Any:
    """Reduce over ranks; rank i keeps the i-th part of dimension 0 (Horovod's argument
    order: ``op`` second)."""
    t = check_ndarray(tensor)
    _check_priority(priority)
    return new_ndarray(core.reducescatter(numpy_view(t), name, op, process_set,
                                          prescale_factor, postscale_factor), t)


def grouped_reducescatter(tensors: Sequence[Any], op: ReduceOp = Average,
                          name: str | None = None, priority: int = 0,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """Reduce-scatter several NDArrays (one dtype) as one request; returns this rank's part
    of each."""
    ts = _check_list(tensors)
    _check_priority(priority)
    results = core.grouped_reducescatter([numpy_view(t) for t in ts], name, op, process_set,
                                         prescale_factor, postscale_factor)
    return [new_ndarray(r, t) for t, r in zip(ts, results)]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """All-gather several NDArrays (one dtype) as one request; returns the gathered ones."""
    ts = _check_list(tensors)
    _check_priority(priority)
    results = core.grouped_allgather([numpy_view(t) for t in ts], name, process_set)
    return [new_ndarray(r, t) for t, r in zip(ts, results)]


def join() -> int:
    """This rank is out of data; serve others' all-reduces until all join. Returns the last."""
    return core.join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set reaches the barrier."""
    core.barrier(process_set)
