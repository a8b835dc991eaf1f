"""Gradients of every differentiable torch collective on real ranks, against a numerical
reference: central differences of the objective the backward pass is the derivative of.

Rank r's loss is ``sum(w_r * y_r)`` with ``y_r`` its output of the collective and ``w_r`` a
rank-specific weight. Horovod's backward passes (which dlcomm keeps, docs/compatibility.md)
are the derivative of ``c * sum over ranks of the losses`` with ``c`` = 1 for all-reduce and
alltoall, 1/n for all-gather and broadcast, n for reduce-scatter. Every rank can rebuild
every rank's inputs, so it evaluates that objective in numpy and differentiates it
numerically with respect to its own inputs.
"""
import pytest
from mpi_run import run_mpi

pytest.importorskip("torch")

SCRIPT = r'''
import json, sys
import numpy as np
import torch
import dlcomm.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
out_dir = sys.argv[1]
EPS = 1e-3


def inputs(rank, rows, cols=3, seed=0):
    g = np.random.default_rng(100 * seed + rank)
    return g.standard_normal((rows, cols))


def weights(rank, shape, seed=0):
    return np.random.default_rng(10_000 + 100 * seed + rank).standard_normal(shape)


def scatter_rows(rows, parts):  # Horovod's split: the first rows % parts ranks get one more
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def check(name, xs, simulate, collective, factor):
    """xs: every rank's inputs (lists of arrays, one per tensor); simulate(xs) -> every
    rank's outputs; collective(tensors) -> this rank's outputs (tensors)."""
    ys = simulate(xs)
    ws = [[weights(k, y.shape, i) for i, y in enumerate(ys[k])] for k in range(n)]

    def objective(mine):
        everyone = [list(x) for x in xs]
        everyone[r] = mine
        outs = simulate(everyone)
        return factor * sum(float(np.sum(w * y)) for k in range(n)
                            for w, y in zip(ws[k], outs[k]))

    numeric = []
    for i, x in enumerate(xs[r]):
        grad = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus = [a.copy() for a in xs[r]]
            minus = [a.copy() for a in xs[r]]
            plus[i][idx] += EPS
            minus[i][idx] -= EPS
            grad[idx] = (objective(plus) - objective(minus)) / (2 * EPS)
        numeric.append(grad)
    tensors = [torch.tensor(x, requires_grad=True) for x in xs[r]]
    outs = collective(tensors)
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    for y, w in zip(outs, ws[r]):
        assert tuple(y.shape) == w.shape, (name, tuple(y.shape), w.shape)
    sum((y * torch.tensor(w)).sum() for y, w in zip(outs, ws[r])).backward()
    for t, ref in zip(tensors, numeric):
        got = t.grad.numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6, err_msg=name)
    return name


done = []
ROWS = [k % 3 + 1 for k in range(n)]  # uneven rows, a rank may have fewer rows than ranks
for op, avg in ((hvd.Sum, False), (hvd.Average, True)):
    for pre, post in ((1.0, 1.0), (0.5, 3.0)):
        def reduce_all(xs, pre=pre, post=post, avg=avg):
            total = [sum(pre * xs[k][i] for k in range(n)) * post / (n if avg else 1)
                     for i in range(len(xs[0]))]
            return [total for _ in range(n)]
        xs = [[inputs(k, 4), inputs(k, 2, 2, seed=1)] for k in range(n)]
        done.append(check(f"allreduce {op} {pre} {post}", [x[:1] for x in xs],
                          lambda xs: reduce_all(xs),
                          lambda ts, op=op, pre=pre, post=post: hvd.allreduce(
                              ts[0], op=op, prescale_factor=pre, postscale_factor=post), 1))
        done.append(check(f"grouped_allreduce {op} {pre} {post}", xs,
                          lambda xs: reduce_all(xs),
                          lambda ts, op=op, pre=pre, post=post: hvd.grouped_allreduce(
                              ts, op=op, prescale_factor=pre, postscale_factor=post), 1))

        def scatter(xs, pre=pre, post=post, avg=avg):
            outs = [[] for _ in range(n)]
            for i in range(len(xs[0])):
                total = sum(pre * xs[k][i] for k in range(n)) * post / (n if avg else 1)
                rows = scatter_rows(total.shape[0], n)
                start = 0
                for k in range(n):
                    outs[k].append(total[start:start + rows[k]])
                    start += rows[k]
            return outs
        xs = [[inputs(k, 2 * n + 1), inputs(k, n, 2, seed=1)] for k in range(n)]
        done.append(check(f"reducescatter {op} {pre} {post}", [x[:1] for x in xs], scatter,
                          lambda ts, op=op, pre=pre, post=post: hvd.reducescatter(
                              ts[0], op=op, prescale_factor=pre, postscale_factor=post), n))
        done.append(check(f"grouped_reducescatter {op} {pre} {post}", xs, scatter,
                          lambda ts, op=op, pre=pre, post=post: hvd.grouped_reducescatter(
                              ts, op=op, prescale_factor=pre, postscale_factor=post), n))


def gather(xs):
    return [[np.concatenate([xs[k][i] for k in range(n)]) for i in range(len(xs[0]))]
            for _ in range(n)]


xs = [[inputs(k, ROWS[k]), inputs(k, ROWS[(k + 1) % n], 2, seed=1)] for k in range(n)]
done.append(check("allgather", [x[:1] for x in xs], gather,
                  lambda ts: hvd.allgather(ts[0]), 1 / n))
done.append(check("grouped_allgather", xs, gather, lambda ts: hvd.grouped_allgather(ts), 1 / n))
for root in range(n):
    xs = [[inputs(k, 3)] for k in range(n)]
    done.append(check(f"broadcast root {root}", xs,
                      lambda xs, root=root: [[xs[root][0]] for _ in range(n)],
                      lambda ts, root=root: hvd.broadcast(ts[0], root), 1 / n))

# alltoall: rank k sends splits[k][j] rows to rank j (uneven, some zero)
splits = [[(k + j) % 3 for j in range(n)] for k in range(n)]
xs = [[inputs(k, sum(splits[k]))] for k in range(n)]


def exchange(xs):
    outs = []
    for j in range(n):
        parts = []
        for k in range(n):
            start = sum(splits[k][:j])
            parts.append(xs[k][0][start:start + splits[k][j]])
        outs.append([np.concatenate(parts)])
    return outs


done.append(check("alltoall splits", xs, exchange,
                  lambda ts: hvd.alltoall(ts[0], splits=splits[r])[0], 1))
even = [[inputs(k, 2 * n)] for k in range(n)]
splits = [[2] * n for _ in range(n)]
done.append(check("alltoall even", even, exchange, lambda ts: hvd.alltoall(ts[0]), 1))

with open(f"{out_dir}/rank{r}.json", "w") as f:
    json.dump(done, f)
'''


@pytest.mark.parametrize("np_", [2, 3])
def test_every_collective_gradient_against_finite_differences(np_, tmp_path):
    run_mpi(np_, SCRIPT, tmp_path, timeout=300, args=[str(tmp_path)],
            env={"DLCOMM_STALL_SHUTDOWN_SECONDS": "60"})
    import json

    checked = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(np_)]
    assert all(c == checked[0] for c in checked), checked
    assert len(checked[0]) == 4 * 4 + 2 + np_ + 2, checked[0]
