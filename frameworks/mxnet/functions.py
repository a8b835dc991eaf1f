"""Broadcasting Gluon parameters (or a dict of NDArrays) and Python objects from one rank."""
from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from dlcomm import functions as core_functions
from dlcomm.mpi_ops import check_root_rank
from dlcomm.mxnet import mpi_ops
from dlcomm.mxnet.compat import import_mxnet
from dlcomm.process_sets import ProcessSet, global_process_set

mx = import_mxnet()


def _broadcast_after_deferred_init(param: Any, root_rank: int, name: str,
                                   process_set: ProcessSet) -> None:
    """Make ``param``'s deferred initialisation (first forward pass) end with a broadcast."""
    original = param._init_impl

    def init_then_broadcast(self: Any, *args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        self._init_impl = original  # once only
        _broadcast_all(_parameter_arrays(name, self), root_rank, process_set)

    param._init_impl = types.MethodType(init_then_broadcast, param)


def _parameter_arrays(name: str, param: Any) -> list[tuple[str, Any]]:
    """(name, NDArray) per context of ``param``: ``name``, then ``name.ctx1``, ..."""
    return [(f"{name}.ctx{k}" if k else name, a) for k, a in enumerate(param.list_data())]


def _broadcast_all(requests: list[tuple[str, Any]], root_rank: int,
                   process_set: ProcessSet) -> None:
    """Broadcast every NDArray in place; submitted together so the engine can fuse them."""
    handles = [mpi_ops.broadcast_async_(t, root_rank, name=name, process_set=process_set)
               for name, t in requests]
    for h in handles:
        h.wait()


def broadcast_parameters(params: Any, root_rank: int = 0, prefix: str | None = None,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrite parameters with ``root_rank``'s, in place, on every rank.

    ``params`` is a Gluon ``ParameterDict`` (``net.collect_params()``) or a dict of name ->
    NDArray or Parameter (e.g. ``module.get_params()[0]``). Parameters whose initialisation is
    deferred to the first forward pass are broadcast right after it, as in Horovod.
    """
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not isinstance(params, (Mapping, mx.gluon.ParameterDict)):
        raise TypeError(f"params must be a gluon ParameterDict or a dict of NDArrays, got "
                        f"{type(params).__name__}")
    check_root_rank(root_rank, process_set)
    base = f"{prefix or ''}broadcast.param."
    requests: list[tuple[str, Any]] = []
    for key, value in sorted(params.items(), key=lambda kv: str(kv[0])):
        name = base + str(key)
        if isinstance(value, mx.gluon.Parameter):
            try:
                requests.extend(_parameter_arrays(name, value))
            except mx.gluon.parameter.DeferredInitializationError:
                _broadcast_after_deferred_init(value, root_rank, name, process_set)
        elif isinstance(value, mx.nd.NDArray):
            requests.append((name, value))
        else:
            raise TypeError(f"parameter {key!r} is a {type(value).__name__}, not an NDArray or "
                            "gluon Parameter")
    _broadcast_all(requests, root_rank, process_set)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return root's (picklable) object on every rank."""
    return core_functions.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Return every rank's object, in rank order."""
    return core_functions.allgather_object(obj, name, process_set)
