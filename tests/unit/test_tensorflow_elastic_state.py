"""TensorFlow elastic state in one process (one rank, an MPI singleton; not an elastic job):
``TensorFlowState`` and ``TensorFlowKerasState`` roll back variables, a Keras model and its
(dlcomm-wrapped) optimizer bit for bit, ``sync()`` keeps one rank's values and builds an
optimizer Keras has not built yet, the dlcomm compression state is committed per rank, and
the Keras callbacks commit every N batches and keep ``state.batch``/``state.epoch``."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from framework_required import require_framework
from one_rank import one_rank_dlcomm

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
tf = require_framework("tensorflow", install="make install-tensorflow")
keras = require_framework("keras", install="make install-tensorflow")

import dlcomm  # noqa: E402 - after the framework check
import dlcomm.elastic  # noqa: E402
import dlcomm.tensorflow as hvd  # noqa: E402
import dlcomm.tensorflow.keras as khvd  # noqa: E402
from dlcomm.tensorflow.elastic import TensorFlowKerasState, TensorFlowState  # noqa: E402
from dlcomm.tensorflow.keras.elastic import (  # noqa: E402
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)


@pytest.fixture(scope="module", autouse=True)
def _one_rank() -> Iterator[None]:
    """``dlcomm.init()`` on this process alone (not an elastic job), shut down afterwards."""
    with one_rank_dlcomm():
        yield


X = np.random.default_rng(0).standard_normal((48, 6)).astype("float32")
Y = np.random.default_rng(1).integers(0, 3, 48)


def _model(compile_it: bool = True, compression: Any = None) -> Any:
    """A small classifier with a dlcomm ``DistributedOptimizer`` over SGD with momentum."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    if compile_it:
        optimizer = khvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                              compression=compression)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _train(model: Any, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        i = (step * 8) % len(X)
        model.train_on_batch(X[i:i + 8], Y[i:i + 8])


def _arrays(variables: list[Any]) -> list[np.ndarray]:
    return [np.array(v.numpy(), copy=True) for v in variables]


def _assert_equal(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        np.testing.assert_array_equal(a, e)


# --- the modules ------------------------------------------------------------------------------

def test_the_modules_export_horovods_names() -> None:
    assert hvd.elastic.run is dlcomm.elastic.run
    assert hvd.elastic.ObjectState is dlcomm.elastic.ObjectState
    assert hvd.elastic.State is dlcomm.elastic.State
    assert hvd.elastic.HostsUpdatedInterrupt is dlcomm.elastic.HostsUpdatedInterrupt
    assert hvd.elastic.PeerLostError is dlcomm.elastic.PeerLostError
    assert khvd.elastic.KerasState is hvd.elastic.TensorFlowKerasState
    assert khvd.elastic.TensorFlowState is hvd.elastic.TensorFlowState
    assert khvd.elastic.run is dlcomm.elastic.run


# --- TensorFlowState --------------------------------------------------------------------------

def test_tensorflow_state_restores_the_committed_variables() -> None:
    w = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    n = tf.Variable(np.int64(5))
    state = TensorFlowState([w, n], epoch=0)
    w.assign_add(tf.ones((2, 3)) / 3)
    n.assign(7)
    state.epoch = 1
    state.commit()
    committed = _arrays([w, n])
    w.assign(tf.random.normal((2, 3)))
    n.assign(9)
    state.epoch = 2
    state.restore()
    _assert_equal(_arrays([w, n]), committed)
    assert state.epoch == 1 and state.commits == 1


def test_tensorflow_state_sync_on_one_rank_keeps_the_values() -> None:
    w = tf.Variable([1.5, -2.0])
    state = TensorFlowState([w], epoch=3)
    state.commit()
    w.assign([4.0, 5.0])
    state.sync()
    np.testing.assert_array_equal(w.numpy(), [4.0, 5.0])
    assert state.epoch == 3 and state.commits == 1
    w.assign([0.0, 0.0])
    state.restore()  # sync saved what it synced
    np.testing.assert_array_equal(w.numpy(), [4.0, 5.0])


def test_tensorflow_state_without_variables_keeps_attributes() -> None:
    state = TensorFlowState(epoch=0, batch=2)
    state.epoch = 4
    state.commit()
    state.epoch, state.batch = 5, 0
    state.restore()
    assert (state.epoch, state.batch) == (4, 2)


@pytest.mark.parametrize("variables", [tf.Variable(1.0), 3, [tf.Variable(1.0), 2.0],
                                       [tf.constant(1.0)]])
def test_tensorflow_state_rejects_what_is_not_a_list_of_variables(variables: Any) -> None:
    with pytest.raises(TypeError, match="variable"):
        TensorFlowState(variables)


# --- TensorFlowKerasState ---------------------------------------------------------------------

def test_keras_state_restores_model_and_optimizer_bit_for_bit() -> None:
    model = _model()
    state = TensorFlowKerasState(model, epoch=0)
    assert state.optimizer is model.optimizer and model.optimizer.built
    _train(model, 3)
    state.epoch = 1
    state.commit()
    weights, slots = _arrays(model.variables), _arrays(model.optimizer.variables)
    assert int(model.optimizer.iterations.numpy()) == 3
    _train(model, 3, start=3)
    state.epoch = 2
    assert not np.array_equal(model.variables[0].numpy(), weights[0])
    state.restore()
    _assert_equal(_arrays(model.variables), weights)
    _assert_equal(_arrays(model.optimizer.variables), slots)
    assert state.epoch == 1 and int(model.optimizer.iterations.numpy()) == 3
    _train(model, 1, start=3)  # training goes on from the restored state
    assert int(model.optimizer.iterations.numpy()) == 4


def test_keras_state_sync_builds_an_unbuilt_optimizer_and_keeps_values() -> None:
    model = _model(compile_it=False)
    state = TensorFlowKerasState(model, epoch=5)  # no optimizer yet: compiled afterwards
    assert state.optimizer is None
    weights = _arrays(model.variables)
    optimizer = khvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    assert state.optimizer is optimizer and not optimizer.built
    state.sync()
    assert optimizer.built and len(optimizer.variables) > 2  # iterations, lr, momenta
    _assert_equal(_arrays(model.variables), weights)
    assert state.epoch == 5
    for v in optimizer.variables[2:]:
        assert not np.any(v.numpy())


def test_keras_state_takes_an_explicit_optimizer() -> None:
    model = _model(compile_it=False)
    optimizer = keras.optimizers.SGD(0.05, momentum=0.5)
    state = TensorFlowKerasState(model, optimizer, batch=0)
    assert state.optimizer is optimizer and optimizer.built
    committed = _arrays(optimizer.variables)
    optimizer.apply([tf.ones_like(v) for v in model.trainable_variables],
                    model.trainable_variables)
    state.restore()
    _assert_equal(_arrays(optimizer.variables), committed)


def test_keras_state_commits_the_compression_state_per_rank() -> None:
    keras.utils.set_random_seed(0)  # a layer of 2048 elements: above topk's dense threshold
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32), keras.layers.Dense(3)])
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                      compression="topk:ratio=0.2"),
                  loss="mse")
    state = TensorFlowKerasState(model)
    compressor = model.optimizer._dlcomm.allreducer.engine_compressor
    rng = np.random.default_rng(2)
    batches = [(rng.standard_normal((8, 64)).astype("float32"),
                rng.standard_normal((8, 3)).astype("float32")) for _ in range(4)]
    for x, y in batches[:2]:
        model.train_on_batch(x, y)
    state.commit()
    committed = compressor.state_dict()["states"]
    assert committed  # the residual of the 64x32 kernel
    for x, y in batches[2:]:
        model.train_on_batch(x, y)
    changed = compressor.state_dict()["states"]
    assert any(not np.array_equal(changed[k], v) for k, v in committed.items())
    state.restore()
    restored = compressor.state_dict()["states"]
    assert restored.keys() == committed.keys()
    for name, value in committed.items():
        np.testing.assert_array_equal(restored[name], value)


def test_keras_state_validates_its_arguments() -> None:
    with pytest.raises(TypeError, match="keras.Model"):
        TensorFlowKerasState("not a model")
    with pytest.raises(TypeError, match="keras.Model"):
        TensorFlowKerasState(None)
    with pytest.raises(TypeError, match="Optimizer"):
        TensorFlowKerasState(_model(), "sgd")
    with pytest.raises(ValueError, match="no variables"):
        TensorFlowKerasState(keras.Sequential([keras.layers.Dense(3)]))


def test_elastic_run_syncs_and_runs_a_keras_state() -> None:
    model = _model()
    state = TensorFlowKerasState(model, epoch=0)

    @hvd.elastic.run
    def train(state: TensorFlowKerasState, epochs: int) -> int:
        while state.epoch < epochs:
            _train(state.model, 2, start=2 * state.epoch)
            state.epoch += 1
            state.commit()
        return state.commits

    assert train(state, 2) == 2
    assert int(model.optimizer.iterations.numpy()) == 4


# --- callbacks --------------------------------------------------------------------------------

class _Record(keras.callbacks.Callback):
    """What the state holds after each batch (put after the elastic callbacks)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state, self.seen = state, []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.seen.append((self.state.epoch, self.state.batch, self.state.commits))


def test_callbacks_commit_every_n_batches_and_track_batch_and_epoch() -> None:
    model = _model()
    state = khvd.elastic.KerasState(model, epoch=0, batch=0)
    record = _Record(state)
    model.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[UpdateEpochStateCallback(state), UpdateBatchStateCallback(state),
                         CommitStateCallback(state, batches_per_commit=4), record])
    assert record.seen == [(0, b, b // 4) for b in range(1, 7)] + \
                         [(1, b, (6 + b) // 4) for b in range(1, 7)]
    assert (state.epoch, state.batch, state.commits) == (2, 0, 3)
    state.restore()  # the last commit: epoch 1, 6 batches after the 12th
    assert (state.epoch, state.batch) == (1, 6)


def test_callbacks_validate_their_arguments() -> None:
    with pytest.raises(TypeError, match="State"):
        CommitStateCallback(object())
    with pytest.raises(TypeError, match="State"):
        UpdateBatchStateCallback({"batch": 0})
    with pytest.raises(TypeError, match="State"):
        UpdateEpochStateCallback(None)
    state = TensorFlowState(batch=0)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="batches_per_commit"):
            CommitStateCallback(state, batches_per_commit=bad)
