"""Compression state in MXNet checkpoints (issue 27 item 1): on 2 ranks, a Gluon run stopped
after 4 steps (``net.save_parameters`` + ``trainer.save_states``, one set of files per rank)
and resumed in a new process (``load_parameters`` + ``load_states``) ends with exactly the
parameters of the run that went through all 8 steps, for topk and powersgd (the first layer
is above the 1024 elements below which a compressor sends dense); resuming from the same
files without the compressor's ``.dlcomm.npz`` does not (so the test can fail).

MXNet 1.9.1 needs numpy < 2: this runs in the MXNet environment (``make test-mxnet``)."""
from __future__ import annotations

from checkpoint_phases import assert_resume_equals_full, run_phases
from framework_required import require_framework

require_framework("dlcomm.mxnet", install="make install-mxnet")

SPECS = ["topk:ratio=0.2", "powersgd:rank=2"]
ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}

SCRIPT = r'''
import shutil
import sys
import warnings
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
import dlcomm.mxnet as hvd

phase, out_dir, specs = sys.argv[1], sys.argv[2], sys.argv[3].split(";")
hvd.init()
r = hvd.rank()
rng = np.random.default_rng(100 + r)
X = mx.nd.array(rng.standard_normal((64, 24)).astype("float32"))
Y = mx.nd.array(rng.integers(0, 4, 64).astype("float32"))
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for spec in specs:
    tag = spec.replace(":", "_").replace("=", "_")
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(72, activation="relu", in_units=24), gluon.nn.Dense(4, in_units=72))
    net.initialize(mx.init.Xavier())
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": 0.1, "momentum": 0.9},
                                     compression=spec)
    params, states = f"{out_dir}/net_{tag}_{r}.params", f"{out_dir}/trainer_{tag}_{r}.states"
    first = 0
    if phase in ("resume", "resume_plain"):
        net.load_parameters(params)
        if phase == "resume_plain":  # the same optimizer states, no compressor file beside
            plain = f"{out_dir}/plain_{tag}_{r}.states"
            shutil.copy(states, plain)
            states = plain
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.load_states(states)
        first = 4
    for step in range(first, 8):
        idx = slice(8 * step % 64, 8 * step % 64 + 8)
        with autograd.record():
            loss = loss_fn(net(X[idx]), Y[idx])
        loss.backward()
        trainer.step(8)
        if phase == "full" and step == 3:  # the checkpoint, on the way
            net.save_parameters(params)
            trainer.save_states(states)
    flat = np.concatenate([p.data().asnumpy().reshape(-1)
                           for _, p in sorted(net.collect_params().items())])
    np.save(f"{out_dir}/{phase}_{tag}_{r}.npy", flat)
print("OK", flush=True)
'''


def test_mxnet_resume_from_checkpoint_equals_the_uninterrupted_run(tmp_path):
    ranks = 2
    run_phases(ranks, SCRIPT, tmp_path, ";".join(SPECS), timeout=300, env=ENV)
    for spec in SPECS:
        tag = spec.replace(":", "_").replace("=", "_")
        assert_resume_equals_full(tmp_path, ranks, tag, spec, state_matters=True)
