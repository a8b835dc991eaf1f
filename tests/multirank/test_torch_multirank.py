"""The torch adapter on real ranks: every call against a reference, DistributedOptimizer
against single-process training on the concatenated batches, errors, state broadcast.

On 2 ranks the training script and the Horovod-style script run in one job, in turn (one
start-up of MPI and torch instead of two): each runs unchanged in a namespace of its own,
and every rank writes each script's stdout and error to a file of its own."""

import pytest
from mpi_run import run_mpi
from shared_job import SharedJobs, read_rank_results

torch = pytest.importorskip("torch")

TRAIN_SCRIPT = r'''
import copy, sys
import torch
import dlcomm.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)

def model_fn():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

def batch(step, rank, micro=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)

def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)

loss_fn = torch.nn.CrossEntropyLoss()
for kind in ("sgd", "adam"):
    for passes in (1, 2):
        for groups in (0, 2):
            model = model_fn()
            opt = hvd.DistributedOptimizer(make_opt(kind, model.parameters()),
                                           named_parameters=model.named_parameters(),
                                           backward_passes_per_step=passes, num_groups=groups)
            ref = model_fn()
            ref_opt = make_opt(kind, ref.parameters())
            for step in range(5):
                for micro in range(passes):
                    x, y = batch(step, r, micro)
                    (loss_fn(model(x), y) / passes).backward()
                opt.step()
                opt.zero_grad()
                # reference: one process, mean loss over every rank's micro-batches
                xs = torch.cat([batch(step, k, m)[0] for k in range(n) for m in range(passes)])
                ys = torch.cat([batch(step, k, m)[1] for k in range(n) for m in range(passes)])
                ref_opt.zero_grad()
                loss_fn(ref(xs), ys).backward()
                ref_opt.step()
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5,
                                           msg=f"{kind} passes={passes} groups={groups} {name}")
            # every rank holds identical parameters
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            gathered = hvd.allgather(flat[None])
            assert all(torch.equal(gathered[0], g) for g in gathered)

# fp16 compression and a core compressor train and stay identical across ranks
for compression in (hvd.Compression.fp16, hvd.Compression.lookup("topk:ratio=0.5"),
                    "powersgd:rank=2"):
    model = model_fn()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=compression)
    for step in range(3):
        x, y = batch(step, r)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = hvd.allgather(flat[None])
    assert all(torch.equal(gathered[0], g) for g in gathered), compression

# synchronize() + skip_synchronize(), as in Horovod's gradient clipping recipe
model = model_fn()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
x, y = batch(0, r)
loss_fn(model(x), y).backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
with opt.skip_synchronize():
    opt.step()
print(f"OK {r}", flush=True)
'''

API_SCRIPT = r'''
import torch
import dlcomm.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
ranks = torch.arange(n, dtype=torch.float32)
t = torch.full((3, 2), float(r))
# allreduce variants
torch.testing.assert_close(hvd.allreduce(t, name="a"), torch.full((3, 2), ranks.mean().item()))
assert torch.equal(t, torch.full((3, 2), float(r)))  # input untouched
total = torch.full((3, 2), ranks.sum().item())
torch.testing.assert_close(hvd.allreduce(t, name="s", op=hvd.Sum), total)
torch.testing.assert_close(hvd.allreduce(t, name="avg_flag", average=False), total)
u = t.clone()
out = hvd.allreduce_(u, name="inplace", op=hvd.Max)
assert out is u and torch.equal(u, torch.full((3, 2), float(n - 1)))
h = hvd.allreduce_async(t, name="async", op=hvd.Min)
assert torch.equal(hvd.synchronize(h), torch.zeros(3, 2)) and hvd.poll(h)
v = t.clone()
hvd.synchronize(hvd.allreduce_async_(v, name="async_", op=hvd.Sum))
assert torch.equal(v, torch.full((3, 2), ranks.sum().item()))
torch.testing.assert_close(hvd.allreduce(t, name="fp16", compression=hvd.Compression.fp16),
                           torch.full((3, 2), ranks.mean().item()))
torch.testing.assert_close(hvd.allreduce(t, name="pre", op=hvd.Sum, prescale_factor=2.0,
                                         postscale_factor=0.5), total)
bf = hvd.allreduce(torch.full((4,), float(r), dtype=torch.bfloat16), name="bf16", op=hvd.Sum)
assert bf.dtype == torch.bfloat16 and bf[0].item() == ranks.sum().item()
g = hvd.grouped_allreduce([t, torch.ones(2)], name="grp", op=hvd.Sum)
assert torch.equal(g[1], torch.full((2,), float(n)))
gi = [t.clone(), torch.ones(2)]
hvd.grouped_allreduce_(gi, name="grp_", op=hvd.Sum)
assert torch.equal(gi[1], torch.full((2,), float(n)))
# allgather, broadcast, alltoall, reducescatter
ag = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int64), name="ag")
assert torch.equal(ag, torch.cat([torch.full((k + 1, 2), k, dtype=torch.int64) for k in range(n)]))
b = hvd.broadcast(torch.full((2,), float(r)), root_rank=n - 1, name="bc")
assert torch.equal(b, torch.full((2,), float(n - 1)))
bi = torch.full((2,), float(r))
hvd.broadcast_(bi, 0, name="bc_")
assert torch.equal(bi, torch.zeros(2))
hb = hvd.broadcast_async_(bi, 0, name="bca_")
hvd.synchronize(hb)
# as Horovod: the output alone without splits, (output, received splits) with them
out = hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * r, name="a2a")
assert torch.equal(out, torch.tensor([10.0 * k + r for k in range(n)]))
out, recv = hvd.alltoall(torch.arange(n, dtype=torch.float32) + 10 * r, splits=[1] * n,
                         name="a2a.splits")
assert torch.equal(out, torch.tensor([10.0 * k + r for k in range(n)])) and recv.tolist() == [1] * n
rs = hvd.reducescatter(torch.ones(2 * n, 3), name="rs", op=hvd.Sum)
assert torch.equal(rs, torch.full((2, 3), float(n)))
# objects, barrier, join, ranks
assert hvd.broadcast_object({"r": r}, root_rank=1 % n) == {"r": 1 % n}
assert hvd.allgather_object(r) == list(range(n))
hvd.barrier()
assert hvd.join() in range(n)
assert 0 <= hvd.local_rank() < hvd.local_size() and hvd.cross_size() >= 1
# broadcast_parameters fixes differently initialised models
torch.manual_seed(r)
model = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5))
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
flat = torch.cat([p.detach().reshape(-1) for p in model.state_dict().values()
                  if p.dtype.is_floating_point])
gathered = hvd.allgather(flat[None])
assert all(torch.equal(gathered[0], x) for x in gathered)
# broadcast_optimizer_state: SGD, Adam, per-parameter groups
for make in (lambda ps: torch.optim.SGD(ps, lr=0.1 * (r + 1), momentum=0.9),
             lambda ps: torch.optim.Adam(ps, lr=0.001 * (r + 1)),
             lambda ps: torch.optim.SGD([{"params": ps[:1], "lr": 0.5 + r},
                                         {"params": ps[1:], "lr": 0.1 + r, "momentum": 0.5}],
                                        lr=1.0)):
    torch.manual_seed(r)
    m = torch.nn.Linear(3, 2)
    opt = make(list(m.parameters()))
    m(torch.randn(4, 3)).sum().backward()
    opt.step()  # rank-specific state
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.state_dict()
    everyone = hvd.allgather_object(state)
    for other in everyone:
        assert [g["lr"] for g in other["param_groups"]] == [g["lr"] for g in state["param_groups"]]
        for k, s in state["state"].items():
            for key, val in s.items():
                if isinstance(val, torch.Tensor):
                    assert torch.equal(val, other["state"][k][key]), (k, key)
# SyncBatchNorm equals BatchNorm over the concatenated batch
torch.manual_seed(0)
xs = [torch.randn(4, 3, 5) for _ in range(n)]
sbn = hvd.SyncBatchNorm(3)
ref = torch.nn.BatchNorm1d(3)
x = xs[r].clone().requires_grad_(True)
y = sbn(x)
(y * torch.arange(5.0)).sum().backward()
xall = torch.cat(xs).requires_grad_(True)
yall = ref(xall)
(yall * torch.arange(5.0)).sum().backward()
torch.testing.assert_close(y, yall[4 * r:4 * (r + 1)], rtol=1e-4, atol=1e-5)
torch.testing.assert_close(x.grad, xall.grad[4 * r:4 * (r + 1)], rtol=1e-4, atol=1e-5)
torch.testing.assert_close(sbn.running_mean, ref.running_mean, rtol=1e-4, atol=1e-6)
torch.testing.assert_close(sbn.running_var, ref.running_var, rtol=1e-4, atol=1e-6)
# weight/bias grads are local; summed over ranks they equal the full-batch ones
torch.testing.assert_close(hvd.allreduce(sbn.weight.grad, name="bnw", op=hvd.Sum), ref.weight.grad,
                           rtol=1e-4, atol=1e-5)
print(f"OK {r}", flush=True)
'''

ERRORS_SCRIPT = r'''
import pytest
import torch
import dlcomm.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
model = torch.nn.Linear(3, 2)
sgd = lambda: torch.optim.SGD(model.parameters(), lr=0.1)
with pytest.raises(ValueError, match="missing from it"):
    hvd.DistributedOptimizer(sgd(), named_parameters=[("weight", model.weight)])
with pytest.raises(ValueError, match="must be unique"):
    hvd.DistributedOptimizer(sgd(), named_parameters=[("w", model.weight), ("w", model.bias)])
with pytest.raises(ValueError, match="backward_passes_per_step"):
    hvd.DistributedOptimizer(sgd(), backward_passes_per_step=0)
with pytest.raises(TypeError, match="torch.optim.Optimizer"):
    hvd.DistributedOptimizer(model)
with pytest.raises(ValueError, match="unknown compressor|valid"):
    hvd.DistributedOptimizer(sgd(), compression="zip")
opt = hvd.DistributedOptimizer(sgd(), named_parameters=model.named_parameters())
with pytest.raises(RuntimeError, match="no gradient was produced"):
    opt.step()
model(torch.randn(2, 3)).sum().backward()
with pytest.raises(RuntimeError, match="zero_grad"):
    opt.zero_grad()
opt.step()
with pytest.raises(TypeError, match="torch.Tensor"):
    hvd.allreduce([1.0])
with pytest.raises(ValueError, match="out of range"):
    hvd.broadcast(torch.ones(2), root_rank=n)
# a model whose shapes differ across ranks: a clear error naming the parameter and shapes
other = torch.nn.Linear(3 + r, 2)
opt2 = hvd.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1),
                                named_parameters=other.named_parameters())
other(torch.randn(2, 3 + r)).sum().backward()
with pytest.raises(hvd.DLCommError) as info:
    opt2.step()
msg = str(info.value)
assert "allreduce.weight" in msg and "rank 0: (2, 3)" in msg and "rank 1: (2, 4)" in msg, msg
print(f"OK {r}", flush=True)
'''

HOROVOD_STYLE_SCRIPT = r'''
# Written as horovod's docs show a user; only the import line differs.
import torch
import torch.nn.functional as F
import dlcomm.torch as hvd

hvd.init()
torch.manual_seed(hvd.rank())
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16, op=hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
g = torch.Generator().manual_seed(123)
X = torch.randn(512, 8, generator=g)
Y = (X[:, 0] + X[:, 1] > 0).long()
shard = slice(hvd.rank(), None, hvd.size())
for epoch in range(20):
    for i in range(0, X[shard].shape[0], 32):
        data, target = X[shard][i:i + 32], Y[shard][i:i + 32]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
acc = (model(X).argmax(1) == Y).float().mean()
acc = hvd.allreduce(acc, name="avg_accuracy")
if hvd.rank() == 0:
    print(f"accuracy {acc.item():.3f}", flush=True)
assert acc.item() > 0.9
'''


SCRIPTS = {"train": TRAIN_SCRIPT, "horovod_style": HOROVOD_STYLE_SCRIPT}

# runs the scripts named in argv[1] in turn, each as __main__ in a fresh namespace
DRIVER = "SCRIPTS = " + repr(SCRIPTS) + r'''
import contextlib, io, json, sys, traceback
import dlcomm as hvd

hvd.init()
for name in sys.argv[1].split(","):
    text, error = io.StringIO(), None
    with contextlib.redirect_stdout(text):
        try:
            exec(compile(SCRIPTS[name], name, "exec"), {"__name__": "__main__"})
        except Exception:  # recorded for this script's test; the next scripts still run
            error = traceback.format_exc()
    with open(f"{sys.argv[2]}/{name}.rank{hvd.rank()}.json", "w") as f:
        json.dump({"stdout": text.getvalue(), "error": error}, f)
'''

# the scripts each rank count's job runs, in this order
SCRIPTS_BY_RANKS = {2: ["train", "horovod_style"], 3: ["train"]}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """``scripts(np_, name)``: every rank's stdout of script ``name`` in the one job of ``np_``
    ranks (started on first use); fails naming the script, rank and traceback of an error."""
    def start(np_):
        out = tmp_path_factory.mktemp(f"torch{np_}")
        run_mpi(np_, DRIVER, out, timeout=400,
                args=[",".join(SCRIPTS_BY_RANKS[np_]), str(out)])
        return out

    jobs = SharedJobs(SCRIPTS_BY_RANKS, start)

    def stdout(np_, name):
        found = read_rank_results(jobs.folder(np_, name), np_, name,
                                  lambda c, r: f"{c}.rank{r}.json")
        return [res["stdout"] for res in found]

    return stdout


@pytest.mark.parametrize("np_", [2, 3])
def test_distributed_optimizer_equals_single_process(np_, scripts):
    out = scripts(np_, "train")
    assert [o.count("OK") for o in out] == [1] * np_, out


def test_every_function_against_reference(tmp_path):
    proc = run_mpi(4, API_SCRIPT, tmp_path, timeout=300)
    assert proc.count_per_rank("OK") == [1] * 4, proc.report()


def test_errors_are_clear(tmp_path):
    proc = run_mpi(2, ERRORS_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1] * 2, proc.report()


def test_horovod_style_script_runs_with_only_the_import_changed(scripts):
    out = scripts(2, "horovod_style")
    assert "accuracy" in out[0], out  # rank 0 prints the average
