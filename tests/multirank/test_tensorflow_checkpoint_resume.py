"""Compression state in Keras checkpoints (issue 27 item 1): on 2 ranks, a Keras run stopped
after 4 steps (``model.save_weights``, one file per rank) and resumed in a new process
(``model.load_weights``) ends with exactly the weights of the run that went through all 8
steps, for topk and powersgd (the first layer is above the 1024 elements below which a
compressor sends dense); resuming from the same files with the compression state deleted
from them does not (so the test can fail)."""
from __future__ import annotations

from checkpoint_phases import assert_resume_equals_full, run_phases
from framework_required import require_framework

require_framework("tensorflow", install="make install-tensorflow")

SPECS = ["topk:ratio=0.2", "powersgd:rank=2"]
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0",
         "CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "tensorflow"}

SCRIPT = r'''
import shutil
import sys
import warnings
import h5py
import numpy as np
import keras
import tensorflow as tf
import dlcomm.tensorflow as hvd
import dlcomm.tensorflow.keras as khvd

phase, out_dir, specs = sys.argv[1], sys.argv[2], sys.argv[3].split(";")
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
r = hvd.rank()
rng = np.random.default_rng(100 + r)
X = rng.standard_normal((64, 24)).astype("float32")
Y = rng.integers(0, 4, 64)
for spec in specs:
    tag = spec.replace(":", "_").replace("=", "_")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((24,)), keras.layers.Dense(72, activation="relu"),
                              keras.layers.Dense(4)])
    opt = khvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                    compression=spec)
    model.compile(optimizer=opt,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    path = f"{out_dir}/ckpt_{tag}_{r}.weights.h5"
    first = 0
    if phase in ("resume", "resume_plain"):
        if phase == "resume_plain":  # the same file without the compression state
            plain = f"{out_dir}/plain_{tag}_{r}.weights.h5"
            shutil.copy(path, plain)
            with h5py.File(plain, "a") as f:
                group = f["optimizer/vars"]
                for key in [k for k in group if k.startswith("dlcomm")]:
                    del group[key]
            path = plain
        model.optimizer.build(model.trainable_variables)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.load_weights(path)
        first = 4
    for step in range(first, 8):
        idx = slice(8 * step % 64, 8 * step % 64 + 8)
        model.train_on_batch(X[idx], Y[idx])
        if phase == "full" and step == 3:  # the checkpoint, on the way
            model.save_weights(path)
    flat = np.concatenate([w.reshape(-1) for w in model.get_weights()])
    np.save(f"{out_dir}/{phase}_{tag}_{r}.npy", flat)
print("OK", flush=True)
'''


def test_keras_resume_from_checkpoint_equals_the_uninterrupted_run(tmp_path):
    ranks = 2
    run_phases(ranks, SCRIPT, tmp_path, ";".join(SPECS), timeout=400, env=QUIET)
    for spec in SPECS:
        tag = spec.replace(":", "_").replace("=", "_")
        assert_resume_equals_full(tmp_path, ranks, tag, spec, state_matters=True)
