"""``DistributedOptimizer``: an ``mx.optimizer.Optimizer`` that sums gradients over ranks
before the wrapped optimizer's update, as ``horovod.mxnet.DistributedOptimizer`` does.

It serves the Module API (``module.init_optimizer(kvstore=None, optimizer=opt)``), an
``mx.optimizer.Updater`` used by hand, and ``gluon.Trainer(..., kvstore=None)``; for Gluon,
``DistributedTrainer`` is the usual choice. The wrapped optimizer's ``rescale_grad`` is
multiplied by ``gradient_predivide_factor / size`` once, here, which turns the sums into the
average. Attributes not defined here (learning rate, ``wd``, ``aggregate_num``, ...) are read
from and written to the wrapped optimizer.
"""
from __future__ import annotations

from typing import Any

from dlcomm import basics
from dlcomm.mxnet.compat import import_mxnet
from dlcomm.mxnet.compression import resolve
from dlcomm.mxnet.gradient_allreduce import check_predivide_and_groups, sum_gradients_
from dlcomm.mxnet.ndarray_bridge import check_ndarray
from dlcomm.process_sets import ProcessSet, global_process_set

mx = import_mxnet()

_OWN = frozenset({"_optimizer", "_compression", "_gradient_predivide_factor", "_num_groups",
                  "_process_set", "_prefix"})


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wrap ``optimizer`` so that ``update``/``update_multi_precision`` first sum the gradients
    over ranks (``compression``, ``gradient_predivide_factor``, ``num_groups`` and
    ``process_set`` as in ``DistributedTrainer``)."""

    def __init__(self, optimizer: Any, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: ProcessSet = global_process_set,
                 compression: Any = None, prefix: str | None = None) -> None:
        # The base __init__ is not called on purpose: every optimizer setting lives in the
        # wrapped optimizer, which __getattr__/__setattr__ forward to.
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"optimizer must be an mx.optimizer.Optimizer (e.g. "
                            f"mx.optimizer.SGD(...)), got {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("optimizer is already a DistributedOptimizer; wrap it once")
        check_predivide_and_groups(gradient_predivide_factor, num_groups)
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_set must be a dlcomm.ProcessSet, got "
                            f"{type(process_set).__name__}")
        basics.state()  # a clear error before init()
        own = {"_optimizer": optimizer, "_compression": resolve(compression),
               "_gradient_predivide_factor": gradient_predivide_factor,
               "_num_groups": num_groups, "_process_set": process_set,
               "_prefix": prefix or ""}
        self.__dict__.update(own)
        optimizer.rescale_grad *= gradient_predivide_factor / process_set.size()

    # --- forwarding to the wrapped optimizer ---------------------------------------------
    def __getattr__(self, item: str) -> Any:
        if item in _OWN:  # not set yet (e.g. while unpickling)
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    def __setattr__(self, item: str, value: Any) -> None:
        if item in _OWN:
            self.__dict__[item] = value
        else:
            setattr(self._optimizer, item, value)

    @property
    def learning_rate(self) -> float:
        return self._optimizer.learning_rate

    def create_state(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)

    # --- the update ----------------------------------------------------------------------
    def _sum_gradients(self, index: Any, grad: Any) -> None:
        if isinstance(index, (list, tuple)):  # MXNet's aggregated updates pass lists
            if not isinstance(grad, (list, tuple)) or len(grad) != len(index):
                raise ValueError("index and grad must be lists of the same length")
            pairs = list(zip(index, grad))
        else:
            pairs = [(index, grad)]
        named = [(f"{self._prefix}DistributedOptimizer.grad.{i}",
                  check_ndarray(g, f"gradient {i}"), f"index {i}") for i, g in pairs]
        sum_gradients_(named, self._compression, self._gradient_predivide_factor,
                       self._num_groups, self._process_set)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        """Sum ``grad`` over ranks in place, then run the wrapped optimizer's update."""
        self._sum_gradients(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        """Sum ``grad`` over ranks in place, then the wrapped multi-precision update."""
        self._sum_gradients(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)
