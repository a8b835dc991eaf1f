"""The MXNet adapter on real ranks: every call against a numpy reference, DistributedTrainer
and DistributedOptimizer against single-process training on the concatenated batches,
broadcast of differently initialised models, and clear errors.

MXNet 1.9.1 needs numpy < 2, so these tests run in the MXNet environment
(``make test-mxnet``); elsewhere they skip with the reason, and with ``CI`` set they fail.
"""
import re

from framework_required import require_framework
from mpi_run import REPO, run_mpi

require_framework("dlcomm.mxnet", install="make install-mxnet")

import pytest  # noqa: E402

# MXNet's worker threads and OpenMP would fight over the cores the ranks share.
ENV = {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1"}

API_SCRIPT = r'''
import numpy as np
import mxnet as mx
import dlcomm
import dlcomm.mxnet as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
ranks = np.arange(n, dtype=np.float64)

def data(rank, shape=(3, 2), dtype="float32"):
    return (np.arange(np.prod(shape)).reshape(shape) + 10 * rank + 1).astype(dtype)

def same(nd, expected, exact=True):
    assert isinstance(nd, mx.nd.NDArray), type(nd)
    got = nd.asnumpy()
    assert got.dtype == np.asarray(expected).dtype, (got.dtype, np.asarray(expected).dtype)
    assert got.shape == np.asarray(expected).shape, (got.shape, np.asarray(expected).shape)
    if exact:
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

everyone = [data(k) for k in range(n)]
mine = mx.nd.array(everyone[r], dtype="float32")
# allreduce: every op, against numpy over every rank's data; the input stays unchanged
same(hvd.allreduce(mine, name="avg"), np.mean(everyone, axis=0).astype(np.float32), False)
same(mine, everyone[r])
same(hvd.allreduce(mine, name="sum", op=hvd.Sum), np.sum(everyone, axis=0))
same(hvd.allreduce(mine, average=False, name="avg_flag"), np.sum(everyone, axis=0))
same(hvd.allreduce(mine, average=True, name="avg_flag2"),
     np.mean(everyone, axis=0).astype(np.float32), False)
same(hvd.allreduce(mine, name="min", op=hvd.Min), np.min(everyone, axis=0))
same(hvd.allreduce(mine, name="max", op=hvd.Max), np.max(everyone, axis=0))
same(hvd.allreduce(mine, name="prod", op=hvd.Product), np.prod(everyone, axis=0), False)
same(hvd.allreduce(mine, name="scaled", op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
     np.sum(everyone, axis=0) * 0.5, False)
same(hvd.allreduce(mine, name="prio", priority=-3, op=hvd.Sum), np.sum(everyone, axis=0))
for dtype in ("float64", "float16", "int32", "int64", "uint8", "int8"):
    vals = [data(k, (5,), dtype) for k in range(n)]
    same(hvd.allreduce(mx.nd.array(vals[r], dtype=dtype), name=f"dt.{dtype}", op=hvd.Sum),
         np.sum(vals, axis=0).astype(dtype))
# fp16 compression keeps the dtype and rounds through float16
f16 = [v.astype(np.float16) for v in everyone]
same(hvd.allreduce(mine, name="fp16", op=hvd.Sum, compression=hvd.Compression.fp16),
     np.sum(f16, axis=0).astype(np.float16).astype(np.float32))
# a core compressor gives what the core gives on the same numpy data
big = [np.random.default_rng(k).standard_normal((64, 64)).astype(np.float32) for k in range(n)]
got = hvd.allreduce(mx.nd.array(big[r]), name="topk",
                    compression=hvd.Compression.lookup("topk:ratio=0.25"))
ref = dlcomm.allreduce(big[r], name="topk.ref", compression="topk:ratio=0.25")
same(got, ref)
assert not np.allclose(ref, np.mean(big, axis=0))  # it really compressed
# in place: the same NDArray object, its own memory, also for a slice of a bigger array
u = mx.nd.array(everyone[r])
assert hvd.allreduce_(u, name="inplace", op=hvd.Sum) is u
same(u, np.sum(everyone, axis=0))
parent = mx.nd.zeros((3, 3, 2))
parent[1] = mx.nd.array(everyone[r])
hvd.allreduce_(parent[1], name="slice", op=hvd.Max)
same(parent[1], np.max(everyone, axis=0))
same(parent[0], np.zeros((3, 2), np.float32))
v = mx.nd.array(everyone[r]) * 1  # pending MXNet work on the input is waited for
h = hvd.allreduce_async_(v, name="async_", op=hvd.Sum)
assert hvd.synchronize(h) is v and hvd.poll(h)
same(v, np.sum(everyone, axis=0))
h = hvd.allreduce_async(mine, name="async", op=hvd.Min)
same(hvd.synchronize(h), np.min(everyone, axis=0))
# 0-d and mxnet.numpy arrays
scalar = hvd.allreduce(mx.nd.array([float(r)], dtype="float64").reshape(()), name="0d",
                       op=hvd.Sum)
assert scalar.shape == () and scalar.asscalar() == ranks.sum()
npx = hvd.allreduce(mx.np.array(everyone[r]), name="npx", op=hvd.Sum)
assert isinstance(npx, mx.np.ndarray)
np.testing.assert_array_equal(npx.asnumpy(), np.sum(everyone, axis=0))
# grouped
g = hvd.grouped_allreduce([mine, mx.nd.ones((2,)) * r], name="grp", op=hvd.Sum)
same(g[0], np.sum(everyone, axis=0))
same(g[1], np.full((2,), ranks.sum(), np.float32))
gi = [mx.nd.array(everyone[r]), mx.nd.ones((4,))]
out = hvd.grouped_allreduce_(gi, name="grp_", op=hvd.Average)
assert out[0] is gi[0] and out[1] is gi[1]
same(gi[0], np.mean(everyone, axis=0).astype(np.float32), False)
same(gi[1], np.ones(4, np.float32))
hvd.synchronize(hvd.grouped_allreduce_async_(gi, name="grp_async", op=hvd.Sum))
same(gi[1], np.full(4, n, np.float32))
# allgather: different first dimensions, ints and bools
rows = [np.full((k + 1, 2), k, dtype=np.int64) for k in range(n)]
same(hvd.allgather(mx.nd.array(rows[r], dtype="int64"), name="ag"), np.concatenate(rows))
flags = [np.array([k % 2 == 0, True]) for k in range(n)]
same(hvd.allgather(mx.nd.array(flags[r], dtype="bool"), name="ag_bool"), np.concatenate(flags))
# broadcast
same(hvd.broadcast(mine, root_rank=n - 1, name="bc"), everyone[n - 1])
same(mine, everyone[r])
bi = mx.nd.array(everyone[r])
assert hvd.broadcast_(bi, 0, name="bc_") is bi
same(bi, everyone[0])
bj = mx.nd.array(everyone[r])
hvd.synchronize(hvd.broadcast_async_(bj, 1 % n, name="bc_async"))
same(bj, everyone[1 % n])
# alltoall, as horovod.mxnet: the rows received, rank by rank
send = np.arange(n, dtype=np.float32) + 10 * r
same(hvd.alltoall(mx.nd.array(send), name="a2a"), np.array([10.0 * k + r for k in range(n)],
                                                           np.float32))
splits = [k + 1 for k in range(n)]  # rank j gets j+1 rows from everyone
rows_out = np.arange(sum(splits), dtype=np.float32) + 100 * r
got, received = hvd.alltoall(mx.nd.array(rows_out), splits=mx.nd.array(splits, dtype="int32"),
                             name="a2a2")  # with splits, also the received splits
assert received.asnumpy().tolist() == [r + 1] * n
start = sum(splits[:r])
same(got, np.concatenate([np.arange(sum(splits), dtype=np.float32)[start:start + r + 1]
                          + 100 * k for k in range(n)]))
# reducescatter
block = np.stack([data(k, (2 * n, 3)) for k in range(n)])
same(hvd.reducescatter(mx.nd.array(block[r]), name="rs", op=hvd.Sum),
     block.sum(axis=0)[2 * r:2 * r + 2])
same(hvd.reducescatter(mx.nd.array(block[r]), hvd.Sum, "rs.positional"),  # Horovod's order
     block.sum(axis=0)[2 * r:2 * r + 2])
parts = hvd.grouped_reducescatter([mx.nd.array(block[r]), mx.nd.array(block[r])], op=hvd.Sum)
same(parts[1], block.sum(axis=0)[2 * r:2 * r + 2])
gathered = hvd.grouped_allgather([mx.nd.array(block[r][:r + 1])], name="gag")
same(gathered[0], np.concatenate([block[k][:k + 1] for k in range(n)]))
# objects, barrier, join, ranks
assert hvd.broadcast_object({"r": r}, root_rank=1 % n) == {"r": 1 % n}
assert hvd.allgather_object(r) == list(range(n))
hvd.barrier()
assert hvd.join() in range(n)
assert hvd.size() == n and 0 <= hvd.local_rank() < hvd.local_size() and hvd.cross_size() >= 1
assert hvd.is_initialized() and hvd.mpi_enabled()

# broadcast_parameters: differently initialised Gluon models end up equal to rank 0's
def flat_params(params):
    return np.concatenate([p.data().asnumpy().ravel() for _, p in sorted(params.items())])

mx.random.seed(r)
net = mx.gluon.nn.HybridSequential()
net.add(mx.gluon.nn.Dense(5, in_units=4), mx.gluon.nn.BatchNorm(in_channels=5))
net.initialize(mx.init.Uniform())
before = hvd.allgather_object(flat_params(net.collect_params()))
assert not np.array_equal(before[0], before[1])  # really different before
hvd.broadcast_parameters(net.collect_params(), root_rank=0)
after = hvd.allgather_object(flat_params(net.collect_params()))
assert all(np.array_equal(before[0], x) for x in after)
# deferred initialisation: broadcast right after the first forward pass
mx.random.seed(100 + r)
lazy = mx.gluon.nn.Dense(3)
lazy.initialize(mx.init.Uniform())
hvd.broadcast_parameters(lazy.collect_params(), root_rank=n - 1, prefix="lazy.")
lazy(mx.nd.ones((2, 6)))
mine_lazy = flat_params(lazy.collect_params())
all_lazy = hvd.allgather_object(mine_lazy)
assert all(np.array_equal(all_lazy[n - 1], x) for x in all_lazy)
# a dict of NDArrays (the Module API's arg_params)
arg_params = {"w": mx.nd.array(everyone[r]), "b": mx.nd.ones((2,), dtype="int32") * r}
hvd.broadcast_parameters(arg_params, root_rank=1 % n, prefix="dict.")
same(arg_params["w"], everyone[1 % n])
same(arg_params["b"], np.full(2, 1 % n, np.int32))
print(f"OK {r}", flush=True)
'''

TRAIN_SCRIPT = r'''
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
import dlcomm.mxnet as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
B = 8
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

def model_fn(dtype="float32"):
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, in_units=10, activation="tanh"), gluon.nn.Dense(3, in_units=16))
    mx.random.seed(1)
    net.initialize(mx.init.Xavier())
    net.cast(dtype)
    return net

def batch(step, rank, dtype="float32"):
    g = np.random.default_rng(1000 * step + 10 * rank)
    return (mx.nd.array(g.standard_normal((B, 10)), dtype=dtype),
            mx.nd.array(g.integers(0, 3, B), dtype=dtype))

def full_batch(step, dtype="float32"):
    xs, ys = zip(*(batch(step, k, dtype) for k in range(n)))
    return mx.nd.concat(*xs, dim=0), mx.nd.concat(*ys, dim=0)

def backward(net, x, y):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()

def params_of(net):
    return [p.data().astype("float64").asnumpy() for p in net.collect_params().values()]

def check_equal(net, ref, what, rtol=1e-4, atol=1e-5):
    for a, b in zip(params_of(net), params_of(ref)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=what)
    flat = np.concatenate([a.ravel() for a in params_of(net)])
    gathered = hvd.allgather_object(flat)
    assert all(np.array_equal(gathered[0], g) for g in gathered), f"{what}: ranks differ"

OPTIMIZERS = {"sgd": ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
              "adam": ("adam", {"learning_rate": 0.01})}

# DistributedTrainer == gluon.Trainer on the concatenated batches
for kind in ("sgd", "adam"):
    for num_groups, predivide in ((0, 1.0), (2, 1.0), (0, 2.0)):
        name, opt_params = OPTIMIZERS[kind]
        net, ref = model_fn(), model_fn()
        trainer = hvd.DistributedTrainer(net.collect_params(), name, dict(opt_params),
                                         num_groups=num_groups,
                                         gradient_predivide_factor=predivide)
        ref_trainer = gluon.Trainer(ref.collect_params(), name, dict(opt_params), kvstore=None)
        for step in range(5):
            backward(net, *batch(step, r))
            trainer.step(B)
            backward(ref, *full_batch(step))
            ref_trainer.step(n * B)
        check_equal(net, ref, f"DistributedTrainer {kind} groups={num_groups} pre={predivide}")

# allreduce_grads() + clipping + update(), as in Horovod's gradient clipping recipe
net, ref = model_fn(), model_fn()
trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.5}, kvstore=None)
for step in range(3):
    backward(net, *batch(step, r))
    trainer.allreduce_grads()  # summed over ranks: the gradient of the concatenated batch
    gluon.utils.clip_global_norm([p.grad() for p in net.collect_params().values()], 1.0)
    trainer.update(B)
    backward(ref, *full_batch(step))
    gluon.utils.clip_global_norm([p.grad() for p in ref.collect_params().values()], 1.0)
    ref_trainer.update(n * B)
check_equal(net, ref, "allreduce_grads + clip + update")

# DistributedOptimizer inside gluon.Trainer(kvstore=None) (MXNet's aggregated list updates)
for kind, make in (("sgd", lambda: mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)),
                   ("adam", lambda: mx.optimizer.Adam(learning_rate=0.01))):
    net, ref = model_fn(), model_fn()
    trainer = gluon.Trainer(net.collect_params(), hvd.DistributedOptimizer(make()),
                            kvstore=None)
    ref_trainer = gluon.Trainer(ref.collect_params(), make(), kvstore=None)
    for step in range(5):
        backward(net, *batch(step, r))
        trainer.step(B)
        backward(ref, *full_batch(step))
        ref_trainer.step(n * B)
    check_equal(net, ref, f"DistributedOptimizer in Trainer {kind}")

# DistributedOptimizer through an Updater, one index at a time (the Module API's path)
for num_groups in (0, 1):
    w0 = np.random.default_rng(7).standard_normal((10, 3)).astype(np.float32)
    weights = {k: mx.nd.array(w0) for k in ("dist", "ref")}
    for w in weights.values():
        w.attach_grad()
    upd = mx.optimizer.get_updater(hvd.DistributedOptimizer(
        mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, rescale_grad=1.0 / B),
        num_groups=num_groups))
    ref_upd = mx.optimizer.get_updater(
        mx.optimizer.SGD(learning_rate=0.05, momentum=0.9, rescale_grad=1.0 / (n * B)))
    for step in range(4):
        for key, (x, y), u in (("dist", batch(step, r), upd), ("ref", full_batch(step), ref_upd)):
            w = weights[key]
            with autograd.record():
                loss = ((mx.nd.dot(x, w) - y.reshape((-1, 1))) ** 2).sum()
            loss.backward()
            u(0, w.grad, w)
    np.testing.assert_allclose(weights["dist"].asnumpy(), weights["ref"].asnumpy(),
                               rtol=1e-4, atol=1e-5, err_msg=f"Updater groups={num_groups}")

# update_multi_precision: float16 weights with float32 master copies (MXNet's CPU has no
# float16 Dense, so a hand-written linear model)
w0 = np.random.default_rng(8).standard_normal(10).astype(np.float16)
weights = {k: mx.nd.array(w0, dtype="float16") for k in ("dist", "ref")}
for w in weights.values():
    w.attach_grad()
upd = mx.optimizer.get_updater(hvd.DistributedOptimizer(
    mx.optimizer.SGD(learning_rate=0.05, multi_precision=True, rescale_grad=1.0 / B)))
ref_upd = mx.optimizer.get_updater(
    mx.optimizer.SGD(learning_rate=0.05, multi_precision=True, rescale_grad=1.0 / (n * B)))
for step in range(3):
    for key, (x, y), u in (("dist", batch(step, r, "float16"), upd),
                           ("ref", full_batch(step, "float16"), ref_upd)):
        w = weights[key]
        with autograd.record():
            pred = mx.nd.broadcast_mul(x, w.reshape((1, -1))).sum(axis=1)
            loss = ((pred - y) ** 2).sum()
        loss.backward()
        u(0, w.grad, w)
assert weights["dist"].dtype == np.float16
np.testing.assert_allclose(weights["dist"].asnumpy().astype(np.float32),
                           weights["ref"].asnumpy().astype(np.float32), rtol=1e-2, atol=1e-2,
                           err_msg="multi-precision")
assert not np.array_equal(weights["dist"].asnumpy(), w0)

# compression: fp16 close to the reference, engine compressors train; ranks stay identical
for compression in (hvd.Compression.fp16, hvd.Compression.lookup("topk:ratio=0.5"),
                    "powersgd:rank=2", hvd.Compression.efsignsgd):
    net, ref = model_fn(), model_fn()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                     compression=compression)
    ref_trainer = gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1},
                                kvstore=None)
    for step in range(3):
        backward(net, *batch(step, r))
        trainer.step(B)
        backward(ref, *full_batch(step))
        ref_trainer.step(n * B)
    if compression is hvd.Compression.fp16:
        check_equal(net, ref, "fp16", rtol=1e-2, atol=1e-3)
    else:
        flat = np.concatenate([a.ravel() for a in params_of(net)])
        gathered = hvd.allgather_object(flat)
        assert all(np.array_equal(gathered[0], g) for g in gathered), compression
        ref_flat = np.concatenate([a.ravel() for a in params_of(ref)])
        assert np.abs(flat - ref_flat).max() < 0.5, compression  # trained, not diverged
print(f"OK {r}", flush=True)
'''

ERRORS_SCRIPT = r'''
import warnings
import numpy as np
import pytest
import mxnet as mx
from mxnet import autograd, gluon
import dlcomm.mxnet as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
with pytest.raises(TypeError, match="mxnet NDArray"):
    hvd.allreduce([1.0])
with pytest.raises(TypeError, match="mxnet NDArray"):
    hvd.allreduce_(np.ones(3))
with pytest.raises(ValueError, match="sparse"):
    hvd.allreduce(mx.nd.ones((3, 2)).tostype("csr"))
with pytest.raises(ValueError, match="out of range"):
    hvd.broadcast(mx.nd.ones(2), root_rank=n)
with pytest.raises(ValueError, match="average= .* or op="):
    hvd.allreduce(mx.nd.ones(2), average=True, op=hvd.Sum)
with pytest.raises(TypeError, match="priority"):
    hvd.allreduce(mx.nd.ones(2), priority="high")
with pytest.raises(TypeError, match="list of NDArrays"):
    hvd.grouped_allreduce(mx.nd.ones(2))
with pytest.raises(TypeError, match="tensors\\[1\\]"):
    hvd.grouped_allreduce_([mx.nd.ones(2), "x"])
with pytest.raises(TypeError, match="compression"):
    hvd.allreduce(mx.nd.ones(2), compression="fp16")
with pytest.raises(ValueError, match="unknown reduce op"):
    hvd.allreduce(mx.nd.ones(2), op="median")
with pytest.raises(TypeError, match="ParameterDict or a dict"):
    hvd.broadcast_parameters([mx.nd.ones(2)])
with pytest.raises(TypeError, match="parameter 'w'"):
    hvd.broadcast_parameters({"w": np.ones(2)})
with pytest.raises(ValueError, match="out of range"):
    hvd.broadcast_parameters({"w": mx.nd.ones(2)}, root_rank=-1)
with pytest.raises(TypeError, match="mx.optimizer.Optimizer"):
    hvd.DistributedOptimizer("sgd")
with pytest.raises(ValueError, match="already a DistributedOptimizer"):
    hvd.DistributedOptimizer(hvd.DistributedOptimizer(mx.optimizer.SGD()))
with pytest.raises(ValueError, match="gradient_predivide_factor"):
    hvd.DistributedOptimizer(mx.optimizer.SGD(), gradient_predivide_factor=0)
with pytest.raises(ValueError, match="num_groups"):
    hvd.DistributedOptimizer(mx.optimizer.SGD(), num_groups=-1)
with pytest.raises(ValueError, match="unknown compressor|valid"):
    hvd.DistributedOptimizer(mx.optimizer.SGD(), compression="zip")
net = gluon.nn.Dense(2, in_units=3)
net.initialize()
with pytest.raises(TypeError, match="prefix"):
    hvd.DistributedTrainer(net.collect_params(), "sgd", prefix=3)
with pytest.raises(ValueError, match="unknown compressor|valid"):
    hvd.DistributedTrainer(net.collect_params(), "sgd", compression="zip")
# a DistributedOptimizer given to DistributedTrainer is unwrapped, with a warning
wrapped = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1))
with pytest.warns(UserWarning, match="unwrapped"):
    t = hvd.DistributedTrainer(net.collect_params(), wrapped)
assert not isinstance(t._optimizer, hvd.DistributedOptimizer)
# a model whose shapes differ across ranks: an error naming the request, the parameter and
# each rank's shape, on every rank (not a hang)
other = gluon.nn.Dense(2, in_units=3 + r, prefix="other_")
other.initialize()
trainer = hvd.DistributedTrainer(other.collect_params(), "sgd", {"learning_rate": 0.1})
with autograd.record():
    loss = other(mx.nd.ones((2, 3 + r))).sum()
loss.backward()
with pytest.raises(hvd.DLCommError) as info:
    trainer.step(2)
msg = str(info.value)
assert "DistributedTrainer.grad" in msg and "other_weight" in msg, msg
assert "rank 0: (2, 3)" in msg and "rank 1: (2, 4)" in msg, msg
print(f"OK {r}", flush=True)
'''

HOROVOD_STYLE_SCRIPT = r'''
# Written as horovod's MXNet docs show a user; only the import line differs.
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
import dlcomm.mxnet as hvd

hvd.init()
mx.random.seed(hvd.rank())
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(2))
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
params = net.collect_params()
hvd.broadcast_parameters(params, root_rank=0)   # deferred: broadcast after the first batch
trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.05 * hvd.size(),
                                                 "momentum": 0.9},
                                 compression=hvd.Compression.fp16)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
g = np.random.default_rng(123)
X = g.standard_normal((512, 8)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.float32)
shard = slice(hvd.rank(), None, hvd.size())
Xs, Ys = mx.nd.array(X[shard]), mx.nd.array(Y[shard])
for epoch in range(20):
    for i in range(0, Xs.shape[0], 32):
        data, label = Xs[i:i + 32], Ys[i:i + 32]
        with autograd.record():
            loss = loss_fn(net(data), label)
        loss.backward()
        trainer.step(data.shape[0])
acc = (net(mx.nd.array(X)).argmax(axis=1) == mx.nd.array(Y)).mean()
acc = hvd.allreduce(acc, name="avg_accuracy")
if hvd.rank() == 0:
    print(f"accuracy {acc.asscalar():.3f}", flush=True)
assert acc.asscalar() > 0.9
'''


@pytest.mark.parametrize("np_", [2, 3])
def test_distributed_trainer_and_optimizer_equal_single_process(np_, tmp_path):
    proc = run_mpi(np_, TRAIN_SCRIPT, tmp_path, timeout=400, env=ENV)
    assert proc.count_per_rank("OK") == [1] * np_, proc.report()


def test_every_function_against_reference(tmp_path):
    proc = run_mpi(4, API_SCRIPT, tmp_path, timeout=300, env=ENV)
    assert proc.count_per_rank("OK") == [1] * 4, proc.report()


def test_errors_are_clear(tmp_path):
    proc = run_mpi(2, ERRORS_SCRIPT, tmp_path, timeout=180, env=ENV)
    assert proc.count_per_rank("OK") == [1] * 2, proc.report()


def test_horovod_style_script_runs_with_only_the_import_changed(tmp_path):
    proc = run_mpi(2, HOROVOD_STYLE_SCRIPT, tmp_path, timeout=240, env=ENV)
    assert "accuracy" in proc.rank_stdout[0], proc.report()  # rank 0 prints the average


def test_gluon_example_learns_the_digits(tmp_path):
    script = (REPO / "examples" / "gluon_mnist.py").read_text()
    proc = run_mpi(2, script, tmp_path, timeout=300, env=ENV, args=["--epochs", "6"])
    summary = proc.rank_stdout[0]  # rank 0 prints the summary
    accuracy = float(re.search(r"final held-out accuracy: ([0-9.]+)", summary).group(1))
    assert accuracy > 0.9, proc.report()
    assert "parameters identical on all 2 ranks: yes" in summary, proc.report()
