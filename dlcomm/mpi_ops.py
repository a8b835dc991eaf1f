"""Collectives over numpy arrays, with Horovod's names and meanings.

Every call validates its arguments on the calling thread (``TypeError``/``ValueError``
before anything is sent), then hands a named request to the engine. ``*_async`` calls return
a ``Handle`` for ``poll``/``synchronize``; the others wait for the result.
"""
from __future__ import annotations

import itertools
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from dlcomm import basics
from dlcomm.array_api import array_namespace
from dlcomm.comm.backend_select import is_device_array, select_backend
from dlcomm.compression import Compressor, get_compressor
from dlcomm.engine.request import Handle, Kind, Request, Signature
from dlcomm.ops import Average, ReduceOp, as_reduce_op
from dlcomm.process_sets import ProcessSet, global_process_set

_REDUCIBLE = frozenset("bBhHiIlLqQefd")  # ints, uints, float16/32/64
_MOVABLE = _REDUCIBLE | {"?"}  # gather, broadcast and alltoall also move bools
_counters: dict[tuple[str, int], itertools.count] = {}


def _auto_name(kind: str, process_set_id: int = 0) -> str:
    """The next automatic name of ``kind`` in a process set: unnamed calls are numbered in
    call order per set, so ranks outside a set do not shift the numbers of those inside."""
    counter = _counters.setdefault((kind, process_set_id), itertools.count())
    return f"{kind}.noname.{next(counter)}"


def reset_auto_names() -> None:
    """Number unnamed calls from zero again: an elastic job re-forms with workers that
    joined late, and every rank must name its next unnamed call alike."""
    _counters.clear()


def _check_name(name: str | None, kind: str, process_set_id: int = 0) -> str:
    if name is None:
        return _auto_name(kind, process_set_id)
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not name:
        raise ValueError("name must not be empty (pass None for an automatic name)")
    return name


def _check_array(tensor: Any, what: str, allowed: frozenset[str]) -> np.ndarray:
    if isinstance(tensor, np.generic):  # a numpy scalar travels as a 0-d array
        tensor = np.asarray(tensor)
    if is_device_array(tensor):  # CuPy: the NCCL backend moves it (raises if unavailable)
        select_backend(tensor, basics.state().config.backend)
        if tensor.dtype.char not in allowed:
            raise TypeError(f"{what} has unsupported dtype {tensor.dtype}")
        return tensor if tensor.flags.c_contiguous else tensor.copy(order="C")
    if basics.is_initialized() and basics.state().config.backend == "nccl":
        select_backend(tensor, "nccl")  # explains that host arrays need backend mpi/auto
    if not isinstance(tensor, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(tensor).__name__} "
                        "(use the framework adapter, e.g. dlcomm.torch, for framework tensors)")
    if tensor.dtype.char not in allowed:
        names = sorted({np.dtype(c).name for c in allowed})
        raise TypeError(f"{what} has unsupported dtype {tensor.dtype}; supported: "
                        f"{', '.join(names)}")
    # A view when already contiguous; ascontiguousarray would turn 0-d into 1-d.
    return tensor if tensor.flags.c_contiguous else tensor.copy(order="C")


def _check_output(output: np.ndarray | None, like: np.ndarray) -> np.ndarray:
    if output is None:
        return array_namespace(like).empty_like(like)
    if type(output) is not type(like):
        raise TypeError(f"output must be a {type(like).__name__} like the input, got "
                        f"{type(output).__name__}")
    if output.shape != like.shape or output.dtype != like.dtype:
        raise ValueError(f"output has shape {output.shape} and dtype {output.dtype}; "
                         f"expected {like.shape} and {like.dtype}")
    if not output.flags.c_contiguous or not output.flags.writeable:
        raise ValueError("output must be C-contiguous and writeable")
    return output


def _check_factor(value: Any, what: str) -> float:
    if type(value) is float or type(value) is int:  # the common case, without the ABC check
        return float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a real number, got {type(value).__name__}")
    return float(value)


def _check_process_set(process_set: ProcessSet) -> int:
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a dlcomm.ProcessSet, got "
                        f"{type(process_set).__name__}")
    st = basics.state()
    set_id = process_set.process_set_id
    if set_id is None or set_id not in st.process_sets:
        raise ValueError(f"{process_set!r} is not registered: call add_process_set first")
    if st.rank not in process_set.ranks:  # type: ignore[operator]
        raise ValueError(f"this rank ({st.rank}) is not a member of {process_set!r}")
    return set_id


def _submit(name: str, sig: Signature, arrays: list[np.ndarray],
            outputs: list[np.ndarray], grouped: bool = False, compressor: Any = None) -> Handle:
    # A name is unique within its process set, as in Horovod: requests of other sets are
    # told apart by the set's id.
    if sig.process_set_id != 0:
        name = f"{name}@set{sig.process_set_id}"
    req = Request(name, sig, arrays, outputs, grouped=grouped, compressor=compressor)
    return basics.state().engine.submit(req)


def _check_compression(compression: Any, arrays: list[np.ndarray]) -> tuple[str, Any]:
    """Return (spec agreed across ranks, compressor object or None) for an all-reduce."""
    if compression is None or compression == "none":
        return "none", None
    if isinstance(compression, str):
        compression = get_compressor(compression)
    if not isinstance(compression, Compressor):
        raise TypeError(f"compression must be a spec like 'topk:ratio=0.01' or a "
                        f"dlcomm.compression.Compressor, got {type(compression).__name__}")
    if any(a.dtype.kind != "f" for a in arrays):
        raise TypeError(f"compression {compression.describe()!r} needs floating-point "
                        f"tensors, got {arrays[0].dtype}")
    return compression.describe(), compression


# --- all-reduce ------------------------------------------------------------------------------
def allreduce_async(tensor: np.ndarray, name: str | None = None, op: ReduceOp = Average,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set,
                    output: np.ndarray | None = None, compression: Any = "none") -> Handle:
    """Start an all-reduce; ``output`` may be ``tensor`` itself (in place).

    ``compression`` is a compressor spec (``"topk:ratio=0.01"``) or a
    ``dlcomm.compression.Compressor``; its state (residuals) is kept per tensor name.
    """
    return grouped_allreduce_async([tensor], name, op, prescale_factor, postscale_factor,
                                   process_set, None if output is None else [output],
                                   compression, _grouped=False)


def allreduce(tensor: np.ndarray, name: str | None = None, op: ReduceOp = Average,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set,
              output: np.ndarray | None = None, compression: Any = "none") -> np.ndarray:
    """All-reduce ``tensor`` over the process set and return the result."""
    return allreduce_async(tensor, name, op, prescale_factor, postscale_factor, process_set,
                           output, compression).wait()


def grouped_allreduce_async(tensors: Sequence[np.ndarray], name: str | None = None,
                            op: ReduceOp = Average, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set,
                            outputs: Sequence[np.ndarray] | None = None,
                            compression: Any = "none", *, _grouped: bool = True) -> Handle:
    """Start an all-reduce of several tensors that are negotiated and fused as one."""
    kind = "grouped_allreduce" if _grouped else "allreduce"
    if isinstance(tensors, np.ndarray) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of numpy arrays, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    arrays = [_check_array(t, f"tensors[{i}]" if _grouped else "tensor", _REDUCIBLE)
              for i, t in enumerate(tensors)]
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1:
        raise ValueError(f"grouped tensors must share one dtype, got {sorted(map(str, dtypes))}")
    op = as_reduce_op(op)
    if outputs is not None and len(outputs) != len(arrays):
        raise ValueError(f"got {len(outputs)} outputs for {len(arrays)} tensors")
    # None: the engine allocates the result (and can then skip a copy out of the fusion
    # buffer by returning views of a fresh one).
    outs = [None if outputs is None or outputs[i] is None else _check_output(outputs[i], a)
            for i, a in enumerate(arrays)]
    spec, compressor = _check_compression(compression, arrays)
    if compressor is not None and op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"compression works with op Sum or Average, got {op!r}")
    sig = Signature(Kind.ALLREDUCE, _check_process_set(process_set), arrays[0].dtype.str,
                    tuple(a.shape for a in arrays), op.value, -1,
                    _check_factor(prescale_factor, "prescale_factor"),
                    _check_factor(postscale_factor, "postscale_factor"), spec,
                    device=is_device_array(arrays[0]))
    return _submit(_check_name(name, kind, sig.process_set_id), sig, arrays, outs,
                   grouped=_grouped, compressor=compressor)


def allreduce_async_batch(tensors: Sequence[np.ndarray], names: Sequence[str],
                          op: ReduceOp = Average, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set,
                          outputs: Sequence[np.ndarray | None] | None = None,
                          compression: Any = "none") -> list[Handle]:
    """Start one all-reduce per tensor, each under its own name with its own handle, in one
    submission: what a backward hook calls with the gradients that became ready together.

    Unlike ``grouped_allreduce_async`` the tensors are separate requests, negotiated by
    name, so ranks may batch them differently; the engine still fuses those ready in the
    same cycle. The shared arguments are checked once, and the engine is woken once. The
    same ``compression`` (spec or ``Compressor``) applies to every tensor, each with its
    own state. Returns the handles in the order of ``tensors``.
    """
    if isinstance(tensors, np.ndarray) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of numpy arrays, got {type(tensors).__name__}")
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise TypeError(f"names must be a list of str (one per tensor), got "
                        f"{type(names).__name__}")
    if len(names) != len(tensors):
        raise ValueError(f"got {len(names)} names for {len(tensors)} tensors")
    if outputs is not None and len(outputs) != len(tensors):
        raise ValueError(f"got {len(outputs)} outputs for {len(tensors)} tensors")
    if not tensors:
        return []
    op = as_reduce_op(op)
    set_id = _check_process_set(process_set)
    pre = _check_factor(prescale_factor, "prescale_factor")
    post = _check_factor(postscale_factor, "postscale_factor")
    if isinstance(compression, str) and compression != "none":
        compression = get_compressor(compression)  # one object: state is kept per name
    requests = []
    for i, (tensor, name) in enumerate(zip(tensors, names)):
        array = _check_array(tensor, f"tensors[{i}]", _REDUCIBLE)
        given = None if outputs is None else outputs[i]
        out = None if given is None else _check_output(given, array)
        spec, compressor = _check_compression(compression, [array])
        if compressor is not None and op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
            raise ValueError(f"compression works with op Sum or Average, got {op!r}")
        sig = Signature(Kind.ALLREDUCE, set_id, array.dtype.str, (array.shape,), op.value, -1,
                        pre, post, spec, device=is_device_array(array))
        requests.append(Request(_check_name(name, "allreduce"), sig, [array], [out],
                                compressor=compressor))
    return basics.state().engine.submit_many(requests)


def grouped_allreduce(tensors: Sequence[np.ndarray], name: str | None = None,
                      op: ReduceOp = Average, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """All-reduce several tensors together; returns a list of results."""
    return grouped_allreduce_async(tensors, name, op, prescale_factor, postscale_factor,
                                   process_set).wait()


# --- all-gather, broadcast, alltoall, reduce-scatter --------------------------------------
def allgather_async(tensor: np.ndarray, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Start concatenating every rank's tensor along dimension 0 (sizes may differ)."""
    return _allgather_async([tensor], name, process_set, grouped=False)


def allgather(tensor: np.ndarray, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenate every rank's tensor along dimension 0."""
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather_async(tensors: Sequence[np.ndarray], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Start all-gathering several tensors (one dtype) negotiated as one request; the result
    is the list of gathered tensors."""
    return _allgather_async(_check_list(tensors, "grouped_allgather"), name, process_set,
                            grouped=True)


def grouped_allgather(tensors: Sequence[np.ndarray], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """All-gather several tensors together; returns the list of gathered tensors."""
    return grouped_allgather_async(tensors, name, process_set).wait()


def _check_list(tensors: Any, call: str) -> list[Any]:
    if isinstance(tensors, np.ndarray) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of numpy arrays, got {type(tensors).__name__}")
    if not tensors:
        raise ValueError(f"{call} needs at least one tensor")
    return list(tensors)


def _check_rows(arrays: list[np.ndarray], call: str, what: str) -> None:
    for i, x in enumerate(arrays):
        if x.ndim == 0:
            where = what if len(arrays) == 1 else f"{what}[{i}]"
            raise ValueError(f"{call} needs at least one dimension ({where} is a 0-d array)")
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) > 1:
        raise ValueError(f"grouped tensors must share one dtype, got {sorted(map(str, dtypes))}")


def _allgather_async(tensors: list[Any], name: str | None, process_set: ProcessSet,
                     grouped: bool) -> Handle:
    what = "tensors" if grouped else "tensor"
    arrays = [_check_array(t, f"tensors[{i}]" if grouped else "tensor", _MOVABLE)
              for i, t in enumerate(tensors)]
    _check_rows(arrays, "allgather", what)
    sig = Signature(Kind.ALLGATHER, _check_process_set(process_set), arrays[0].dtype.str,
                    tuple(x.shape for x in arrays), device=is_device_array(arrays[0]))
    kind = "grouped_allgather" if grouped else "allgather"
    return _submit(_check_name(name, kind, sig.process_set_id), sig, arrays, [],
                   grouped=grouped)


def broadcast_async(tensor: np.ndarray, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set,
                    output: np.ndarray | None = None) -> Handle:
    """Start copying ``root_rank``'s tensor to every rank (``output=tensor``: in place).

    ``root_rank`` is a world rank, as in Horovod, also for a process set (it must be one of
    the set's members)."""
    x = _check_array(tensor, "tensor", _MOVABLE)
    set_id = _check_process_set(process_set)
    root = check_root_rank(root_rank, process_set)
    out = _check_output(output, x)
    if out is not x and basics.rank() == root:
        np.copyto(out, x)
    sig = Signature(Kind.BROADCAST, set_id, x.dtype.str, (x.shape,), root=root,
                    device=is_device_array(x))
    return _submit(_check_name(name, "broadcast", set_id), sig, [x], [out])


def check_root_rank(root_rank: Any, process_set: ProcessSet = global_process_set) -> int:
    """``root_rank`` as an int if it names a member of ``process_set`` by its world rank
    (Horovod's meaning, also for process sets), else a ``TypeError``/``ValueError``."""
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"root_rank must be an int, got {type(root_rank).__name__}")
    root = int(root_rank)
    world = basics.size()
    if not 0 <= root < world:
        raise ValueError(f"root_rank {root} is out of range for {world} ranks")
    if process_set.rank_of(root) < 0:
        raise ValueError(f"root_rank {root} is not a member of {process_set!r} (root_rank is "
                         "a world rank, as in Horovod)")
    return root


def broadcast(tensor: np.ndarray, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set,
              output: np.ndarray | None = None) -> np.ndarray:
    """Return ``root_rank``'s tensor on every rank."""
    return broadcast_async(tensor, root_rank, name, process_set, output).wait()


def alltoall_async(tensor: np.ndarray, splits: Sequence[int] | np.ndarray | None = None,
                   name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Handle:
    """Start sending ``splits[j]`` rows of ``tensor`` to rank j (even split by default).

    The handle's result is ``(output, received_splits)``.
    """
    x = _check_array(tensor, "tensor", _MOVABLE)
    if x.ndim == 0:
        raise ValueError("alltoall needs at least one dimension (got a 0-d array)")
    set_id = _check_process_set(process_set)
    n = process_set.size()
    if splits is None:
        if x.shape[0] % n:
            raise ValueError(f"tensor's first dimension ({x.shape[0]}) is not divisible by "
                             f"the {n} ranks; pass splits=")
        split_list = [x.shape[0] // n] * n
    else:
        split_list = [int(s) for s in np.asarray(splits).reshape(-1)]
        if len(split_list) != n:
            raise ValueError(f"splits has {len(split_list)} entries; the process set has "
                             f"{n} ranks")
        if any(s < 0 for s in split_list) or sum(split_list) != x.shape[0]:
            raise ValueError(f"splits {split_list} must be non-negative and sum to the first "
                             f"dimension {x.shape[0]}")
    sig = Signature(Kind.ALLTOALL, set_id, x.dtype.str, (x.shape,), splits=tuple(split_list),
                    device=is_device_array(x))
    return _submit(_check_name(name, "alltoall", set_id), sig, [x], [])


def alltoall(tensor: np.ndarray, splits: Sequence[int] | np.ndarray | None = None,
             name: str | None = None, process_set: ProcessSet = global_process_set
             ) -> tuple[np.ndarray, np.ndarray]:
    """Exchange rows with every rank; returns ``(output, received_splits)``."""
    out, received = alltoall_async(tensor, splits, name, process_set).wait()
    return out, np.asarray(received, dtype=np.int32)


def reducescatter_async(tensor: np.ndarray, name: str | None = None, op: ReduceOp = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Start a reduce, after which rank i keeps the i-th part of dimension 0."""
    return _reducescatter_async([tensor], name, op, process_set, prescale_factor,
                                postscale_factor, grouped=False)


def reducescatter(tensor: np.ndarray, name: str | None = None, op: ReduceOp = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> np.ndarray:
    """Reduce over ranks and keep this rank's part of dimension 0."""
    return reducescatter_async(tensor, name, op, process_set, prescale_factor,
                               postscale_factor).wait()


def grouped_reducescatter_async(tensors: Sequence[np.ndarray], name: str | None = None,
                                op: ReduceOp = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Start reduce-scattering several tensors (one dtype) negotiated as one request; the
    result is the list of this rank's parts."""
    return _reducescatter_async(_check_list(tensors, "grouped_reducescatter"), name, op,
                                process_set, prescale_factor, postscale_factor, grouped=True)


def grouped_reducescatter(tensors: Sequence[np.ndarray], name: str | None = None,
                          op: ReduceOp = Average, process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[np.ndarray]:
    """Reduce-scatter several tensors together; returns this rank's part of each."""
    return grouped_reducescatter_async(tensors, name, op, process_set, prescale_factor,
                                       postscale_factor).wait()


def _reducescatter_async(tensors: list[Any], name: str | None, op: ReduceOp,
                         process_set: ProcessSet, prescale_factor: float,
                         postscale_factor: float, grouped: bool) -> Handle:
    what = "tensors" if grouped else "tensor"
    arrays = [_check_array(t, f"tensors[{i}]" if grouped else "tensor", _REDUCIBLE)
              for i, t in enumerate(tensors)]
    _check_rows(arrays, "reducescatter", what)
    op = as_reduce_op(op)
    sig = Signature(Kind.REDUCESCATTER, _check_process_set(process_set), arrays[0].dtype.str,
                    tuple(x.shape for x in arrays), op.value, -1,
                    _check_factor(prescale_factor, "prescale_factor"),
                    _check_factor(postscale_factor, "postscale_factor"),
                    device=is_device_array(arrays[0]))
    kind = "grouped_reducescatter" if grouped else "reducescatter"
    return _submit(_check_name(name, kind, sig.process_set_id), sig, arrays, [],
                   grouped=grouped)


# --- synchronisation -------------------------------------------------------------------------
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set reaches the barrier."""
    set_id = _check_process_set(process_set)
    _submit(_auto_name("barrier", set_id), Signature(Kind.BARRIER, set_id), [], []).wait()


def join(device: int = -1) -> int:
    """Mark this rank as out of data; serve others' all-reduces until every rank joins.

    Returns the rank that joined last. While a rank has joined, it contributes zeros to
    Sum and Average all-reduces, and averages divide by the ranks that contributed.
    """
    if isinstance(device, bool) or not isinstance(device, numbers.Integral):
        raise TypeError(f"device must be an int, got {type(device).__name__}")
    return _submit(_auto_name("join"), Signature(Kind.JOIN, 0), [], []).wait()


def poll(handle: Handle) -> bool:
    """True when the request behind ``handle`` has finished (successfully or not)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"poll takes a handle from an *_async call, got {type(handle).__name__}")
    return handle.done()


def synchronize(handle: Handle) -> Any:
    """Wait for ``handle``; return its result or raise its error."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize takes a handle from an *_async call, got "
                        f"{type(handle).__name__}")
    return handle.wait()
