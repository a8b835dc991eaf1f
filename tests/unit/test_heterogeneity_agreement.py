"""Sync algorithms built with different settings on different ranks fail on every rank."""
from __future__ import annotations

import pytest
from mpi_run import run_mpi

from dlcomm.errors import MismatchError
from dlcomm.heterogeneity.agreement import check_same_settings, differing_settings
from dlcomm.heterogeneity.dlcp import layout_fingerprint


def test_differing_settings_names_each_rank_value() -> None:
    same = {"a": 1, "b": [2, 3]}
    assert differing_settings([same, dict(same), dict(same)]) == {}
    assert differing_settings([same, {"a": 1, "b": [2, 4]}]) == {"b": [[2, 3], [2, 4]]}
    assert differing_settings([{"a": 1}, {}]) == {"a": [1, None]}


class GatheredComm:
    """Stands in for a communicator whose members passed ``per_rank``."""

    def __init__(self, per_rank: list[dict]) -> None:
        self.per_rank = per_rank

    def allgather(self, _mine: dict) -> list[dict]:
        return self.per_rank


def test_check_names_the_members_by_the_ranks_given() -> None:
    comm = GatheredComm([{"n": 6}, {"n": 7}, {"n": 6}])
    with pytest.raises(MismatchError, match=r"group's model was built .*\(n: rank 0: 6, "
                                            r"rank 1: 7, rank 2: 6\)"):
        check_same_settings(comm, "group's model", {"n": 6})
    with pytest.raises(MismatchError, match=r"n: rank 4: 6, rank 1: 7, rank 9: 6"):
        check_same_settings(comm, "group's model", {"n": 6}, ranks=[4, 1, 9])
    with pytest.raises(ValueError, match="ranks lists 2 members but the communicator has 3"):
        check_same_settings(comm, "group's model", {"n": 6}, ranks=[4, 1])
    check_same_settings(GatheredComm([{"n": 6}] * 2), "x", {"n": 6}, ranks=[3, 5])


def test_layout_fingerprint_tells_layouts_apart_and_never_raises() -> None:
    base = layout_fingerprint([10, 4], [False, True])
    assert base == layout_fingerprint([10, 4], [False, True])
    assert base != layout_fingerprint([4, 10], [True, False])  # same totals, other order
    assert base != layout_fingerprint([10, 4], [True, True])
    assert "layout" in layout_fingerprint([None, 4], [False, True])  # type: ignore[list-item]


def test_mismatched_settings_fail_on_every_rank(tmp_path) -> None:
    run_mpi(3, r'''
import numpy as np
import dlcomm
from dlcomm.errors import MismatchError
from dlcomm.heterogeneity.dlcp import BoundedLossExchange
from dlcomm.heterogeneity.dssync import GroupCycle
from dlcomm.heterogeneity.lbbsp import BatchBalancer
dlcomm.init()
rank = dlcomm.rank()

def fails(build, *words):
    try:
        build()
    except MismatchError as e:
        assert all(w in str(e) for w in words), (rank, str(e))
        return
    raise AssertionError(f"rank {rank}: no MismatchError")

fails(lambda: GroupCycle(2, seed=7 if rank == 2 else 0), "seed", "rank 2: 7", "rank 0: 0")
fails(lambda: BoundedLossExchange([100, 4 + (rank == 1)], [False, True], 0.1),
      "elements", "layout checksum")
fails(lambda: BoundedLossExchange([100, 4], [False, True], 0.05 if rank else 0.1),
      "loss_tolerance")
fails(lambda: BatchBalancer(96 + 3 * (rank == 0), 3, rank).check_same_on_all_ranks(),
      "global_batch", "rank 0: 99")
fails(lambda: BatchBalancer(96, 3, rank, interval=rank + 1).check_same_on_all_ranks(),
      "interval")
# the same settings everywhere still build and work after the failures
cycle = GroupCycle(2, seed=1)
ex = BoundedLossExchange([100, 4], [False, True], 0.0)
out, _ = ex.exchange(np.full(104, float(rank), np.float32))
assert np.allclose(out, 1.0)
ex.close()
BatchBalancer(96, 3, rank).check_same_on_all_ranks()
dlcomm.shutdown()
''', tmp_path, timeout=120)
