"""``DistributedTrainer``: a ``gluon.Trainer`` whose gradient reduction goes through dlcomm.

As ``horovod.mxnet.DistributedTrainer``: no kvstore, ``_allreduce_grads`` sums every
gradient over the ranks, and the trainer's ``_scale`` carries the ``1/size`` of the average,
so ``trainer.step(batch_size)`` with the per-rank batch size gives the update of a single
process on the concatenated batches.

``save_states(fname)`` also writes the compressor's state (error-feedback residuals,
low-rank factors, step counters) to ``fname + ".dlcomm.npz"`` (flat arrays,
``dlcomm.compression.state_io``) and ``load_states(fname)`` restores it, so a run resumed
from ``save_parameters`` + ``save_states`` compresses as the uninterrupted one. Each rank
saves its own files (residuals differ per rank).
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from dlcomm import basics
from dlcomm.compression.state_io import pack_state, unpack_state
from dlcomm.mxnet.compat import import_mxnet
from dlcomm.mxnet.compression import core_compressor, resolve
from dlcomm.mxnet.gradient_allreduce import check_predivide_and_groups, sum_gradients_
from dlcomm.mxnet.optimizer import DistributedOptimizer
from dlcomm.process_sets import ProcessSet, global_process_set

mx = import_mxnet()

COMPRESSION_STATE_SUFFIX = ".dlcomm.npz"


class DistributedTrainer(mx.gluon.Trainer):
    """A Gluon ``Trainer`` that averages gradients over ranks before each update.

    ``params``: a ``ParameterDict`` (``net.collect_params()``) or a list of Parameters;
    ``optimizer``/``optimizer_params`` as for ``gluon.Trainer``. ``compression``:
    ``Compression.none``/``fp16``, a dlcomm compressor (``Compression.lookup("topk:ratio=0.01")``
    or its spec string), or None to follow ``DLCOMM_COMPRESSION``. ``prefix`` starts the
    names of this trainer's requests (give two trainers that run at once different prefixes);
    ``num_groups`` fuses the gradients in that many fixed groups.
    """

    def __init__(self, params: Any, optimizer: Any, optimizer_params: dict | None = None,
                 compression: Any = None, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
        check_predivide_and_groups(gradient_predivide_factor, num_groups)
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_set must be a dlcomm.ProcessSet, got "
                            f"{type(process_set).__name__}")
        basics.state()  # a clear error before init()
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer takes a plain optimizer; the DistributedOptimizer "
                          "given was unwrapped (otherwise gradients would be reduced twice)",
                          stacklevel=2)
        if isinstance(params, mx.gluon.ParameterDict):
            params = [params[key] for key in sorted(params.keys())]
        self._compression = resolve(compression)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        for param in self._params:
            if len(param._ctx_list or []) > 1:
                raise ValueError(f"parameter {param.name!r} lives on {len(param._ctx_list)} "
                                 "contexts; with dlcomm each rank trains on one context")
        # Trainer.step() sets the optimizer's rescale_grad to _scale / batch_size: dividing
        # _scale by the ranks turns the summed gradients into the average.
        self._scale *= gradient_predivide_factor / process_set.size()
        self._gradient_predivide_factor = gradient_predivide_factor
        self._prefix = prefix or ""
        self._num_groups = num_groups
        self._process_set = process_set

    def _allreduce_grads(self) -> None:
        named = [(f"{self._prefix}DistributedTrainer.grad.{i}", param.list_grad()[0],
                  f"parameter {param.name!r}")
                 for i, param in enumerate(self._params) if param.grad_req != "null"]
        sum_gradients_(named, self._compression, self._gradient_predivide_factor,
                       self._num_groups, self._process_set)

    def save_states(self, fname: str) -> None:
        """The optimizer's states to ``fname`` (as ``gluon.Trainer``) and the compressor's to
        ``fname + ".dlcomm.npz"``."""
        if not isinstance(fname, (str, os.PathLike)):
            raise TypeError(f"fname must be a path, got {type(fname).__name__}")
        super().save_states(str(fname))
        compressor = core_compressor(self._compression)
        if compressor is not None:
            with open(str(fname) + COMPRESSION_STATE_SUFFIX, "wb") as f:
                np.savez(f, **pack_state(compressor.state_dict()))

    def load_states(self, fname: str) -> None:
        """Load what ``save_states`` wrote. Without the compressor's file (states saved by a
        plain ``gluon.Trainer``) the compressor starts afresh, with a warning."""
        if not isinstance(fname, (str, os.PathLike)):
            raise TypeError(f"fname must be a path, got {type(fname).__name__}")
        super().load_states(str(fname))
        compressor = core_compressor(self._compression)
        path = str(fname) + COMPRESSION_STATE_SUFFIX
        if compressor is None:
            if os.path.exists(path):
                warnings.warn(f"{path} holds compression state, but this trainer does not "
                              "compress: it is ignored", stacklevel=2)
            return
        if not os.path.exists(path):
            warnings.warn(f"no compression state beside {fname} ({path} is missing): "
                          "error-feedback residuals and low-rank factors start from zero",
                          stacklevel=2)
            compressor.reset_state()
            return
        with np.load(path) as saved:
            compressor.load_state_dict(unpack_state({k: saved[k] for k in saved.files}))
