"""The hierarchical all-reduce's leaders run ``ring`` or ``rhd`` by message size (issue 24:
"inter-host all-reduce among one leader per host, ring or halving-doubling by size").

On 3, 4 and 5 real ranks in pretend hosts (one rank per host, so 3, 4 and 5 leaders; two
ranks per host, so 2 or 3 leaders), with sizes that do not divide by the leader count:

- with a cached cost model that makes ``rhd`` the faster below 256 KiB and ``ring`` above,
  every leader picks ``rhd`` for small messages and ``ring`` for large ones, and the result
  has the bits of that algorithm run explicitly (float32, and float16 with its float32
  accumulation);
- with the cache off the leaders measure a model, every rank holds the same one, and the
  result again equals the explicitly chosen algorithm;
- with two hosts nothing is measured (ring and rhd exchange the same messages): ``ring``;
- a bad leader algorithm names ``auto`` among the valid ones.
"""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

LEADER_CHOICE = r"""
import json, os, socket, sys
from pathlib import Path
import numpy as np
from mpi4py import MPI
from dlcomm.collectives import HierarchicalAllreduce, cost_model, hierarchical

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
failures = []
cache = Path(os.environ["DLCOMM_ALLREDUCE_MODEL_CACHE"])


def plant(leaders):
    # rhd faster at the smallest probe, ring at the two larger ones
    key = cost_model.topology_key([socket.gethostname()] * leaders,
                                  hierarchical.AUTO_LEADER_CANDIDATES, 0, "")
    if r == 0:
        seconds = {"ring": (2e-3, 3e-3, 1e-2), "rhd": (1e-3, 4e-3, 2e-2)}
        model = cost_model.CostModel(key, cost_model.PROBE_SIZES, seconds)
        (cache / f"{key}.json").write_text(json.dumps(model.to_json()))
    comm.Barrier()


def same_everywhere(name, x):
    if not all(np.array_equal(g.view(np.uint8), x.view(np.uint8)) for g in comm.allgather(x)):
        failures.append(f"{name}: ranks hold different results")


def check_against_explicit(tag, auto, rph):
    explicit = {name: HierarchicalAllreduce(comm, hierarchical_ranks_per_host=rph,
                                            hierarchical_leader_algorithm=name)
                for name in ("ring", "rhd")}
    rng = np.random.default_rng(r)
    for n in (1, p - 1, 1001, 300_001):  # 4 KB float32 / 1.2 MB float32
        for dtype in (np.float32, np.float16):
            x = rng.standard_normal(n).astype(dtype)
            got = auto(x, np.empty_like(x), "sum")
            same_everywhere(f"{tag} n={n} {dtype.__name__}", got)
            chosen = auto.leader_algorithm_for(x.nbytes)
            want = explicit[chosen](x, np.empty_like(x), "sum")
            if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
                failures.append(f"{tag} n={n} {dtype.__name__}: differs from {chosen} leaders")
    for h in explicit.values():
        h.free()


for rph in (1, 2):
    hosts = -(-p // rph)
    tag = f"p={p} ranks_per_host={rph} hosts={hosts}"
    if hosts > 2:
        plant(hosts)
    auto = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=rph)
    if auto.leader_algorithm != "auto":
        failures.append(f"{tag}: default leader algorithm is {auto.leader_algorithm!r}")
    small, large = auto.leader_algorithm_for(1024), auto.leader_algorithm_for(4 << 20)
    expected = ("rhd", "ring") if hosts > 2 else ("ring", "ring")
    if (small, large) != expected:
        failures.append(f"{tag}: leaders chose {(small, large)}, expected {expected}")
    if hosts <= 2 and auto.leader_model is not None:
        failures.append(f"{tag}: measured a model for two hosts")
    check_against_explicit(tag, auto, rph)
    auto.free()

# Measured, not cached: every rank holds the same model, and the result follows it.
os.environ["DLCOMM_ALLREDUCE_MODEL_CACHE"] = "off"
measured = HierarchicalAllreduce(comm, hierarchical_ranks_per_host=1)
model = measured.leader_model
text = None if model is None else json.dumps(model.to_json(), sort_keys=True)
if r == 0 and (model is None or set(model.candidates) != {"ring", "rhd"}):
    failures.append(f"measured model is {text}")
if len(set(comm.allgather(text))) != 1:
    failures.append("ranks measured different leader models")
check_against_explicit(f"p={p} measured", measured, 1)
measured.free()

try:
    HierarchicalAllreduce(comm, hierarchical_leader_algorithm="fast")
except ValueError as exc:
    if "auto" not in str(exc):
        failures.append(f"bad leader algorithm error does not list auto: {exc}")
else:
    failures.append("no error for leader algorithm 'fast'")

print(f"rank {r}: {len(failures)} failures", *failures[:20], sep="\n  ")
sys.exit(1 if failures else 0)
"""


@pytest.mark.parametrize("np_ranks", [3, 4, 5])
def test_leaders_choose_ring_or_rhd_by_size(np_ranks, tmp_path):
    """Small messages take the leaders' rhd, large ones their ring, as the model says."""
    cache = tmp_path / "models"
    cache.mkdir()
    proc = run_mpi(np_ranks, LEADER_CHOICE, tmp_path, timeout=180,
                   env={"DLCOMM_ALLREDUCE_MODEL_CACHE": str(cache)})
    assert proc.count_per_rank(": 0 failures") == [1] * np_ranks, proc.report()
