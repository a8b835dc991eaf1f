"""Keras callbacks of ``horovod.tensorflow.keras.callbacks``: broadcast the initial state,
average metrics over ranks, and warm the learning rate up to its scaled value."""
from __future__ import annotations

import warnings

import keras
import numpy as np

from dlcomm import basics
from dlcomm import mpi_ops as core
from dlcomm.ops import Average
from dlcomm.tensorflow.functions import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Give every rank ``root_rank``'s model and optimizer variables when training starts,
    so ranks that initialised differently (or restored a checkpoint on the root only) agree.

    Keras 3 builds the optimizer before ``on_train_begin``; if it is not built then, its
    variables are broadcast after the first batch.
    """

    def __init__(self, root_rank: int = 0, device: str = "") -> None:
        super().__init__()
        if isinstance(root_rank, bool) or not isinstance(root_rank, int):
            raise TypeError(f"root_rank must be an int, got {type(root_rank).__name__}")
        if not 0 <= root_rank < basics.size():
            raise ValueError(f"root_rank {root_rank} is out of range for {basics.size()} ranks")
        self.root_rank = root_rank
        self.model_done = False
        self.optimizer_done = False

    def _broadcast(self) -> None:
        if not self.model_done:
            broadcast_variables(self.model.variables, self.root_rank)
            self.model_done = True
        optimizer = getattr(self.model, "optimizer", None)
        if not self.optimizer_done and optimizer is not None and optimizer.built:
            broadcast_variables(optimizer.variables, self.root_rank)
            self.optimizer_done = True

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.optimizer_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Replace each epoch-end metric in ``logs`` by its average over ranks. Put it before
    callbacks that read the metrics (checkpointing, early stopping, schedules)."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0
                      and isinstance(np.asarray(v).item(), (int, float)))
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = core.allreduce(values, f"metric_average.{epoch}.{','.join(keys)}", Average)
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs`` (per batch), as in Goyal et al. and Horovod.

    ``initial_lr`` is the scaled rate (usually ``base_lr * size``). ``momentum_correction``
    cannot be applied under Keras 3, where momentum is a constant of the compiled train step;
    a warning says so when the optimizer has momentum.
    """

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        super().__init__()
        if isinstance(initial_lr, bool) or not isinstance(initial_lr, (int, float)) \
                or initial_lr <= 0:
            raise ValueError(f"initial_lr must be a number > 0, got {initial_lr!r}")
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, (int, float)) \
                or warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be a number > 0, got {warmup_epochs!r}")
        if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int)
                                            or steps_per_epoch < 1):
            raise ValueError(f"steps_per_epoch must be an int >= 1 or None, got "
                             f"{steps_per_epoch!r}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = float(warmup_epochs)
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def learning_rate(self, epoch: float) -> float:
        """The rate at a fractional ``epoch`` (``initial_lr`` after the warm-up)."""
        if epoch >= self.warmup_epochs:
            return self.initial_lr
        n = basics.size()
        return self.initial_lr / n * (epoch * (n - 1) / self.warmup_epochs + 1)

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError("LearningRateWarmupCallback could not find the number of "
                                 "steps per epoch: pass steps_per_epoch=")
        momentum = getattr(self.model.optimizer, "momentum", 0.0)
        if self.momentum_correction and isinstance(momentum, float) and momentum > 0:
            warnings.warn("LearningRateWarmupCallback: momentum_correction is not applied "
                          "with Keras 3 (momentum is compiled into the train step)",
                          stacklevel=2)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        epoch = self.current_epoch + batch / self.steps_per_epoch
        if epoch <= self.warmup_epochs:
            self.model.optimizer.learning_rate = self.learning_rate(epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))
        if self.verbose and epoch + 1 == int(np.ceil(self.warmup_epochs)) \
                and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{self.initial_lr:g}.")
