"""The hierarchical all-reduce sums 16-bit buffers in float32 (issue 24's hybrid all-reduce).

On 2 to 5 real ranks, grouped into pretend hosts (1, 2 and 3 ranks per host, so 5 ranks
make hosts of 2+2+1 and 3+2, and the shared-memory split: one host), over sizes that do
not divide by the rank count (0, 1, p-1, 7, 4099):

- every rank gets the same bits, in place and out of place, and ``sendbuf`` is untouched;
- float16 and bfloat16 (uint16 bit patterns) sums are within one 16-bit rounding per
  inter-host hop of the exact float64 sum rounded to 16 bits, and equal to it on one host;
- on mixed-magnitude inputs (a few large values among many small ones) the old path that
  sums in float16 at every step (``hierarchical_fp32_accumulation=False``) is measurably
  worse wherever a host holds more than one rank, and identical where it cannot differ;
- ``rhd`` leaders (float32 accumulation too, with the fold of 3 and 5 leaders) keep the
  same bound; ``tree`` leaders (the host's float32 sum rounded once, leaders in float16)
  give the same bits on every rank, within one rounding per host;
- min and max are exact, float32 buffers take the old path bit for bit, the
  ``DLCOMM_HIERARCHICAL_*`` variables reach the registry's ``hierarchical``, and bad
  arguments raise errors that name the fix.

Each rank prints its own failures into its own output file (``run_mpi``).
"""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

ACCUMULATION = r"""
import os
import sys
import numpy as np
from mpi4py import MPI
from dlcomm.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from dlcomm.collectives import (
    HierarchicalAllreduce, cached_hierarchical_allreduce, get_allreduce_algorithm,
)

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
failures = []
SIZES = sorted({0, 1, max(p - 1, 1), 7, 4099})
LARGE = 4099


def inputs(n, seed):
    # Mixed magnitudes: about one rank in p holds an integer in [512, 2048), the others
    # multiples of 1/64 below 1; the exact sums fit float32, so float64 is exact too.
    rng = np.random.default_rng(seed * 100 + r)
    big = rng.integers(512, 2048, n).astype(np.float64)
    small = rng.integers(0, 64, n) / 64.0
    return np.where(rng.random(n) < 1.0 / p, big, small)


def same_everywhere(name, x):
    if not all(np.array_equal(g.view(np.uint8), x.view(np.uint8)) for g in comm.allgather(x)):
        failures.append(f"{name}: ranks hold different results")


def check_call(name, h, x, op, **kw):
    # Out of place and in place give the same bits on every rank; sendbuf is untouched.
    before = x.copy()
    got = h(x, np.empty_like(x), op, **kw)
    if not np.array_equal(x.view(np.uint8), before.view(np.uint8)):
        failures.append(f"{name}: sendbuf modified")
    inplace = x.copy()
    h(inplace, inplace, op, **kw)
    if not np.array_equal(inplace.view(np.uint8), got.view(np.uint8)):
        failures.append(f"{name}: in place differs from out of place")
    same_everywhere(name, got)
    return got


def hop_bound(hosts):
    # One rounding per inter-host hop (hosts - 1) and one at the end: within that many
    # units in the last place of the correctly rounded sum; exact on one host.
    return max(hosts - 1, 1) if hosts > 1 else 0


for rph in (1, 2, 3, 0):
    # ring leaders for both, so "one rank per host rounds alike" compares like with like
    # (the default, auto, may run rhd among 3+ leaders; test_hierarchical_leader_choice)
    new = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=rph,
                                hierarchical_leader_algorithm="ring")
    old = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=rph,
                                hierarchical_leader_algorithm="ring",
                                hierarchical_fp32_accumulation=False)
    rhd = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=rph,
                                hierarchical_leader_algorithm="rhd")
    tree = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=rph,
                                 hierarchical_leader_algorithm="tree")
    hosts = new.host_count
    crowded = p - hosts >= 1 and p >= 3  # some host holds 2+ ranks: float16 sums differ
    tag = f"p={p} ranks_per_host={rph} hosts={hosts}"
    for n in SIZES:
        values = inputs(n, n)
        everyone = np.array(comm.allgather(values)).reshape(p, n)

        # float16 sum against the exact sum rounded once to float16
        x = values.astype(np.float16)
        exact = everyone.astype(np.float16).astype(np.float64).sum(axis=0)
        want = exact.astype(np.float16)
        ulp = np.spacing(np.abs(want)).astype(np.float64)
        got = check_call(f"{tag} n={n} float16", new, x, "sum")
        off = np.abs(got.astype(np.float64) - want.astype(np.float64)) / ulp
        if n and off.max() > hop_bound(hosts):
            failures.append(f"{tag} n={n} float16: {off.max()} ulps from the rounded exact "
                            f"sum, bound {hop_bound(hosts)}")
        if rph in (1, 2):  # rhd leaders accumulate in float32 too (with a fold at 3, 5)
            got_rhd = check_call(f"{tag} n={n} float16 rhd", rhd, x, "sum")
            off_rhd = np.abs(got_rhd.astype(np.float64) - want.astype(np.float64)) / ulp
            if n and off_rhd.max() > hop_bound(hosts):
                failures.append(f"{tag} n={n} float16 rhd leaders: {off_rhd.max()} ulps")
        if rph == 2:  # tree leaders: the host's float32 sum rounded once, then float16
            got_tree = check_call(f"{tag} n={n} float16 tree", tree, x, "sum")
            off_tree = np.abs(got_tree.astype(np.float64) - want.astype(np.float64)) / ulp
            if n and off_tree.max() > (hosts if hosts > 1 else 0):
                failures.append(f"{tag} n={n} float16 tree leaders: {off_tree.max()} ulps")
        before = check_call(f"{tag} n={n} float16 old", old, x, "sum")
        if n == LARGE:
            err_new = np.abs(got.astype(np.float64) - exact).sum()
            err_old = np.abs(before.astype(np.float64) - exact).sum()
            wrong_new, wrong_old = int((got != want).sum()), int((before != want).sum())
            print(f"{tag}: total error new {err_new:.1f} old {err_old:.1f}; elements off "
                  f"the rounded exact sum new {wrong_new} old {wrong_old}")
            if crowded and not (err_old > err_new and wrong_old > wrong_new):
                failures.append(f"{tag}: the float16 path is not worse (total error "
                                f"{err_old} vs {err_new}, wrong {wrong_old} vs {wrong_new})")
            if not crowded and not np.array_equal(got, before):
                failures.append(f"{tag}: one rank per host (or one host of 2) differs from "
                                "the float16 path, where the roundings are the same")

        # bfloat16 bit patterns: the same, with bfloat16's unit in the last place
        bits = float_to_bf16_bits(values.astype(np.float32))
        everyone_bits = np.array(comm.allgather(bits)).reshape(p, n)
        exact_b = bf16_bits_to_float(everyone_bits.reshape(-1)).reshape(p, n)
        exact_b = exact_b.astype(np.float64).sum(axis=0)
        want_b = float_to_bf16_bits(exact_b.astype(np.float32))  # exact in float32
        want_f = bf16_bits_to_float(want_b).astype(np.float64)
        ulp_b = np.spacing(np.abs(want_f).astype(np.float32)).astype(np.float64) * 65536
        got_b = check_call(f"{tag} n={n} bfloat16", new, bits, "sum", bfloat16=True)
        off_b = np.abs(bf16_bits_to_float(got_b).astype(np.float64) - want_f) / ulp_b
        if n and off_b.max() > hop_bound(hosts):
            failures.append(f"{tag} n={n} bfloat16: {off_b.max()} ulps, bound "
                            f"{hop_bound(hosts)}")
        if rph in (1, 2):
            got_rb = check_call(f"{tag} n={n} bfloat16 rhd", rhd, bits, "sum", bfloat16=True)
            off_rb = np.abs(bf16_bits_to_float(got_rb).astype(np.float64) - want_f) / ulp_b
            if n and off_rb.max() > hop_bound(hosts):
                failures.append(f"{tag} n={n} bfloat16 rhd: {off_rb.max()} ulps")

        # min/max exact (bfloat16 compared as numbers, negative values included)
        signed = values * np.where(np.arange(n) % 2, -1.0, 1.0)
        for op, fn in (("min", np.min), ("max", np.max)):
            h16 = check_call(f"{tag} n={n} float16 {op}", new, signed.astype(np.float16), op)
            all16 = np.array(comm.allgather(signed.astype(np.float16))).reshape(p, n)
            if n and not np.array_equal(h16, fn(all16, axis=0)):
                failures.append(f"{tag} n={n} float16 {op} wrong")
            sb = float_to_bf16_bits(signed.astype(np.float32))
            hb = check_call(f"{tag} n={n} bfloat16 {op}", new, sb, op, bfloat16=True)
            allb = bf16_bits_to_float(np.array(comm.allgather(sb)).reshape(-1)).reshape(p, n)
            if n and not np.array_equal(bf16_bits_to_float(hb), fn(allb, axis=0)):
                failures.append(f"{tag} n={n} bfloat16 {op} wrong")

        # float32 is untouched by the knob: the same bits with it on and off
        x32 = values.astype(np.float32)
        if not np.array_equal(new(x32, np.empty_like(x32), "sum"),
                              old(x32, np.empty_like(x32), "sum")):
            failures.append(f"{tag} n={n}: float32 changed with the knob")
    new.free()
    old.free()
    rhd.free()
    tree.free()

# The environment reaches the registry's entry: DLCOMM_HIERARCHICAL_RANKS_PER_HOST=2 is set
# by the test; the accumulation knob is on by default and read per setting.
values = inputs(LARGE, 7).astype(np.float16)
registry = get_allreduce_algorithm("hierarchical")(comm, values, np.empty_like(values), "sum")
explicit = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=2)
if not np.array_equal(registry, explicit(values, np.empty_like(values), "sum")):
    failures.append("registry hierarchical (env defaults) differs from fp32 accumulation")
os.environ["DLCOMM_HIERARCHICAL_FP32_ACCUMULATION"] = "0"
cached = cached_hierarchical_allreduce(comm)
if cached.fp32_accumulation or cached.ranks_per_host != 2:
    failures.append(f"env not honoured: {cached!r}")
legacy = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=2,
                               hierarchical_fp32_accumulation=False)
if not np.array_equal(cached(values, np.empty_like(values), "sum"),
                      legacy(values, np.empty_like(values), "sum")):
    failures.append("DLCOMM_HIERARCHICAL_FP32_ACCUMULATION=0 does not give the float16 path")
if cached_hierarchical_allreduce(comm, hierarchical_fp32_accumulation=True) is cached:
    failures.append("the argument does not override the environment")



def raises(kind, fragment, func, *args, **kwargs):
    try:
        func(*args, **kwargs)
    except kind as exc:
        if fragment not in str(exc):
            failures.append(f"{kind.__name__} without {fragment!r}: {exc}")
    else:
        failures.append(f"no {kind.__name__} from {func!r} {kwargs}")


raises(TypeError, "True or False", HierarchicalAllreduce, comm,
       hierarchical_fp32_accumulation="yes")
raises(TypeError, "uint16", explicit, values, np.empty_like(values), "sum", bfloat16=True)
bits = float_to_bf16_bits(values.astype(np.float32))
by_host = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=1,
                                hierarchical_leader_algorithm="tree")
raises(ValueError, "'ring' or 'rhd'", by_host, bits, np.empty_like(bits), "sum", bfloat16=True)

print(f"rank {r}: {len(failures)} failures", *failures[:20], sep="\n  ")
sys.exit(1 if failures else 0)
"""


@pytest.mark.parametrize("np_ranks", [2, 3, 4, 5])
def test_hierarchical_sums_16_bit_buffers_in_float32(np_ranks, tmp_path):
    """Same bits everywhere, within one rounding per host hop, better than float16 sums."""
    proc = run_mpi(np_ranks, ACCUMULATION, tmp_path, timeout=300,
                   env={"DLCOMM_HIERARCHICAL_RANKS_PER_HOST": "2"})
    assert proc.count_per_rank(": 0 failures") == [1] * np_ranks, proc.report()


ENGINE_FASTEST = r"""
import json, os, socket, sys
from pathlib import Path
import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
p, r = world.Get_size(), world.Get_rank()
# Two pretend hosts of two ranks: the cost model lists `hierarchical` only when the ranks'
# host names say several hosts with several ranks each; the forced split matches them.
socket.gethostname = lambda: f"pretend-host-{r // 2}"

from dlcomm.collectives import HierarchicalAllreduce, cost_model, hierarchical, selection
from dlcomm.collectives.pipelined import segment_bytes_from_env

hosts = [f"pretend-host-{i // 2}" for i in range(p)]
key = cost_model.topology_key(hosts, selection.ANY_CANDIDATES, segment_bytes_from_env())
if r == 0:  # a cached model in which hierarchical is the fastest at every size
    seconds = {name: (1.0, 1.0, 1.0) for name in selection.ANY_CANDIDATES}
    seconds["hierarchical"] = (1e-3, 1e-3, 1e-3)
    model = cost_model.CostModel(key, cost_model.PROBE_SIZES, seconds)
    Path(os.environ["DLCOMM_ALLREDUCE_MODEL_CACHE"], f"{key}.json").write_text(
        json.dumps(model.to_json()))
world.Barrier()

widened = []  # sizes the float32-accumulating leader ring ran on
ring = hierarchical.WIDENED_LEADER_ALGORITHMS["ring"]
def spy(comm, accumulator, out, ufunc, widening):
    widened.append(accumulator.size)
    return ring(comm, accumulator, out, ufunc, widening)
hierarchical.WIDENED_LEADER_ALGORITHMS["ring"] = spy

import dlcomm
dlcomm.init()
rng = np.random.default_rng(r)
x16 = np.where(rng.random(5001) < 0.25, rng.integers(512, 2048, 5001),
               rng.integers(0, 64, 5001) / 64.0).astype(np.float16)
got = dlcomm.allreduce(x16, name="grad16", op=dlcomm.Sum)
want = HierarchicalAllreduce(world, hierarchical_ranks_per_host=2)(x16, np.empty_like(x16))
failures = []
if not np.array_equal(got, want):
    failures.append("engine float16 result is not the hierarchical float32-accumulated one")
if r % 2 == 0 and widened != [5001, 5001]:  # the engine's call, then the explicit one
    failures.append(f"leader ran the widened ring on {widened}, expected [5001, 5001]")
if r % 2 == 1 and widened:
    failures.append(f"a non-leader ran the leaders' ring: {widened}")
dlcomm.shutdown()
print(f"rank {r}: {len(failures)} failures", *failures, sep="\n  ")
sys.exit(1 if failures else 0)
"""


def test_fastest_picks_hierarchical_with_float32_accumulation_for_float16(tmp_path):
    """With ``fastest`` and ranks on several hosts the engine's float16 all-reduce runs the
    hierarchical path, float32 accumulation included, when the cost model says so."""
    cache = tmp_path / "models"
    cache.mkdir()
    env = {"DLCOMM_ALLREDUCE_ALGORITHM": "fastest", "DLCOMM_HIERARCHICAL_RANKS_PER_HOST": "2",
           "DLCOMM_ALLREDUCE_MODEL_CACHE": str(cache)}
    proc = run_mpi(4, ENGINE_FASTEST, tmp_path, timeout=120, env=env)
    assert proc.count_per_rank(": 0 failures") == [1] * 4, proc.report()
