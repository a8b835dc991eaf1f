"""Keras' LossScaleOptimizer under dlcomm's DistributedOptimizer on real ranks: a
mixed_bfloat16 model (float32 variables), one rank's gradients made non-finite at two steps;
every rank must skip exactly those steps, halve the same scale and end with identical
variables, also when a compressor may drop the inf (randomk keeping 1% of the elements), and
a skipped step clears the compressor's error-feedback memory, where the inf went. One 3-rank
job runs both compressions in turn, each writing its results, or its error, per rank."""

import pytest
from framework_required import require_framework
from mpi_run import run_mpi
from shared_job import read_rank_results

require_framework("tensorflow", install="make install-tensorflow")

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0",
         "CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "tensorflow"}

SCRIPT = r'''
import json, sys, traceback
import numpy as np
import tensorflow as tf
import keras
import dlcomm.tensorflow as hvd
import dlcomm.tensorflow.keras as khvd

out, compressions = sys.argv[1], sys.argv[2].split(";")
hvd.init()
r, n = hvd.rank(), hvd.size()


def run(case, compression):
    keras.utils.set_random_seed(1)
    policy = keras.mixed_precision.DTypePolicy("mixed_bfloat16")
    # every variable (1280 elements) is above the compressors' bypass size, so randomk
    # compresses all of them and may drop the one inf below
    model = keras.Sequential([
        keras.Input((40,)),
        keras.layers.Dense(32, activation="relu", use_bias=False, dtype=policy),
        keras.layers.Dense(40, use_bias=False, dtype=policy)])
    assert all(v.dtype == "float32" for v in model.trainable_variables)  # fp32 master weights
    inner = keras.optimizers.SGD(0.05)
    opt = khvd.DistributedOptimizer(
        keras.optimizers.LossScaleOptimizer(inner, initial_scale=1024.0, dynamic_growth_steps=3),
        compression=compression)
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


    @tf.function
    def train_step(x, y, poison):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x), tf.float32))
            # poison = inf makes exactly one gradient element inf (the first kernel's [0, 0])
            loss = loss + model.layers[0].kernel[0, 0] * poison
            scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)


    inject = {2: 1 % n, 5: n - 1}  # step -> the one rank whose gradients overflow
    compressor = opt._dlcomm.allreducer.engine_compressor


    def memory_finite(state):
        # error-feedback residuals (and any other float state) hold no inf/NaN
        if isinstance(state, dict):
            return all(memory_finite(v) for v in state.values())
        if isinstance(state, (list, tuple)):
            return all(memory_finite(v) for v in state)
        a = np.asarray(state)
        return not np.issubdtype(a.dtype, np.floating) or bool(np.isfinite(a).all())


    stepped, scales, finite = [], [], []
    for step in range(8):
        rng = np.random.default_rng(100 * step + r)
        x = rng.normal(size=(3 + 2 * r, 40)).astype("float32")
        y = rng.integers(0, 40, size=3 + 2 * r)
        before = [v.numpy().copy() for v in model.trainable_variables]
        train_step(x, y, tf.constant(np.inf if inject.get(step) == r else 0.0, tf.float32))
        stepped.append(any(not np.array_equal(b, v.numpy())
                           for b, v in zip(before, model.trainable_variables)))
        scales.append(float(opt.dynamic_scale.numpy()))
        finite.append(compressor is None or memory_finite(compressor.state_dict()))
    flat = np.concatenate([v.numpy().ravel() for v in model.trainable_variables])
    with open(f"{out}/case{case}.rank{r}.json", "w") as f:
        json.dump({"stepped": stepped, "scales": scales, "finite": finite,
                   "params": flat.tolist()}, f)


# one job runs every compression in turn (a fresh model and optimizer each): one start-up of
# MPI and TensorFlow instead of one per compression
for case, compression in enumerate(compressions):
    try:
        run(case, compression)
    except Exception:  # recorded for this compression's test; the next ones still run
        with open(f"{out}/case{case}.rank{r}.json", "w") as f:
            json.dump({"error": traceback.format_exc()}, f)
'''

COMPRESSIONS = ["none", "randomk:ratio=0.01,ef=1"]
# 3 ranks: the two overflowing ranks (1 at step 2, 2 at step 5) differ, and each rank count
# costs a start-up of MPI and TensorFlow
NP = 3


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("loss_scale")
    run_mpi(NP, SCRIPT, out, timeout=500, env=QUIET, args=[str(out), ";".join(COMPRESSIONS)])
    return out


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_loss_scale_optimizer_ranks_skip_together(compression, job):
    results = read_rank_results(job, NP, compression,
                                lambda c, r: f"case{COMPRESSIONS.index(c)}.rank{r}.json")
    for r, res in enumerate(results):
        assert res["stepped"] == [True, True, False, True, True, False, True, True], (r, res)
        assert res["scales"] == results[0]["scales"], r
        # a skipped step clears the compressor's memory, which took in the inf
        assert res["finite"] == [True] * 8, (r, res["finite"])
        assert res["params"] == results[0]["params"], f"rank {r} variables differ from rank 0"
    scales = results[0]["scales"]
    assert scales[2] == 512.0 and scales[5] < scales[4], scales
