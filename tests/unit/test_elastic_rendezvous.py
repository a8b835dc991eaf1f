"""The elastic driver's rendezvous over its real Unix socket, with workers as threads: rounds
form with every live worker (ranks by host, then slot; local and cross ranks as Horovod's),
or after the join timeout without a silent one; all-gathers answer in rank order; a member
that exits breaks its round so nobody waits for it; unknown workers are told to stop."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dlcomm.comm.rendezvous import (
    Assignment,
    DriverGoneError,
    RendezvousClient,
    RoundBootstrap,
)
from dlcomm.errors import PeerLostError
from dlcomm.launcher.rendezvous_server import Place, Rendezvous, RendezvousServer


@pytest.fixture
def served(tmp_path: Path):
    servers = []

    def serve(min_np: int = 1, join_timeout_s: float = 30.0) -> tuple[Rendezvous, str]:
        rendezvous = Rendezvous(min_np, join_timeout_s)
        path = str(tmp_path / "r.sock")
        servers.append(RendezvousServer(path, rendezvous))
        return rendezvous, f"unix:{path}"

    yield serve
    for server in servers:
        server.close()


def _in_threads(calls: dict[str, callable], timeout: float = 20.0) -> dict[str, object]:
    """Run each call in a thread; its result or the exception it raised, by key."""
    results: dict[str, object] = {}

    def run(key: str, call: callable) -> None:
        try:
            results[key] = call()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[key] = exc

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rendezvous request hung"
    return results


def _add(rendezvous: Rendezvous, address: str, worker: str, host: str, index: int,
         slot: int) -> RendezvousClient:
    rendezvous.add_worker(worker, Place(host, index, slot))
    return RendezvousClient(address, f"{worker}:{host}:{slot}")


def test_round_ranks_follow_hosts_and_slots(served) -> None:
    rendezvous, address = served(min_np=2)
    clients = {"w0": _add(rendezvous, address, "w0", "b", 1, 0),
               "w1": _add(rendezvous, address, "w1", "a", 0, 1),
               "w2": _add(rendezvous, address, "w2", "a", 0, 0)}
    got = _in_threads({w: c.join for w, c in clients.items()})
    assert all(isinstance(a, Assignment) for a in got.values()), got
    assert {w: a.rank for w, a in got.items()} == {"w2": 0, "w1": 1, "w0": 2}
    assert {w: (a.local_rank, a.local_size) for w, a in got.items()} == {
        "w2": (0, 2), "w1": (1, 2), "w0": (0, 1)}
    assert {w: (a.cross_rank, a.cross_size) for w, a in got.items()} == {
        "w2": (0, 2), "w1": (0, 1), "w0": (1, 2)}
    assert {a.round_id for a in got.values()} == {1} and rendezvous.members == ["w2", "w1", "w0"]

    boots = {w: RoundBootstrap(clients[w], a) for w, a in got.items()}
    gathered = _in_threads({w: (lambda b=b: b.allgather(f"from {b.rank}"))
                            for w, b in boots.items()})
    assert all(v == ["from 0", "from 1", "from 2"] for v in gathered.values()), gathered
    root = _in_threads({w: (lambda b=b: b.bcast_object(b.rank * 10)) for w, b in boots.items()})
    assert set(root.values()) == {0}


def test_lost_member_breaks_the_round(served) -> None:
    rendezvous, address = served(min_np=2)
    clients = [_add(rendezvous, address, f"w{i}", "h", 0, i) for i in range(3)]
    got = _in_threads({i: c.join for i, c in enumerate(clients)})
    assert not clients[0].hosts_updated(got[0].round_id)
    waiting = {i: (lambda i=i: RoundBootstrap(clients[i], got[i]).allgather(i)) for i in (0, 1)}
    killer = threading.Timer(0.3, rendezvous.remove_worker, args=("w2", "w2 died"))
    killer.start()
    results = _in_threads(waiting)
    assert all(isinstance(r, PeerLostError) and "w2 died" in str(r) for r in results.values())
    assert clients[0].hosts_updated(got[0].round_id)
    with pytest.raises(DriverGoneError, match="w2 died"):
        clients[2].join()
    again = _in_threads({i: clients[i].join for i in (0, 1)})
    assert {a.round_id for a in again.values()} == {2}
    assert sorted(a.rank for a in again.values()) == [0, 1]
    assert all(a.lost_ranks and a.size == 2 for a in again.values())


def test_silent_worker_is_left_out_after_the_join_timeout(served) -> None:
    rendezvous, address = served(min_np=2, join_timeout_s=0.5)
    clients = [_add(rendezvous, address, f"w{i}", "h", 0, i) for i in range(3)]
    left_out: list[str] = []

    def driver_loop() -> None:
        deadline = time.monotonic() + 10
        while not rendezvous.round_id and time.monotonic() < deadline:
            left_out.extend(rendezvous.form_if_ready())
            time.sleep(0.05)

    loop = threading.Thread(target=driver_loop, daemon=True)
    loop.start()
    got = _in_threads({i: clients[i].join for i in (0, 1)})
    loop.join(10)
    assert left_out == ["w2"]
    assert sorted(a.rank for a in got.values()) == [0, 1]


def test_no_round_below_min_np_and_unknown_workers_stop(served) -> None:
    rendezvous, address = served(min_np=2, join_timeout_s=0.1)
    client = _add(rendezvous, address, "w0", "h", 0, 0)
    stopper = threading.Timer(0.5, rendezvous.remove_worker, args=("w0", "job ending"))
    stopper.start()
    got = _in_threads({0: client.join})
    assert isinstance(got[0], DriverGoneError) and "job ending" in str(got[0])
    assert rendezvous.form_if_ready() == [] and rendezvous.round_id == 0
    with pytest.raises(DriverGoneError, match="unknown worker"):
        RendezvousClient(address, "w9:h:0").join()


@pytest.mark.parametrize("address, worker", [("tcp:host:1", "w0:h:0"), ("unix:", "w0:h:0"),
                                             ("unix:/x", "w0:h"), ("unix:/x", "w0:h:a")])
def test_client_refuses_bad_settings(address: str, worker: str) -> None:
    with pytest.raises(ValueError):
        RendezvousClient(address, worker)


def test_driver_gone_is_reported(tmp_path: Path) -> None:
    client = RendezvousClient(f"unix:{tmp_path / 'none.sock'}", "w0:h:0")
    with pytest.raises(DriverGoneError, match="did not answer 'join'"):
        client.join()


@pytest.mark.parametrize("pairs, blamed", [
    ([(0, 3), (1, 3), (2, 3), (3, 0), (3, 1), (3, 2)], ["w3"]),  # host 3's link is cut
    ([(1, 0), (2, 0)], ["w0"]),  # host 0 reached by nobody
    ([(0, 1)], ["w1"]),  # two ranks alone: the later one
    ([(0, 1), (2, 3)], ["w1", "w3"]),
    ([], []),
    ([(0, 9), (5, 5)], []),  # ranks outside the round, or a rank and itself: ignored
])
def test_cut_off_blames_the_rank_that_failed_with_most_peers(pairs, blamed) -> None:
    from dlcomm.launcher.rendezvous_server import _cut_off

    assert _cut_off([f"w{i}" for i in range(4)], pairs) == blamed
