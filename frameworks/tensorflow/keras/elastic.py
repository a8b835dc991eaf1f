"""``dlcomm.tensorflow.keras.elastic``: Horovod's ``hvd.elastic`` for Keras. The states of
``dlcomm.tensorflow.elastic`` (``KerasState`` is ``TensorFlowKerasState``) and the callbacks
that drive them from ``model.fit``: commit every N batches and keep ``state.batch`` and
``state.epoch`` current, so that a re-formed job resumes ``fit`` where it stopped."""
from __future__ import annotations

import keras

from dlcomm.elastic import HostsUpdatedInterrupt, ObjectState, PeerLostError, State, run
from dlcomm.tensorflow.elastic import TensorFlowKerasState, TensorFlowState

KerasState = TensorFlowKerasState

__all__ = ["CommitStateCallback", "HostsUpdatedInterrupt", "KerasState", "ObjectState",
           "PeerLostError", "State", "TensorFlowKerasState", "TensorFlowState",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


def _check_state(state: State) -> None:
    if not isinstance(state, State):
        raise TypeError(f"state must be a dlcomm elastic State, got {type(state).__name__}")


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` after every ``batches_per_commit`` batches (put it after the
    ``Update*StateCallback``s, so the commit holds the current batch and epoch). With
    ``steps_per_execution > 1`` Keras calls batch callbacks once per execution."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        _check_state(state)
        if (isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int)
                or batches_per_commit < 1):
            raise ValueError(f"batches_per_commit must be an int >= 1, got "
                             f"{batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` the number of batches of the current epoch done (0 at an
    epoch's end), e.g. to skip them when ``fit`` starts again after a failure."""

    def __init__(self, state: State) -> None:
        super().__init__()
        _check_state(state)
        self.state = state

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` the number of epochs done; pass ``initial_epoch=state.epoch``
    to ``fit`` so that it resumes from there."""

    def __init__(self, state: State) -> None:
        super().__init__()
        _check_state(state)
        self.state = state

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch + 1
