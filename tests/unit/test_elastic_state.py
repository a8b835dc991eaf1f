"""Elastic state in one process (one rank, an MPI singleton; not an elastic job, so
``runtime.state().elastic`` is None): ``ObjectState`` commit/restore/sync and reset
callbacks, ``dlcomm.elastic.run`` without recovery, ``TorchState`` rolling back a model and
its optimizer bit for bit, and ``ElasticSampler``'s shards for several (patched) rank
counts. Lost and added workers are tested with the elastic driver in
tests/multirank/test_elastic_jobs.py."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from framework_required import require_framework
from one_rank import one_rank_dlcomm

import dlcomm
import dlcomm.elastic
from dlcomm.elastic import HostsUpdatedInterrupt, ObjectState, PeerLostError, State

DATASET = 103  # not divisible by any of the rank counts below


@pytest.fixture(scope="module", autouse=True)
def _one_rank() -> Iterator[None]:
    """``dlcomm.init()`` on this process alone (not an elastic job), shut down afterwards."""
    with one_rank_dlcomm():
        yield


@pytest.fixture
def torch() -> ModuleType:
    return require_framework("torch")


@pytest.fixture
def elastic(torch: ModuleType) -> ModuleType:
    """``dlcomm.torch.elastic`` (needs torch)."""
    import dlcomm.torch.elastic as module  # noqa: PLC0415 - only where torch is importable

    return module


# --- ObjectState -----------------------------------------------------------------------------

def test_object_state_restores_the_last_commit() -> None:
    state = ObjectState(epoch=0, batch=0)
    assert (state.epoch, state.batch, state.commits) == (0, 0, 0)
    state.epoch, state.batch = 1, 7
    state.commit()
    assert state.commits == 1
    state.epoch, state.batch = 2, 30
    state.restore()
    assert (state.epoch, state.batch) == (1, 7)
    state.batch = 9
    state.commit()
    state.batch = 12
    state.restore()
    assert (state.epoch, state.batch, state.commits) == (1, 9, 2)
    state.restore()  # restoring twice changes nothing
    assert (state.epoch, state.batch, state.commits) == (1, 9, 2)


def test_object_state_restore_before_any_commit_gives_the_initial_values() -> None:
    state = ObjectState(epoch=0, history=[1, 2])
    state.epoch = 5
    state.history.append(3)  # mutated in place: the saved copy must be a deep copy
    state.restore()
    assert state.epoch == 0 and state.history == [1, 2]
    state.history.append(4)
    state.commit()
    state.history.clear()
    state.restore()
    assert state.history == [1, 2, 4]


def test_object_state_sync_on_one_rank_keeps_the_values() -> None:
    state = ObjectState(epoch=3, batch=4)
    state.commit()
    state.batch = 5
    state.sync()
    assert (state.epoch, state.batch, state.commits) == (3, 5, 1)
    assert state.sync_root() == 0


def test_reset_callbacks_must_be_callable_and_run_in_order() -> None:
    state = ObjectState(epoch=0)
    calls: list[str] = []
    with pytest.raises(TypeError, match="callable"):
        state.register_reset_callbacks([lambda: calls.append("x"), 42])  # type: ignore[list-item]
    state.register_reset_callbacks([lambda: calls.append("a")])
    state.register_reset_callbacks([lambda: calls.append("b"), lambda: calls.append("c")])
    state.on_reset()
    assert calls == ["a", "b", "c"]  # the rejected list registered nothing
    state.on_reset()
    assert calls == ["a", "b", "c"] * 2


# --- dlcomm.elastic.run outside an elastic job ----------------------------------------------

class CountingState(ObjectState):
    """An ObjectState that counts its syncs and restores."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.syncs = 0
        self.restores = 0

    def sync(self) -> None:
        self.syncs += 1
        super().sync()

    def restore(self) -> None:
        self.restores += 1
        super().restore()


def test_run_outside_an_elastic_job_syncs_once_and_returns() -> None:
    state = CountingState(epoch=0)
    seen: list[tuple[int, tuple[Any, ...], dict[str, Any]]] = []

    @dlcomm.elastic.run
    def train(st: CountingState, *args: Any, **kwargs: Any) -> str:
        seen.append((st.syncs, args, kwargs))
        st.epoch += 1
        st.commit()
        return "done"

    assert train.__name__ == "train"
    assert train(state, 1, lr=0.5) == "done"
    assert seen == [(1, (1,), {"lr": 0.5})]  # synced once, before the function ran
    assert state.syncs == 1 and state.epoch == 1 and state.commits == 1


@pytest.mark.parametrize("error", [PeerLostError("rank 1 is gone"),
                                   HostsUpdatedInterrupt(skip_sync=True)])
def test_run_outside_an_elastic_job_does_not_recover(error: Exception) -> None:
    state = CountingState(epoch=0)
    calls: list[int] = []

    @dlcomm.elastic.run
    def train(st: CountingState) -> None:
        calls.append(st.epoch)
        st.epoch = 8  # not committed
        raise error

    with pytest.raises(type(error)) as info:
        train(state)
    assert info.value is error
    assert calls == [0]  # no second try
    assert state.syncs == 1 and state.restores == 0 and state.epoch == 8


def test_run_rejects_a_first_argument_that_is_not_a_state() -> None:
    @dlcomm.elastic.run
    def train(st: State) -> None:
        raise AssertionError("must not run")

    with pytest.raises(TypeError, match="State"):
        train({"epoch": 0})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        train()  # type: ignore[call-arg]


@pytest.mark.parametrize("thing", [5, None, "train"])
def test_run_decorates_only_callables(thing: object) -> None:
    with pytest.raises(TypeError, match="decorates a function"):
        dlcomm.elastic.run(thing)  # type: ignore[type-var]


# --- TorchState -------------------------------------------------------------------------------

def _model_and_optimizer(torch: ModuleType) -> tuple[Any, Any]:
    import dlcomm.torch as hvd  # noqa: PLC0415 - needs torch

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    return model, optimizer


def _train(torch: ModuleType, model: Any, optimizer: Any, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _snapshot(model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[int, Any]]:
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    buffers = {i: s["momentum_buffer"].clone()
               for i, s in optimizer.state_dict()["state"].items()}
    return params, buffers


def _assert_bit_equal(torch: ModuleType, got: tuple[dict, dict], want: tuple[dict, dict]) -> None:
    for part, (a, b) in zip(("parameter", "momentum buffer"), zip(got, want)):
        assert a.keys() == b.keys(), part
        for key in a:
            assert torch.equal(a[key], b[key]), f"{part} {key} differs"


def test_torch_state_restores_model_and_optimizer_bit_for_bit(
        torch: ModuleType, elastic: ModuleType) -> None:
    model, optimizer = _model_and_optimizer(torch)
    state = elastic.TorchState(model, optimizer, epoch=0)
    _train(torch, model, optimizer, range(0, 2))
    state.epoch = 1
    state.commit()
    committed = _snapshot(model, optimizer)
    assert len(committed[1]) == 2  # weight and bias have momentum buffers
    _train(torch, model, optimizer, range(2, 4))
    state.epoch = 2
    later = _snapshot(model, optimizer)
    assert not torch.equal(later[0]["weight"], committed[0]["weight"])
    assert not torch.equal(later[1][0], committed[1][0])

    state.restore()
    _assert_bit_equal(torch, _snapshot(model, optimizer), committed)
    assert state.epoch == 1 and state.commits == 1
    # The restored optimizer still drives the model: the same two steps again give the
    # same result as before the rollback.
    _train(torch, model, optimizer, range(2, 4))
    _assert_bit_equal(torch, _snapshot(model, optimizer), later)


def test_torch_state_sync_on_one_rank_keeps_model_and_optimizer(
        torch: ModuleType, elastic: ModuleType) -> None:
    model, optimizer = _model_and_optimizer(torch)
    _train(torch, model, optimizer, range(2))
    state = elastic.TorchState(model, optimizer, epoch=4)
    before = _snapshot(model, optimizer)
    state.sync()
    _assert_bit_equal(torch, _snapshot(model, optimizer), before)
    assert state.epoch == 4


def test_torch_state_rejects_wrong_types(torch: ModuleType, elastic: ModuleType) -> None:
    model, optimizer = _model_and_optimizer(torch)
    with pytest.raises(TypeError, match="model"):
        elastic.TorchState(optimizer, optimizer)
    with pytest.raises(TypeError, match="optimizer"):
        elastic.TorchState(model, model)
    with pytest.raises(TypeError, match="optimizer"):
        elastic.TorchState(model, {"lr": 0.1})
    elastic.TorchState()  # neither is required
    elastic.TorchState(model)


def test_torch_state_restores_its_sampler(torch: ModuleType, elastic: ModuleType) -> None:
    sampler = elastic.ElasticSampler(range(DATASET))
    state = elastic.TorchState(sampler=sampler, epoch=0)
    assert state.sampler is sampler
    sampler.record_batch(0, 10)
    sampler.record_batch(1, 10)
    state.commit()
    sampler.record_batch(2, 10)
    sampler.record_batch(3, 10)
    assert sampler.processed_num == 40
    state.restore()
    assert state.sampler is sampler  # restored in place, not replaced
    assert sampler.processed_num == 20 and sampler.epoch == 0
    assert len(sampler) == DATASET - 20 and len(list(sampler)) == DATASET - 20


# --- ElasticSampler ---------------------------------------------------------------------------

def test_sampler_epoch_is_a_permutation_and_resumes_where_it_stopped(
        elastic: ModuleType) -> None:
    sampler = elastic.ElasticSampler(range(DATASET))
    epoch0 = list(sampler)
    assert len(sampler) == DATASET and sorted(epoch0) == list(range(DATASET))
    assert epoch0 != list(range(DATASET))  # shuffled
    assert list(sampler) == epoch0  # the same order each time within the epoch

    sampler.record_batch(0, 40)
    assert sampler.processed_num == 40
    sampler.reset()
    assert len(sampler) == DATASET - 40
    assert list(sampler) == epoch0[40:]

    sampler.set_epoch(1)
    assert sampler.processed_num == 0 and sampler.epoch == 1
    epoch1 = list(sampler)
    assert sorted(epoch1) == list(range(DATASET)) and epoch1 != epoch0
    sampler.set_epoch(0)
    assert list(sampler) == epoch0  # the order depends only on seed and epoch

    other_seed = elastic.ElasticSampler(range(DATASET), seed=1)
    assert list(other_seed) != epoch0
    assert list(elastic.ElasticSampler(range(DATASET), shuffle=False)) == list(range(DATASET))


def test_sampler_state_dict_round_trip(elastic: ModuleType) -> None:
    sampler = elastic.ElasticSampler(range(DATASET))
    sampler.set_epoch(3)
    sampler.record_batch(0, 16)
    sampler.record_batch(1, 16)
    saved = sampler.state_dict()
    assert saved == {"epoch": 3, "processed_num": 32}
    copy = elastic.ElasticSampler(range(DATASET))
    copy.load_state_dict(saved)
    assert copy.state_dict() == saved
    sampler.reset()
    assert len(copy) == len(sampler) == DATASET - 32
    assert list(copy) == list(sampler)


def test_sampler_argument_errors(elastic: ModuleType) -> None:
    sampler = elastic.ElasticSampler(range(DATASET))
    with pytest.raises(ValueError, match="batch_size"):
        sampler.record_batch(0, -1)
    assert sampler.processed_num == 0
    sampler.record_batch(0, 0)
    assert sampler.processed_num == 0
    with pytest.raises(TypeError, match="length"):
        elastic.ElasticSampler(iter(range(3)))  # type: ignore[arg-type]


def _shards(elastic: ModuleType, monkeypatch: pytest.MonkeyPatch, size: int,
            prepare: Callable[[Any], None]) -> list[tuple[int, list[int]]]:
    """Each rank's (len, indices) for ``size`` ranks, ``prepare`` applied to its sampler."""
    shards = []
    monkeypatch.setattr(dlcomm, "size", lambda: size)
    for rank in range(size):
        monkeypatch.setattr(dlcomm, "rank", lambda rank=rank: rank)
        sampler = elastic.ElasticSampler(range(DATASET))
        prepare(sampler)
        assert (sampler.num_replicas, sampler.rank) == (size, rank)
        shards.append((len(sampler), list(sampler)))
    return shards


def _assert_sharded(shards: list[tuple[int, list[int]]], remaining: list[int]) -> None:
    """Shards of one length (the one ``len()`` gives) that together hold every index of
    ``remaining`` and nothing else, repeating indices only to pad."""
    size = len(shards)
    per = -(-len(remaining) // size)
    assert [len(indices) for _, indices in shards] == [per] * size
    assert [length for length, _ in shards] == [per] * size
    every = [i for _, indices in shards for i in indices]
    assert set(every) == set(remaining)
    assert len(every) - len(set(every)) == per * size - len(remaining)  # the padding only
    if len(remaining) >= size:  # enough samples for one each: the first round is disjoint
        assert len({indices[0] for _, indices in shards}) == size


@pytest.mark.parametrize("size", [2, 3, 4, 5])
def test_sampler_shards_a_whole_epoch(elastic: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                      size: int) -> None:
    order = list(elastic.ElasticSampler(range(DATASET)))
    shards = _shards(elastic, monkeypatch, size, lambda s: None)
    _assert_sharded(shards, order)
    first = [i for _, indices in shards for i in indices[:DATASET // size]]
    assert len(set(first)) == len(first)  # disjoint where the dataset suffices


@pytest.mark.parametrize("size,batch", [(2, 20), (3, 11), (4, 7), (5, 3)])
def test_sampler_shards_the_rest_of_an_epoch(elastic: ModuleType,
                                             monkeypatch: pytest.MonkeyPatch, size: int,
                                             batch: int) -> None:
    order = list(elastic.ElasticSampler(range(DATASET)))

    def two_steps(sampler: Any) -> None:
        sampler.record_batch(0, batch)
        sampler.record_batch(1, batch)
        sampler.reset()

    shards = _shards(elastic, monkeypatch, size, two_steps)
    _assert_sharded(shards, order[2 * batch * size:])


@pytest.mark.parametrize("size,batch", [
    (2, 51),  # 1 left for 2 ranks
    (3, 34),  # 1 left for 3 ranks: padded by repeating it on every rank
    (4, 25),  # 3 left for 4 ranks
    (5, 20),  # 3 left for 5 ranks
])
def test_sampler_shards_a_remainder_smaller_than_the_ranks(
        elastic: ModuleType, monkeypatch: pytest.MonkeyPatch, size: int, batch: int) -> None:
    order = list(elastic.ElasticSampler(range(DATASET)))

    def almost_all(sampler: Any) -> None:
        sampler.record_batch(0, batch)
        sampler.reset()

    remaining = order[batch * size:]
    assert 0 < len(remaining) < size
    shards = _shards(elastic, monkeypatch, size, almost_all)
    _assert_sharded(shards, remaining)
    assert all(length == 1 for length, _ in shards)


def test_sampler_reshards_after_the_ranks_change(elastic: ModuleType,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks process 2 x 30 samples, then the job re-forms on three: the 43 left are
    shared by the three, continuing the same epoch order."""
    order = list(elastic.ElasticSampler(range(DATASET)))

    def after_two_ranks(sampler: Any) -> None:
        sampler.load_state_dict({"epoch": 0, "processed_num": 60})  # as TorchState.sync does

    shards = _shards(elastic, monkeypatch, 3, after_two_ranks)
    _assert_sharded(shards, order[60:])
    assert [indices for _, indices in shards] == [
        (order[60:] + order[60:62])[r::3] for r in range(3)]


def test_sampler_pads_one_sample_left_to_every_rank_after_growing(
        elastic: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    order = list(elastic.ElasticSampler(range(DATASET)))

    def after_two_ranks(sampler: Any) -> None:
        sampler.load_state_dict({"epoch": 0, "processed_num": 102})  # 2 ranks x 51

    shards = _shards(elastic, monkeypatch, 4, after_two_ranks)
    _assert_sharded(shards, order[102:])
