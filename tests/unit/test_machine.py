"""``dlcomm.comm.machine``: which ranks share a machine's cores."""
from __future__ import annotations

from dlcomm.comm.machine import (
    local_core_count,
    machine_id,
    oversubscribed,
    oversubscribed_across_hosts,
    usable_cpus,
)


def test_more_ranks_than_cores_on_one_machine() -> None:
    assert oversubscribed([("m", (0, 1))] * 4)  # 4 ranks, 2 cores
    assert not oversubscribed([("m", (0, 1))] * 2)  # one core each


def test_ranks_bound_to_distinct_cores_use_their_union() -> None:
    # 4 ranks of an 8-core machine, each bound to its own core: one core each, no sharing.
    assert not oversubscribed([("m", (c,)) for c in range(4)])
    # Two ranks bound to the same core share it.
    assert oversubscribed([("m", (0,)), ("m", (0,)), ("m", (1,))])


def test_one_crowded_machine_is_enough() -> None:
    ranks = [("a", (0, 1, 2, 3))] * 2 + [("b", (0,))] * 3
    assert oversubscribed(ranks)
    assert not oversubscribed(ranks[:3])


def test_the_mesh_pays_only_where_crowded_ranks_span_hosts() -> None:
    emulated = [("m", (0, 1), f"h{i}") for i in range(4)]  # 4 hosts of one 2-core kernel
    assert oversubscribed_across_hosts(emulated)
    assert not oversubscribed_across_hosts([("m", (0, 1), "h")] * 4)  # one host: shared memory
    assert not oversubscribed_across_hosts(emulated[:2])  # a core per rank


def test_this_process_is_described() -> None:
    assert machine_id()
    assert len(usable_cpus()) == local_core_count() >= 1
