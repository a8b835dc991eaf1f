"""``auto`` on real ranks: the first job measures and every rank holds rank 0's model and makes
the same choices; the next job on the same topology reads the cached model instead; the
engine's default all-reduce gives the rank-order bits at every size, whichever algorithm the
model picks; ``DLCOMM_ALLREDUCE_MODEL_CACHE=off`` measures in every job."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

MODEL = r"""
import json, sys
from mpi4py import MPI
from dlcomm.collectives import cached_auto_allreduce

comm = MPI.COMM_WORLD
auto = cached_auto_allreduce(comm)
sizes = [4, 4096, 65536, 1 << 20, 16 << 20, 256 << 20]
out = {"measured": auto.measured, "model": auto.model.to_json(),
       "choices": [auto.choose(n) for n in sizes],
       "again": cached_auto_allreduce(comm) is auto}
with open(f"{sys.argv[1]}/rank{comm.Get_rank()}.json", "w") as f:
    json.dump(out, f)
"""


def _ranks(directory: Path, np_ranks: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(np_ranks)]


@pytest.mark.parametrize("np_ranks", [2, 3])
def test_first_job_measures_later_jobs_read_the_cache(np_ranks: int, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"DLCOMM_ALLREDUCE_MODEL_CACHE": str(cache)}
    first, second = tmp_path / "first", tmp_path / "second"
    for directory in (first, second):
        directory.mkdir()
        run_mpi(np_ranks, MODEL, tmp_path, timeout=180, env=env, args=[str(directory)])
    one, two = _ranks(first, np_ranks), _ranks(second, np_ranks)
    assert [r["measured"] for r in one] == [True] * np_ranks
    assert [r["measured"] for r in two] == [False] * np_ranks
    # Every rank holds rank 0's model, so all choose alike; the cached model is the same.
    assert all(r["model"] == one[0]["model"] for r in one + two)
    assert all(r["choices"] == one[0]["choices"] for r in one + two)
    assert set(one[0]["choices"]) <= {"ordered", "pipelined", "ordered_tcp"}
    assert all(r["again"] for r in one)  # built once per communicator
    (cached,) = cache.iterdir()
    assert cached.name == f"{one[0]['model']['topology']}.json"
    assert cached.name.startswith(f"p{np_ranks}-h1-")


CANDIDATES = r"""
import json, os, socket, sys
from mpi4py import MPI
if os.environ.get("PRETEND_HOSTS"):  # one pretend host per rank, all on this machine
    rank = MPI.COMM_WORLD.Get_rank()
    socket.gethostname = lambda: f"pretend-host-{rank}"
from dlcomm.collectives import cached_auto_allreduce
from dlcomm.collectives.selection import ANY_CANDIDATES

comm = MPI.COMM_WORLD
out = {"auto": sorted(cached_auto_allreduce(comm).functions),
       "fastest": sorted(cached_auto_allreduce(comm, ANY_CANDIDATES).functions)}
with open(f"{sys.argv[1]}/rank{comm.Get_rank()}.json", "w") as f:
    json.dump(out, f)
"""


def test_auto_keeps_the_mesh_where_crowded_ranks_span_hosts(tmp_path: Path) -> None:
    """Idle ranks cannot show what MPI's waits cost busy ones that share cores: with more
    ranks than cores on several hosts ``auto`` measures only its mesh candidate; on one host,
    or with a core per rank, all three; ``fastest`` measures every algorithm."""
    from dlcomm.comm.machine import local_core_count

    crowded = local_core_count() + 1
    cases = [(crowded, True, ["ordered_tcp"]),
             (crowded, False, ["ordered", "ordered_tcp", "pipelined"])]
    if local_core_count() >= 2:
        cases.append((2, True, ["ordered", "ordered_tcp", "pipelined"]))
    for i, (np_ranks, pretend_hosts, want) in enumerate(cases):
        out = tmp_path / f"case{i}"
        out.mkdir()
        env = {"DLCOMM_ALLREDUCE_MODEL_CACHE": "off"}
        if pretend_hosts:
            env["PRETEND_HOSTS"] = "1"
        run_mpi(np_ranks, CANDIDATES, tmp_path, timeout=180, args=[str(out)], env=env)
        for rank in _ranks(out, np_ranks):
            assert rank["auto"] == want, (np_ranks, pretend_hosts, rank)
            assert {"ordered", "pipelined", "ordered_tcp", "mpi", "ring"} <= set(rank["fastest"])


def test_cache_off_measures_every_job(tmp_path: Path) -> None:
    env = {"DLCOMM_ALLREDUCE_MODEL_CACHE": "off", "HOME": str(tmp_path)}
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        run_mpi(2, MODEL, tmp_path, timeout=180, env=env, args=[str(tmp_path / name)])
        assert [r["measured"] for r in _ranks(tmp_path / name, 2)] == [True, True]
    assert not (tmp_path / ".cache").exists()


ENGINE = r"""
import json, sys
import numpy as np
from mpi4py import MPI
import dlcomm

dlcomm.init()
comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
rng = np.random.default_rng(r)
wrong = []
# Uneven sizes: smaller than the rank count, not divisible by it, and past the largest
# probe, where the pipelined algorithm runs with many segments.
for n in sorted({1, max(p - 1, 1), 1001, 300001, 1_500_007}):
    for dtype in (np.float16, np.float32, np.float64):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(dtype)
        copies = comm.allgather(x)
        want = copies[0].copy()
        for c in copies[1:]:
            np.add(c, want, out=want)
        got = dlcomm.allreduce(x, name=f"t.{n}.{np.dtype(dtype)}", op=dlcomm.Sum)
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            wrong.append(f"n={n} {np.dtype(dtype)}")
dlcomm.shutdown()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump(wrong, f)
"""


@pytest.mark.parametrize("np_ranks", [2, 3, 4, 5])
def test_engine_default_gives_rank_order_bits_at_every_size(np_ranks: int,
                                                            tmp_path: Path) -> None:
    run_mpi(np_ranks, ENGINE, tmp_path, timeout=300, args=[str(tmp_path)])
    for r in range(np_ranks):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == [], f"rank {r}"


def test_mpis_own_gives_rank_order_bits_between_two_ranks(tmp_path: Path) -> None:
    """Between two ranks every element is one addition, and IEEE addition commutes: MPI's own
    all-reduce gives the rank-order bits whatever its algorithm (float16 through dlcomm's
    MPI operation), so ``auto`` could pick it there without changing a model's bits."""
    run_mpi(2, ENGINE, tmp_path, timeout=300, args=[str(tmp_path)],
            env={"DLCOMM_ALLREDUCE_ALGORITHM": "mpi"})
    for r in range(2):
        assert json.loads((tmp_path / f"rank{r}.json").read_text()) == [], f"rank {r}"


BUCKET = r"""
import json, sys, time
import numpy as np
import dlcomm
from dlcomm import basics
from dlcomm.collectives import built_model

dlcomm.init()
rank = dlcomm.rank()
engine = basics.state().engine
data = engine.process_sets[0].comm
before = [engine._bucket_bytes, built_model(data)]
dlcomm.allreduce(np.ones(10, np.float32), name="first", op=dlcomm.Sum)
start = time.monotonic()  # the engine derives the bucket right after completing "first"
while engine._bucket_bytes is None and time.monotonic() - start < 5:
    time.sleep(0.01)
bucket = engine._bucket_bytes
model = built_model(data)
# A tensor that fills a bucket is negotiated at once, although the user never blocks on it
# and the cycle time (10 minutes) would otherwise batch for minutes after it.
done = None
if bucket is not None:
    x = np.ones(bucket // 4 + 1, np.float32)
    h = dlcomm.allreduce_async(x, name="full", op=dlcomm.Sum)
    start = time.monotonic()
    while not dlcomm.poll(h) and time.monotonic() - start < 60:
        time.sleep(0.01)
    done = dlcomm.poll(h) and bool((dlcomm.synchronize(h) == dlcomm.size()).all())
out = {"before": before, "bucket": bucket, "threshold": engine.config.fusion_threshold,
       "model": None if model is None else model.to_json(), "done": done}
dlcomm.shutdown()
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(out, f)
"""


@pytest.mark.parametrize("algorithm", ["auto", "ordered"])
def test_bucket_size_comes_from_the_cost_model(algorithm: str, tmp_path: Path) -> None:
    env = {"DLCOMM_ALLREDUCE_ALGORITHM": algorithm, "DLCOMM_CYCLE_TIME": "600000"}
    run_mpi(3, BUCKET, tmp_path, timeout=240, env=env, args=[str(tmp_path)])
    ranks = _ranks(tmp_path, 3)
    for out in ranks:
        assert out["before"] == [None, None]  # nothing measured before the first all-reduce
        if algorithm == "ordered":  # a fixed algorithm: no model, batching as before
            assert out["bucket"] is None and out["model"] is None
            continue
        assert out["model"] == ranks[0]["model"]
        assert 64 << 10 <= out["bucket"] <= out["threshold"]
        assert out["done"] is True
