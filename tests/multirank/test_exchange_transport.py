"""The compressed exchange's rounds run over the TCP mesh where ranks outnumber the cores and
span several hosts (as the negotiation does), with the same results as over MPI, and on MPI
everywhere else."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

EXCHANGE = r"""
import json, os, socket, sys
import numpy as np
if os.environ.get("PRETEND_HOSTS"):  # one pretend host per rank, all on this machine
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    socket.gethostname = lambda: f"pretend-host-{rank}"
import dlcomm
from dlcomm import runtime

dlcomm.init()
r, p = dlcomm.rank(), dlcomm.size()
rng = np.random.default_rng(7 + r)
out = {}
for spec in ("topk:ratio=0.05", "gtopk:ratio=0.05", "signum", "qsgd:levels=16"):
    for step in range(2):  # error feedback carries a residual into the second step
        handles = [dlcomm.allreduce_async(rng.standard_normal(n).astype(np.float32),
                                          name=f"{spec}.{i}", compression=spec)
                   for i, n in enumerate((1027, 5 * p + 3, 4001))]  # not divisible by p
        out[f"{spec}.{step}"] = [np.asarray(dlcomm.synchronize(h)).tolist() for h in handles]
exchange = runtime.state().engine.process_sets[0].exchange_comm()  # built: no new collective
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:
    json.dump({"results": out, "exchange": type(exchange.inner).__name__,
               "sent": dlcomm.bytes_sent()}, f)
dlcomm.shutdown()
"""


def _ranks(out: Path, np_ranks: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(np_ranks)]


def _run(tmp_path: Path, name: str, np_ranks: int, env: dict[str, str]) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    run_mpi(np_ranks, EXCHANGE, out, timeout=180, args=[str(out)], env=env)
    return _ranks(out, np_ranks)


@pytest.mark.parametrize("extra_ranks", [1, 2, 3])
def test_crowded_hosts_exchange_over_the_mesh_with_the_same_results(
        extra_ranks: int, tmp_path: Path) -> None:
    from dlcomm.comm.machine import local_core_count

    np_ranks = local_core_count() + extra_ranks  # more ranks than cores
    if np_ranks > 5:
        pytest.skip(f"{local_core_count()} cores: the crowded case needs more than 5 ranks")
    mesh = _run(tmp_path, "mesh", np_ranks, {"PRETEND_HOSTS": "1"})
    mpi = _run(tmp_path, "mpi", np_ranks, {"PRETEND_HOSTS": "1", "DLCOMM_TCP_MESH": "off"})
    assert {rank["exchange"] for rank in mesh} == {"MeshExchange"}
    assert {rank["exchange"] for rank in mpi} == {"MPICommunicator"}
    for ranks in (mesh, mpi):  # every rank holds the same result
        assert all(rank["results"] == ranks[0]["results"] for rank in ranks)
    # the same selections and values; sums (gTop-k's last round, a bypassed small tensor's
    # all-reduce) run in rank order over the mesh and in MPI's order over MPI
    for key, tensors in mesh[0]["results"].items():
        for ours, theirs in zip(tensors, mpi[0]["results"][key]):
            assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-6), key
    assert [rank["sent"] for rank in mesh] == [rank["sent"] for rank in mpi]


@pytest.mark.parametrize("pretend_hosts, extra_ranks", [
    (False, 1),  # more ranks than cores on one host: MPI's shared memory
    (True, 0),  # a core per rank
])
def test_elsewhere_the_exchange_stays_on_mpi(pretend_hosts: bool, extra_ranks: int,
                                             tmp_path: Path) -> None:
    from dlcomm.comm.machine import local_core_count

    np_ranks = local_core_count() + extra_ranks
    if np_ranks < 2 or np_ranks > 5:
        pytest.skip(f"needs 2 to 5 ranks, the case has {np_ranks}")
    ranks = _run(tmp_path, "run", np_ranks, {"PRETEND_HOSTS": "1"} if pretend_hosts else {})
    assert {rank["exchange"] for rank in ranks} == {"MPICommunicator"}
