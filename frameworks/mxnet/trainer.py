"""``DistributedTrainer``: a ``gluon.Trainer`` whose gradient reduction goes through dlcomm.

As ``horovod.mxnet.DistributedTrainer``: no kvstore, ``_allreduce_grads`` sums every
gradient over the ranks, and the trainer's ``_scale`` carries the ``1/size`` of the average,
so ``trainer.step(batch_size)`` with the per-rank batch size gives the update of a single
process on the concatenated batches.
"""
from __future__ import annotations

import warnings
from typing import Any

from dlcomm import basics
from dlcomm.mxnet.compat import import_mxnet
from dlcomm.mxnet.compression import resolve
from dlcomm.mxnet.gradient_allreduce import check_predivide_and_groups, sum_gradients_
from dlcomm.mxnet.optimizer import DistributedOptimizer
from dlcomm.process_sets import ProcessSet, global_process_set

mx = import_mxnet()


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
