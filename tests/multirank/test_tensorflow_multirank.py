"""The TensorFlow adapter on real ranks: every call (eager and inside tf.function) against a
numpy reference, DistributedGradientTape and the Keras DistributedOptimizer against
single-process training on the concatenated batches, broadcast of differently initialised
models, the Keras callbacks, and clear errors.

TensorFlow takes tens of seconds to import, so one 2-rank job runs every section; each
section prints PASS or FAIL with its traceback and the tests below read that report.
"""
import re

import pytest
from framework_required import require_framework
from mpi_run import run_mpi

require_framework("tensorflow", install="make install-tensorflow")

NP = 2
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0",
         # a rank left waiting (a collective only some ranks run) fails the job, not hangs it
         "DLCOMM_STALL_SHUTDOWN_SECONDS": "180",
         "CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "tensorflow"}

SCRIPT = r'''
import sys, time, traceback, warnings
import numpy as np
import tensorflow as tf
import keras
import dlcomm.tensorflow as hvd
import dlcomm.tensorflow.keras as khvd

hvd.init()
r, n = hvd.rank(), hvd.size()
SECTIONS = sys.argv[1].split(",")


def section(fn):
    if fn.__name__ not in SECTIONS:
        return fn
    start = time.perf_counter()
    try:
        fn()
        print(f"PASS {fn.__name__} rank {r} ({time.perf_counter() - start:.1f} s)", flush=True)
    except Exception:
        print(f"FAIL {fn.__name__} rank {r}\n{traceback.format_exc()}", flush=True)
    hvd.barrier()
    return fn


def close(a, b, what, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=what)


def same_on_all_ranks(values, what):
    flat = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in values])
    gathered = hvd.allgather_object(flat)
    for k, g in enumerate(gathered):
        assert np.array_equal(g, flat), f"{what}: rank {k} differs from rank {r}"


RANKS = np.arange(n, dtype=np.float64)


def check_collectives(run, tag):
    """run(fn, *args) calls fn eagerly or inside a tf.function."""
    t = tf.fill((3, 2), float(r))
    close(run(lambda x: hvd.allreduce(x), t), np.full((3, 2), RANKS.mean()), tag + " average")
    close(run(lambda x: hvd.allreduce(x, op=hvd.Sum), t), np.full((3, 2), RANKS.sum()),
          tag + " sum")
    close(run(lambda x: hvd.allreduce(x, average=False), t), np.full((3, 2), RANKS.sum()),
          tag + " average=False")
    close(run(lambda x: hvd.allreduce(x, op=hvd.Max), t), np.full((3, 2), n - 1), tag + " max")
    close(run(lambda x: hvd.allreduce(x, op=hvd.Min), t), np.zeros((3, 2)), tag + " min")
    close(run(lambda x: hvd.allreduce(x, op=hvd.Product), t + 1),
          np.full((3, 2), np.prod(RANKS + 1)), tag + " product")
    close(run(lambda x: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25),
              t), np.full((3, 2), RANKS.sum() * 0.5), tag + " pre/postscale")
    close(run(lambda x: hvd.allreduce(x, compression=hvd.Compression.fp16), t),
          np.full((3, 2), RANKS.mean()), tag + " fp16")
    bf = run(lambda x: hvd.allreduce(tf.cast(x, tf.bfloat16), op=hvd.Sum), t)
    assert bf.dtype == tf.bfloat16, bf.dtype
    close(tf.cast(bf, tf.float32), np.full((3, 2), RANKS.sum()), tag + " bfloat16")
    i64 = run(lambda x: hvd.allreduce(tf.cast(x, tf.int64), op=hvd.Sum), t)
    assert i64.dtype == tf.int64 and int(i64[0, 0]) == RANKS.sum()
    g = run(lambda x: hvd.grouped_allreduce([x, tf.ones(4)], op=hvd.Sum), t)
    close(g[0], np.full((3, 2), RANKS.sum()), tag + " grouped 0")
    close(g[1], np.full(4, n), tag + " grouped 1")
    # every engine compressor is reachable; with the same tensor on each rank the compressed
    # average is exact for the ones without randomness/sign loss
    same = tf.linspace(-1.0, 1.0, 12)
    for spec in ("topk:ratio=0.5", "powersgd:rank=2", "qsgd", "efsignsgd", "gtopk:ratio=0.25",
                 "bf16", "randomk:ratio=0.5", "signum", "acpsgd:rank=2"):
        out = run(lambda x, s=spec: hvd.allreduce(x, compression=hvd.Compression.lookup(s)),
                  same)
        assert out.shape == (12,) and out.dtype == tf.float32, (spec, out)
        same_on_all_ranks([out], f"{tag} {spec}")
    out = run(lambda x: hvd.allreduce(x, compression=hvd.Compression.topk), same)
    same_on_all_ranks([out], tag + " Compression.topk")
    # allgather (uneven rows), broadcast, alltoall, reducescatter
    rows = tf.fill((r + 1, 2), r)
    expected = np.concatenate([np.full((k + 1, 2), k) for k in range(n)])
    ag = run(lambda x: hvd.allgather(x), rows)
    assert ag.dtype == tf.int32 and np.array_equal(ag, expected), ag
    bools = run(lambda x: hvd.allgather(x), tf.fill((1,), r % 2 == 0))
    assert bools.dtype == tf.bool and bools.numpy().tolist() == [k % 2 == 0 for k in range(n)]
    close(run(lambda x: hvd.broadcast(x, root_rank=n - 1), t), np.full((3, 2), n - 1),
          tag + " broadcast")
    # as Horovod: the output alone without splits, (output, received splits) with them
    out = run(lambda x: hvd.alltoall(x), tf.range(n, dtype=tf.float32) + 10.0 * r)
    close(out, [10.0 * k + r for k in range(n)], tag + " alltoall")
    out, recv = run(lambda x: hvd.alltoall(x, splits=[1] * n),
                    tf.range(n, dtype=tf.float32) + 10.0 * r)
    close(out, [10.0 * k + r for k in range(n)], tag + " alltoall")
    assert recv.numpy().tolist() == [1] * n
    # uneven splits: rank r sends k+1 rows to rank k
    src = tf.fill((sum(k + 1 for k in range(n)), 1), float(r))
    out, recv = run(lambda x: hvd.alltoall(x, splits=[k + 1 for k in range(n)]), src)
    assert recv.numpy().tolist() == [r + 1] * n
    close(out[:, 0], np.repeat(RANKS, r + 1), tag + " alltoall splits")
    rs = run(lambda x: hvd.reducescatter(x, op=hvd.Sum), tf.ones((2 * n, 3)))
    close(rs, np.full((2, 3), n), tag + " reducescatter")
    rs = run(lambda x: hvd.reducescatter(x), tf.fill((2 * n, 3), float(r)))
    close(rs, np.full((2, 3), RANKS.mean()), tag + " reducescatter average")


@section
def collectives_eager():
    check_collectives(lambda fn, x: fn(x), "eager")
    # a tf.IndexedSlices in a grouped all-reduce is all-gathered (Horovod), the rest fused
    rows = tf.IndexedSlices(tf.fill((2, 3), float(r + 1)), tf.constant([r, r + 1]))
    dense = tf.fill((4,), float(r))
    out = hvd.grouped_allreduce([dense, rows, 2.0 * dense], op=hvd.Sum)
    close(out[0], np.full(4, RANKS.sum()), "grouped dense beside slices")
    close(out[2], np.full(4, 2 * RANKS.sum()), "grouped dense beside slices")
    assert isinstance(out[1], tf.IndexedSlices)
    close(out[1].indices, np.concatenate([[k, k + 1] for k in range(n)]), "slices indices")
    close(out[1].values, np.repeat(RANKS + 1, 2)[:, None] * np.ones(3), "slices values")
    only = hvd.grouped_allreduce([rows])  # Average
    close(only[0].values, np.repeat(RANKS + 1, 2)[:, None] * np.ones(3) / n, "slices average")
    for kwargs in ({"op": hvd.Min}, {"op": hvd.Sum, "prescale_factor": 0.5},
                   {"op": hvd.Sum, "postscale_factor": 2.0}):
        for call in (lambda: hvd.allreduce(rows, **kwargs),
                     lambda: hvd.grouped_allreduce([dense, rows], **kwargs)):
            try:
                call()
            except NotImplementedError:
                pass
            else:
                raise AssertionError(f"IndexedSlices with {kwargs} was accepted")


@section
def collectives_in_tf_function():
    check_collectives(lambda fn, x: tf.function(fn)(x), "tf.function")
    # several collectives in one graph, run twice (names fixed at trace time)
    @tf.function
    def many(x):
        a = hvd.allreduce(x, op=hvd.Sum)
        b = hvd.allgather(x)
        c = hvd.broadcast(x, root_rank=0)
        hvd.barrier()
        return a, b, c
    for _ in range(2):
        a, b, c = many(tf.fill((2,), float(r)))
        close(a, np.full(2, RANKS.sum()), "graph sum")
        close(b, np.repeat(RANKS, 2), "graph gather")
        close(c, np.zeros(2), "graph broadcast")


@section
def gradients_of_collectives():
    x = tf.Variable(tf.fill((2, 3), float(r + 1)))
    w = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    # d/dx sum(w * allreduce_sum(x)) on this rank = sum over ranks of w = n * w
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(w * hvd.allreduce(x, op=hvd.Sum))
    close(tape.gradient(y, x), n * w, "allreduce grad")
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(w * hvd.allreduce(x))
    close(tape.gradient(y, x), w, "allreduce average grad")
    # allgather and broadcast follow Horovod: the gradient averaged over ranks (the
    # derivative of the mean of the ranks' losses), this rank's rows of it / on the root
    xr = tf.Variable(tf.fill((r + 1, 2), float(r + 1)))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.allgather(xr) ** 2)
    close(tape.gradient(y, xr), 2 * (r + 1) * np.ones((r + 1, 2)), "allgather grad")
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(w * hvd.broadcast(x, root_rank=0))
    close(tape.gradient(y, x), w if r == 0 else np.zeros((2, 3)), "broadcast grad")
    # alltoall sends the gradient back; reduce-scatter all-gathers it (times n for Sum)
    xa = tf.Variable(tf.fill((2 * n, 3), float(r)))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tf.range(2 * n, dtype=tf.float32)[:, None] * hvd.alltoall(xa))
    # rank j's output row 2r+i is my row 2j+i, weighted 2r+i there
    close(tape.gradient(y, xa), np.repeat(np.tile([2.0 * r, 2.0 * r + 1], n)[:, None], 3, 1),
          "alltoall grad")
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(hvd.reducescatter(xa, op=hvd.Sum))
    close(tape.gradient(y, xa), np.full((2 * n, 3), float(n)), "reducescatter grad")



@section
def gradients_in_a_v1_graph():
    # Horovod's TF1 path (test_horovod_broadcast_grad_cpu): tf.gradients in a Graph run by a
    # Session. A non-root rank's broadcast gradient is zeros, but it must still take part in
    # the all-reduce the root's gradient waits for (a bare zeros_like of a known shape is a
    # constant in a graph: the root then waited forever).
    graph = tf.Graph()
    with graph.as_default():
        x = tf.ones((5, 5)) * float(r)
        for root in range(n):
            y = hvd.broadcast(x, root_rank=root, name=f"v1graph.broadcast.{root}")
            grad = tf.gradients(y, x, tf.ones((5, 5)))[0]
            with tf.compat.v1.Session(graph=graph) as sess:
                out = sess.run(grad)
            close(out, np.full((5, 5), 1.0 if r == root else 0.0), f"v1 broadcast grad {root}")
        # Horovod's TF1 recipe: broadcast_global_variables() after initialising them
        v = tf.compat.v1.Variable(tf.fill((3,), float(r + 1)), name="v1graph_var")
        bcast = hvd.broadcast_global_variables(root_rank=n - 1)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            close(sess.run(v), np.full(3, float(n)), "broadcast_global_variables")
    assert hvd._executing_eagerly()
    try:
        hvd.broadcast_global_variables(0)
    except RuntimeError as e:
        assert "broadcast_variables" in str(e), e
    else:
        raise AssertionError("broadcast_global_variables ran eagerly")

@section
def objects_barrier_join_ranks():
    assert hvd.broadcast_object({"r": r}, root_rank=1 % n) == {"r": 1 % n}
    assert hvd.allgather_object(r) == list(range(n))
    hvd.barrier()
    assert hvd.join() in range(n)
    assert 0 <= hvd.local_rank() < hvd.local_size() and hvd.cross_size() >= 1
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    assert khvd.rank() == r and khvd.size() == n
    close(khvd.allreduce(float(r)), RANKS.mean(), "keras allreduce")
    close(khvd.allgather(np.array([r])), RANKS, "keras allgather")
    close(khvd.broadcast(np.array([r, r]), root_rank=0), [0, 0], "keras broadcast")
    # Horovod returns tf.Tensors eagerly: .numpy() works on each
    assert khvd.allgather(tf.constant([float(r)])).numpy().tolist() == RANKS.tolist()
    assert isinstance(khvd.allreduce(float(r)), tf.Tensor)
    close(khvd.reducescatter(np.ones((2 * n, 2)), op=hvd.Sum).numpy(), np.full((2, 2), n),
          "keras reducescatter")


def model_fn(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="tanh"),
                             keras.layers.Dense(3)])


def batch(step, rank, micro=0, size=8):
    rng = np.random.default_rng(1000 * step + 10 * rank + micro)
    return (rng.standard_normal((size, 10)).astype(np.float32),
            rng.integers(0, 3, size).astype(np.int64))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def optimizer(kind):
    return (keras.optimizers.SGD(0.1, momentum=0.9) if kind == "sgd"
            else keras.optimizers.Adam(0.01))


@section
def tape_equals_single_process():
    for kind in ("sgd", "adam"):
        for compiled in (False, True):
            for groups in ((0,) if compiled else (2,)):
                model, ref = model_fn(), model_fn()
                opt, ref_opt = optimizer(kind), optimizer(kind)

                def step(x, y):
                    with tf.GradientTape() as tape:
                        loss = LOSS(y, model(x, training=True))
                    tape = hvd.DistributedGradientTape(tape, num_groups=groups)
                    grads = tape.gradient(loss, model.trainable_variables)
                    opt.apply_gradients(zip(grads, model.trainable_variables))
                    return loss

                step_fn = tf.function(step) if compiled else step
                for s in range(4):
                    step_fn(*batch(s, r))
                    xs = np.concatenate([batch(s, k)[0] for k in range(n)])
                    ys = np.concatenate([batch(s, k)[1] for k in range(n)])
                    with tf.GradientTape() as tape:
                        loss = LOSS(ys, ref(xs, training=True))
                    ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables),
                                                ref.trainable_variables))
                for v, w in zip(model.weights, ref.weights):
                    close(v, w, f"tape {kind} compiled={compiled} groups={groups} {v.path}",
                          rtol=1e-4, atol=1e-5)
                same_on_all_ranks(model.get_weights(), "tape weights")


@section
def tape_compression_and_sum():
    for compression in (hvd.Compression.fp16, hvd.Compression.lookup("topk:ratio=0.5"),
                        "powersgd:rank=2", "efsignsgd"):
        model, opt = model_fn(), keras.optimizers.SGD(0.1)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = LOSS(y, model(x))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        for s in range(3):
            step(*batch(s, r))
        same_on_all_ranks(model.get_weights(), f"compression {compression}")
    # op=Sum: gradients are summed, not averaged
    x = tf.Variable(tf.ones(3))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(x * float(r + 1))
    g = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(y, x)
    close(g, np.full(3, (RANKS + 1).sum()), "tape Sum")
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(x * float(r + 1))
    g = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0).gradient(y, [x])
    close(g[0], np.full(3, (RANKS + 1).mean()), "tape predivide")
    # sparse (embedding) gradients: all-gathered, or densified with sparse_as_dense
    emb = keras.layers.Embedding(10, 4)
    emb.build((None,))
    for sparse_as_dense in (False, True):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(emb(tf.constant([r, 5])))
        g = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense).gradient(
            y, emb.embeddings)
        dense = tf.convert_to_tensor(g).numpy()
        expected = np.zeros((10, 4))
        for k in range(n):
            expected[[k, 5]] += 1.0 / n
        close(dense, expected, f"sparse_as_dense={sparse_as_dense}")


def keras_data(rank, steps, size):
    xs, ys = zip(*(batch(s, rank, size=size) for s in range(steps)))
    return np.concatenate(xs), np.concatenate(ys)


@section
def keras_fit_equals_single_process_and_broadcast_fixes_init():
    steps, size = 4, 8
    for kind in ("sgd", "adam"):
        model = model_fn(seed=100 + r)  # a different initialisation on every rank
        model.compile(optimizer=khvd.DistributedOptimizer(optimizer(kind)), loss=LOSS)
        root_weights = hvd.broadcast_object(model.get_weights(), root_rank=0)
        x, y = keras_data(r, steps, size)
        model.fit(x, y, batch_size=size, epochs=2, shuffle=False, verbose=0,
                  callbacks=[khvd.callbacks.BroadcastGlobalVariablesCallback(0),
                             khvd.callbacks.MetricAverageCallback()])
        ref = model_fn()
        ref.set_weights(root_weights)
        ref.compile(optimizer=optimizer(kind), loss=LOSS)
        # one reference step = the n ranks' batches of that step, concatenated
        parts = [keras_data(k, steps, size) for k in range(n)]
        xs = np.concatenate([np.concatenate([p[0][s * size:(s + 1) * size] for p in parts])
                             for s in range(steps)])
        ys = np.concatenate([np.concatenate([p[1][s * size:(s + 1) * size] for p in parts])
                             for s in range(steps)])
        ref.fit(xs, ys, batch_size=size * n, epochs=2, shuffle=False, verbose=0)
        for v, w in zip(model.weights, ref.weights):
            close(v, w, f"keras fit {kind} {v.path}", rtol=1e-4, atol=1e-5)
        assert int(model.optimizer.iterations) == 2 * steps
        same_on_all_ranks(model.get_weights(), "keras weights")


@section
def keras_backward_passes_and_apply():
    passes, size = 2, 8
    for average in (True, False):
        model, ref = model_fn(), model_fn()
        opt = khvd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                        backward_passes_per_step=passes,
                                        average_aggregated_gradients=average)
        ref_opt = keras.optimizers.SGD(0.05)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = LOSS(y, model(x))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply(grads, model.trainable_variables)

        for s in range(2):
            for m in range(passes):
                step(*batch(s, r, m, size))
            # reference: mean loss over every rank's micro-batches, times passes if summed
            xs = np.concatenate([batch(s, k, m, size)[0] for k in range(n) for m in range(passes)])
            ys = np.concatenate([batch(s, k, m, size)[1] for k in range(n) for m in range(passes)])
            with tf.GradientTape() as tape:
                loss = LOSS(ys, ref(xs)) * (1.0 if average else passes)
            ref_opt.apply(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables)
        for v, w in zip(model.weights, ref.weights):
            close(v, w, f"passes average={average} {v.path}", rtol=1e-4, atol=1e-5)
        assert int(opt.iterations) == 2
    # compression through the Keras optimizer stays identical across ranks
    model = model_fn()
    model.compile(optimizer=khvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1), compression=khvd.Compression.lookup("topk:ratio=0.3"),
        num_groups=2), loss=LOSS)
    x, y = keras_data(r, 3, 8)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    same_on_all_ranks(model.get_weights(), "keras topk")


@section
def broadcast_variables_fixes_models():
    model = model_fn(seed=7 + r)
    opt = keras.optimizers.Adam(0.01 * (r + 1))
    opt.build(model.trainable_variables)
    opt.apply([tf.ones_like(v) * (r + 1) for v in model.trainable_variables],
              model.trainable_variables)
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(opt.variables, root_rank=0)
    same_on_all_ranks(model.get_weights(), "model after broadcast_variables")
    same_on_all_ranks([v.numpy() for v in opt.variables], "optimizer after broadcast")
    v = tf.Variable(tf.fill((3,), float(r)))
    tf.function(lambda: hvd.broadcast_variables([v], root_rank=n - 1))()
    close(v, np.full(3, n - 1), "broadcast_variables in tf.function")


@section
def callbacks_metric_average_and_warmup():
    cb = khvd.callbacks.MetricAverageCallback()
    logs = {"loss": float(r), "acc": 2.0 * r}
    cb.on_epoch_end(0, logs)
    close([logs["loss"], logs["acc"]], [RANKS.mean(), 2 * RANKS.mean()], "metric average")
    model = model_fn()
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(float(model.optimizer.learning_rate)))
    warm = khvd.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    x, y = keras_data(r, 4, 8)
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[warm, record])
    def warm_lr(epoch):
        return 0.4 if epoch >= 2 else 0.4 / n * (epoch * (n - 1) / 2 + 1)
    expected = [warm_lr(e + b / 4) for e in range(3) for b in range(4)]
    close(seen, expected, "warmup schedule", rtol=1e-6)


@section
def horovod_style_keras_script():
    # as horovod's Keras docs show a user; only the import differs
    hv = khvd
    rng = np.random.default_rng(123)
    X = rng.standard_normal((512, 8)).astype(np.float32)
    Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)
    keras.utils.set_random_seed(hv.rank())
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    opt = keras.optimizers.SGD(0.05 * hv.size(), momentum=0.9)
    opt = hv.DistributedOptimizer(opt, compression=hv.Compression.fp16)
    model.compile(optimizer=opt, loss=LOSS, metrics=["accuracy"])
    callbacks = [hv.callbacks.BroadcastGlobalVariablesCallback(0),
                 hv.callbacks.MetricAverageCallback(),
                 hv.callbacks.LearningRateWarmupCallback(initial_lr=0.05 * hv.size(),
                                                         warmup_epochs=2, verbose=0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hist = model.fit(X[hv.rank()::hv.size()], Y[hv.rank()::hv.size()], batch_size=32,
                         epochs=10, callbacks=callbacks, verbose=0)
    acc = hv.allreduce(model.evaluate(X, Y, verbose=0)[1], name="avg_accuracy")
    if hv.rank() == 0:
        print(f"accuracy {float(acc):.3f}", flush=True)
    assert float(acc) > 0.9, acc
    assert "lr" in hist.history


@section
def horovod_suite_lessons():
    """What Horovod's own test_tensorflow.py found (docs/compatibility.md)."""
    import pytest
    # broadcast_ in a TF1 graph returns what runs the assignment (the variable itself would
    # be read without it ever running)
    graph = tf.Graph()
    with graph.as_default():
        var = tf.compat.v1.Variable(tf.fill((4,), float(r)), name="inplace_var")
        out, = hvd.broadcast_([var], n - 1, name="lessons.broadcast_")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            close(sess.run(out), np.full(4, float(n - 1)), "graph broadcast_ result")
            close(sess.run(var), np.full(4, float(n - 1)), "graph broadcast_ variable")
    # a grouped op's gradient given in another dtype (float32 for float64 tensors)
    xs = [tf.Variable(tf.ones((2 * n, 3), tf.float64) * (k + 1)) for k in range(3)]
    with tf.GradientTape(persistent=True) as tape:
        outs = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    g = tape.gradient(outs[1], xs[1], tf.ones((2, 3)))
    close(g, np.full((2 * n, 3), float(n)), "grouped reducescatter grad, float32 dy")
    with tf.GradientTape(persistent=True) as tape:
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum)
    close(tape.gradient(outs[0], xs[0], tf.ones((2 * n, 3))), np.full((2 * n, 3), float(n)),
          "grouped allreduce grad, float32 dy")
    # argument errors: TensorFlow's error classes, as Horovod raises them
    with pytest.raises(tf.errors.InvalidArgumentError, match="not divisible"):
        hvd.alltoall(tf.ones((2 * n + 1, 2)))
    with pytest.raises(ValueError, match="not divisible"):  # and still dlcomm's ValueError
        hvd.alltoall(tf.ones((2 * n + 1, 2)))
    sparse = tf.IndexedSlices(tf.ones((1, 3)), tf.constant([r]))
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        with pytest.raises(NotImplementedError):
            hvd.allreduce(sparse, op=op)
    # local sources (model parallelism): not all-reduced, divided by the rank count
    shared = tf.Variable(tf.ones(3))
    local = tf.Variable(tf.ones(2))
    for scale in (True, False):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(shared * float(r + 1)) + tf.reduce_sum(local * float(r + 1))
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale)
        tape.register_local_source(local)
        gs, gl = tape.gradient(y, [shared, local])
        close(gs, np.full(3, (RANKS + 1).mean()), "shared source averaged")
        close(gl, np.full(2, (r + 1) / (n if scale else 1)), f"local source, scale={scale}")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(model(tf.ones((1, 3)) * float(r + 1)))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=model.layers[0],
                                              scale_local_gradients=False)
    local_pairs, global_pairs = tape.get_local_and_global_gradients(
        y, model.trainable_variables)
    assert [id(v) for v, _ in local_pairs] == [id(v) for v in model.layers[0].trainable_weights]
    assert [id(v) for v, _ in global_pairs] == [id(v) for v in model.layers[1].trainable_weights]
    same_on_all_ranks([g.numpy() for _, g in global_pairs], "partial tape: global gradients")
    with pytest.raises(ValueError, match="Keras layers"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[object()])


@section
def errors_are_clear():
    import pytest
    with pytest.raises(TypeError, match="tf.Tensor"):
        hvd.allreduce(object())
    with pytest.raises(TypeError, match="string.*cannot reduce|cannot reduce"):
        hvd.allreduce(tf.constant(["a"]))
    with pytest.raises(TypeError, match="cannot move"):
        hvd.allgather(tf.constant([1 + 2j]))
    with pytest.raises(ValueError, match="out of range"):
        hvd.broadcast(tf.ones(2), root_rank=n)
    with pytest.raises(ValueError, match="out of range"):
        tf.function(lambda x: hvd.broadcast(x, root_rank=-1))(tf.ones(2))
    with pytest.raises(ValueError, match="scalar"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(ValueError, match="average= .*or op="):
        hvd.allreduce(tf.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="one dtype"):
        hvd.grouped_allreduce([tf.ones(2), tf.ones(2, tf.float64)])
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(tf.ones(4), splits=[4] * (n + 1))
    with pytest.raises(ValueError, match="unknown compressor|valid"):
        hvd.allreduce(tf.ones(2), compression="zip")
    with pytest.raises(TypeError, match="floating-point"):
        hvd.allreduce(tf.ones(2, tf.int32), compression="topk")
    with pytest.raises(TypeError, match="tf.GradientTape"):
        hvd.DistributedGradientTape(object())
    with pytest.raises(ValueError, match="not meaningful"):
        with tf.GradientTape() as tape:
            pass
        hvd.DistributedGradientTape(tape, op=hvd.Max)
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer"):
        khvd.DistributedOptimizer("sgd")
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        khvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        khvd.DistributedOptimizer(keras.optimizers.SGD(), gradient_predivide_factor=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor needs"):
        khvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Sum,
                                  gradient_predivide_factor=2.0)
    # a LossScaleOptimizer is accepted (tests/multirank/test_tensorflow_loss_scale.py), but
    # not with accumulation: its overflow check would see one micro-batch only
    with pytest.raises(ValueError, match="LossScaleOptimizer takes backward_passes_per_step=1"):
        khvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                                  backward_passes_per_step=2)
    with pytest.raises(ValueError, match="out of range"):
        khvd.callbacks.BroadcastGlobalVariablesCallback(n)
    with pytest.raises(ValueError, match="initial_lr"):
        khvd.callbacks.LearningRateWarmupCallback(initial_lr=0)
    with pytest.raises(TypeError, match="list of variables"):
        hvd.broadcast_variables(tf.Variable(1.0))
    with pytest.raises(ValueError, match="session"):
        hvd.broadcast_object(1, session=object())
    # shapes that differ across ranks: an error naming the tensor and each rank's shape,
    # eagerly (DLCommError) and from a graph (the same text inside TensorFlow's error)
    with pytest.raises(hvd.DLCommError) as info:
        hvd.allreduce(tf.ones((2, 3 + r)), name="mismatch.eager")
    msg = str(info.value)
    assert "mismatch.eager" in msg and "(2, 3)" in msg and "(2, 4)" in msg, msg
    # ... which is also the TensorFlow error Horovod raises for it
    assert isinstance(info.value, hvd.MismatchError)
    assert isinstance(info.value, tf.errors.FailedPreconditionError)
    with pytest.raises(tf.errors.FailedPreconditionError, match="mismatch.dtype"):
        hvd.broadcast(tf.ones(3, tf.float32 if r else tf.float64), 0, name="mismatch.dtype")
    with pytest.raises(tf.errors.OpError) as info:
        tf.function(lambda x: hvd.allreduce(x, name="mismatch.graph"))(tf.ones((2, 3 + r)))
    msg = str(info.value)
    assert "mismatch.graph" in msg and "(2, 3)" in msg and "(2, 4)" in msg, msg
    # a model whose shapes differ across ranks, through the tape
    model = keras.Sequential([keras.Input((3 + r,)), keras.layers.Dense(2)])
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(model(tf.ones((1, 3 + r))))
    with pytest.raises(hvd.DLCommError, match="kernel"):
        hvd.DistributedGradientTape(tape).gradient(y, model.trainable_variables)
'''

SECTIONS = [
    "collectives_eager", "collectives_in_tf_function", "gradients_of_collectives",
    "gradients_in_a_v1_graph",
    "objects_barrier_join_ranks", "tape_equals_single_process", "tape_compression_and_sum",
    "keras_fit_equals_single_process_and_broadcast_fixes_init",
    "keras_backward_passes_and_apply", "broadcast_variables_fixes_models",
    "callbacks_metric_average_and_warmup", "horovod_style_keras_script",
    "horovod_suite_lessons", "errors_are_clear",
]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Run every section once on NP ranks; return each rank's output (its stdout, then its
    stderr: never one stream of several ranks, whose lines interleave)."""
    proc = run_mpi(NP, SCRIPT, tmp_path_factory.mktemp("tf"), timeout=540, env=QUIET,
                   args=[",".join(SECTIONS)])
    return [out + err for out, err in zip(proc.rank_stdout, proc.rank_stderr)]


@pytest.mark.parametrize("name", SECTIONS)
def test_section_passes_on_every_rank(report, name):
    assert len(report) == NP
    for r, text in enumerate(report):
        failures = re.findall(rf"FAIL {name} rank {r}\n.*?(?=\n(?:PASS|FAIL) |\Z)", text, re.S)
        assert not failures, "\n".join(failures)
        passed = re.findall(rf"PASS {name} rank (\d+)", text)
        assert passed == [str(r)], text[-4000:]
