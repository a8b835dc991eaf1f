"""Train a small Gluon CNN on real handwritten digits with dlcomm's MXNet adapter:
``make demo-mxnet``, or ``.venv-mxnet/bin/dlcommrun -np 2 .venv-mxnet/bin/python
examples/gluon_mnist.py``.

The data ships inside a pip package (no download at run time): scikit-learn's 8x8 digits
(1,797 images; a fifth held out). Each rank trains on its own shard; the held-out accuracy
is counted across ranks. The four Horovod lines are marked ``# dlcomm``.
"""
from __future__ import annotations

import argparse
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import dlcomm.mxnet as hvd  # dlcomm


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """Images as float32 (N, 1, 8, 8) in [0, 1] and labels as float32 (Gluon's loss wants them)."""
    from sklearn.datasets import load_digits as sklearn_digits

    d = sklearn_digits()
    return (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8), d.target.astype(np.float32)


def make_net() -> gluon.nn.HybridSequential:
    """Two convolutions, two dense layers: about 30k parameters."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Conv2D(32, 3, padding=1, activation="relu"), gluon.nn.MaxPool2D(2),
            gluon.nn.Flatten(), gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(10))
    return net


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the rank count")
    p.add_argument("--compression", default=None,
                   help="none, fp16, or a dlcomm compressor spec such as topk:ratio=0.01 "
                        "(default: DLCOMM_COMPRESSION, else none)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch-size must be >= 1 and --lr > 0")
    return args


def main() -> None:
    args = parse_args()
    hvd.init()  # dlcomm
    rank, size = hvd.rank(), hvd.size()
    mx.random.seed(args.seed + rank)  # different on purpose: the broadcast fixes it

    x, y = load_digits()
    order = np.random.default_rng(0).permutation(len(x))
    n_test = len(x) // 5
    test_idx, train_idx = order[:n_test], order[n_test:]

    net = make_net()
    net.initialize(mx.init.Xavier())
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)  # dlcomm (deferred: after the first batch)
    trainer = hvd.DistributedTrainer(params, "sgd",  # dlcomm
                                     {"learning_rate": args.lr * size, "momentum": 0.9},
                                     compression=args.compression)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    steps_per_epoch = len(train_idx) // (args.batch_size * size)
    if rank == 0:
        print(f"dlcomm MXNet example: {size} ranks, digits ({len(train_idx)} train / "
              f"{n_test} held-out images), {steps_per_epoch} steps per epoch", flush=True)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        perm = np.random.default_rng(args.seed + epoch).permutation(train_idx)
        mine = perm[rank::size][:steps_per_epoch * args.batch_size]  # equal shards
        running = 0.0
        for step in range(steps_per_epoch):
            idx = mine[step * args.batch_size:(step + 1) * args.batch_size]
            data, label = mx.nd.array(x[idx]), mx.nd.array(y[idx])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(args.batch_size)  # gradients averaged over ranks here
            running += loss.mean().asscalar()
        shard = test_idx[rank::size]
        correct = (net(mx.nd.array(x[shard])).argmax(axis=1) == mx.nd.array(y[shard])).sum()
        stats = hvd.allreduce(mx.nd.array([running / steps_per_epoch, correct.asscalar()]),
                              name="epoch_stats", op=hvd.Sum)
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {stats[0].asscalar() / size:.4f}, held-out "
                  f"accuracy {stats[1].asscalar() / n_test:.4f}", flush=True)
    elapsed = time.perf_counter() - start

    flat = mx.nd.concat(*[p.data().reshape((-1,)) for p in params.values()], dim=0)
    everyone = hvd.allgather(flat.reshape((1, -1)), name="final_params").asnumpy()
    identical = all(np.array_equal(everyone[0], other) for other in everyone)
    if rank == 0:
        print(f"final held-out accuracy: {stats[1].asscalar() / n_test:.4f} "
              f"({args.epochs} epochs in {elapsed:.1f} s)")
        print(f"parameters identical on all {size} ranks: {'yes' if identical else 'NO'}")
    hvd.shutdown()
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
