"""``allreduce_async_batch`` on 2 to 5 real ranks: separately named requests submitted in one
call, batched differently on every rank (different splits and orders, uneven sizes, sizes
smaller than the rank count), give the all-reduce of every tensor; a repeated or in-flight
name refuses the whole batch and queues nothing; compression applies to each tensor."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

BATCH = r"""
import json, sys
import numpy as np
import dlcomm

dlcomm.init()
p, r = dlcomm.size(), dlcomm.rank()
problems = []
sizes = [1, max(p - 1, 1), 7, 1001, 65537, 3, 40000]
def value(rank, i, n):  # small integers: every sum is exact in float32
    return ((np.arange(n) + 3 * i + rank) % 11).astype(np.float32)
want = [sum(value(q, i, n) for q in range(p)) for i, n in enumerate(sizes)]
names = [f"batch.{i}" for i in range(len(sizes))]
for step in range(3):
    # Every rank cuts the list at its own place and submits the two halves in its own order.
    order = list(range(len(sizes)))
    if r % 2:
        order.reverse()
    cut = (r + step) % len(order)
    handles = {}
    for part in (order[:cut], order[cut:]):
        tensors = [value(r, i, sizes[i]) for i in part]
        outs = [np.empty_like(t) for t in tensors] if step == 1 else None
        for i, h in zip(part, dlcomm.allreduce_async_batch(
                tensors, [names[i] for i in part], op=dlcomm.Sum, outputs=outs)):
            handles[i] = h
    for i, h in handles.items():
        got = dlcomm.synchronize(h)
        if not np.array_equal(got, want[i]):
            problems.append(f"step {step} tensor {i}: wrong sum")
# Average, with prescale and postscale, and the empty batch.
x = np.full(10, float(r + 1), np.float32)
(h,) = dlcomm.allreduce_async_batch([x], ["avg"], prescale_factor=2.0, postscale_factor=0.5)
if not np.allclose(dlcomm.synchronize(h), (p + 1) / 2):
    problems.append("average with scale factors")
if dlcomm.allreduce_async_batch([], []) != []:
    problems.append("empty batch")
# A repeated name, a name in flight, a length mismatch: refused, nothing queued.
def refused(kind, fragment, *args, **kwargs):
    try:
        dlcomm.allreduce_async_batch(*args, **kwargs)
    except kind as exc:
        if fragment not in str(exc):
            problems.append(f"message {exc!s} lacks {fragment!r}")
    else:
        problems.append(f"no {kind.__name__} for {fragment}")
refused(ValueError, "appears twice", [x, x], ["same", "same"])
refused(ValueError, "2 names for 1 tensors", [x], ["a", "b"])
refused(TypeError, "names must be a list", [x], "a")
refused(TypeError, "unsupported dtype", [np.array(["s"])], ["s"])
pending = dlcomm.allreduce_async(x, name="busy", op=dlcomm.Sum)
refused(ValueError, "already in flight", [x, x], ["fresh", "busy"])
dlcomm.synchronize(pending)
(h,) = dlcomm.allreduce_async_batch([x], ["fresh"], op=dlcomm.Sum)  # was not queued before
if not np.allclose(dlcomm.synchronize(h), p * (p + 1) / 2):
    problems.append("'fresh' after the refused batch")
# Compression per tensor (fp16 round trip of small integers is exact).
# Above the size below which compression is bypassed, and one below it.
picked = [4, 6, 0]
ys = [value(r, i, sizes[i]).reshape(-1, 1) if sizes[i] > 1024 else value(r, i, sizes[i])
      for i in picked]
hs = dlcomm.allreduce_async_batch(ys, [f"c.{i}" for i in picked], op=dlcomm.Sum,
                                  compression="fp16")
for i, h in zip(picked, hs):
    if not np.array_equal(dlcomm.synchronize(h).reshape(-1), want[i]):
        problems.append(f"fp16 tensor {i}")
dlcomm.shutdown()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(problems, f)
"""


@pytest.mark.parametrize("np_ranks", [2, 3, 4, 5])
def test_batches_cut_differently_on_every_rank_reduce_every_tensor(np_ranks: int,
                                                                   tmp_path: Path) -> None:
    run_mpi(np_ranks, BATCH, tmp_path, timeout=240, args=[str(tmp_path)])
    for r in range(np_ranks):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == [], f"rank {r}"
