"""A Keras elastic job for the elastic tests: a small dense model on scikit-learn's digits,
trained with ``train_on_batch`` (a compiled graph function, which wraps dlcomm's errors in
TensorFlow's) inside ``@hvd.elastic.run``, committing every 5 steps. Each worker appends
its ``start`` and ``commit`` lines to ``<dir>/<worker>.log``; rank 0 of the last round
writes ``<dir>/result.json``."""
from __future__ import annotations

import json
import os
import sys
import time

import keras
import numpy as np
from sklearn.datasets import load_digits

import dlcomm.tensorflow.keras as hvd

STEPS = 100


def main(out: str) -> None:
    hvd.init()
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hvd.elastic.TensorFlowKerasState(model, step=0)
    worker = os.environ.get("DLCOMM_ELASTIC_WORKER", "w:h:0").split(":")[0]

    def log(line: str) -> None:
        with open(f"{out}/{worker}.log", "a") as f:
            f.write(line + "\n")

    @hvd.elastic.run
    def train(state: hvd.elastic.TensorFlowKerasState) -> None:
        log(f"start {state.step} {hvd.size()}")
        while state.step < STEPS:
            rank, size = hvd.rank(), hvd.size()
            idx = np.random.default_rng(state.step).permutation(len(x))[:32 * size][rank::size]
            model.train_on_batch(x[idx], y[idx])
            if size > 1:  # time for the test to kill a worker mid-job; alone, none needed
                time.sleep(0.02)
            state.step += 1
            if state.step % 5 == 0:
                state.commit()
                log(f"commit {state.step} {os.getpid()}")

    train(state)
    sums = hvd.allgather_object(float(sum(np.sum(v.numpy()) for v in model.variables)))
    if hvd.rank() == 0:
        with open(f"{out}/result.json", "w") as f:
            json.dump({"ranks": hvd.size(), "identical": len(set(sums)) == 1,
                       "steps": state.step}, f)


if __name__ == "__main__":
    main(sys.argv[1])
