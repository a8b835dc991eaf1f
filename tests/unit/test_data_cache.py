"""SampleCache: one load per sample per host, memory before disk within each rank's share,
files a reader never sees half-written, the last closer cleans up; CachedDataset in torch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dlcomm.data import SampleCache


class CountingSource:
    """A data source that records which samples it had to load."""

    def __init__(self, shape: tuple[int, ...] = (8, 8)) -> None:
        self.loaded: list[int] = []
        self.shape = shape

    def __call__(self, index: int) -> tuple[np.ndarray, int]:
        self.loaded.append(index)
        return np.full(self.shape, index, dtype=np.float32), index % 10


def make(tmp_path: Path, name: str = "digits", **kwargs) -> SampleCache:
    kwargs.setdefault("memory_root", tmp_path / "shm")
    kwargs.setdefault("disk_dir", tmp_path / "disk")
    (tmp_path / "shm").mkdir(exist_ok=True)
    return SampleCache(name, **kwargs)


def test_a_sample_is_loaded_once_then_read_from_memory(tmp_path: Path) -> None:
    source = CountingSource()
    with make(tmp_path, memory_bytes=1 << 20, disk_bytes=0) as cache:
        first = [cache.get(i, source) for i in range(5)]
        again = [cache.get(i, source) for i in range(5)]
        assert source.loaded == [0, 1, 2, 3, 4]
        for (a, la), (b, lb) in zip(first, again):
            assert np.array_equal(a, b) and la == lb
        stats = cache.reset_stats()
        assert (stats.misses, stats.memory_hits, stats.disk_hits) == (5, 5, 0)
        assert stats.hit_rate == 0.5 and stats.seconds > 0
        assert cache.stats.requests == 0  # counting starts afresh


def test_beyond_the_memory_share_samples_spill_to_disk_then_are_not_kept(tmp_path: Path
                                                                         ) -> None:
    source = CountingSource()
    one = len(__import__("pickle").dumps(source(0), protocol=5))
    source.loaded.clear()
    # host budgets of 2 and 2 samples shared by 2 local ranks: this rank keeps 1 + 1
    with make(tmp_path, memory_bytes=2 * one, disk_bytes=2 * one,
              local_rank=1, local_size=2) as cache:
        for i in range(3):
            cache.get(i, source)
        for i in range(3):
            cache.get(i, source)
        assert source.loaded == [0, 1, 2, 2]  # the third fitted nowhere
        assert (cache.stats.memory_hits, cache.stats.disk_hits) == (1, 1)
        assert cache.stats.bytes_to_memory == one and cache.stats.bytes_to_disk == one
        assert sorted(p.name for p in cache.memory_dir.glob("*.pkl")) == ["0.pkl"]
        assert sorted(p.name for p in cache.disk_dir.glob("*.pkl")) == ["1.pkl"]


def test_ranks_of_a_host_share_what_one_of_them_loaded(tmp_path: Path) -> None:
    source = CountingSource()
    a = make(tmp_path, memory_bytes=1 << 20, local_rank=0, local_size=2)
    b = make(tmp_path, memory_bytes=1 << 20, local_rank=1, local_size=2)
    assert a.memory_dir == b.memory_dir
    for i in range(4):
        a.get(i, source)
    values = [b.get(i, source) for i in range(4)]
    assert source.loaded == [0, 1, 2, 3]
    assert [int(v[0][0, 0]) for v in values] == [0, 1, 2, 3]
    assert b.stats.memory_hits == 4 and b.stats.misses == 0
    # the first to close leaves the samples to the other; the last removes them
    a.close()
    assert b.get(0, source)[1] == 0 and source.loaded == [0, 1, 2, 3]
    b.close()
    assert not b.memory_dir.exists() and not b.disk_dir.exists()


def test_a_persistent_cache_outlives_its_users_and_clear_empties_it(tmp_path: Path) -> None:
    source = CountingSource()
    with make(tmp_path, persistent=True) as cache:
        cache.get(3, source)
    with make(tmp_path, persistent=True) as cache:
        cache.get(3, source)
        assert source.loaded == [3] and cache.stats.memory_hits == 1
        cache.clear()
        cache.get(3, source)
        assert source.loaded == [3, 3]
    # different names never share
    with make(tmp_path, name="other", persistent=True) as other:
        other.get(3, source)
    assert source.loaded == [3, 3, 3]


def test_no_partial_file_is_left_where_a_reader_looks(tmp_path: Path) -> None:
    with make(tmp_path) as cache:
        cache.get(0, CountingSource((1000,)))
        names = sorted(p.name for p in cache.memory_dir.iterdir())
        assert [n for n in names if not n.startswith(".open.")] == ["0.pkl"]


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "a/b"}, "name must be"),
    ({"name": "x", "memory_bytes": -1}, "memory_bytes"),
    ({"name": "x", "disk_bytes": 1.5}, "disk_bytes"),
    ({"name": "x", "local_rank": 0}, "together"),
    ({"name": "x", "local_rank": 2, "local_size": 2}, "local_rank"),
    ({"name": "x", "memory_root": "/no/such/dir"}, "memory_root"),
])
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict, message: str) -> None:
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=message):
        make(tmp_path, name=name, **kwargs)


def test_bad_index_and_use_after_close_are_refused(tmp_path: Path) -> None:
    cache = make(tmp_path)
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="index"):
            cache.get(bad, CountingSource())
    cache.close()
    with pytest.raises(RuntimeError, match="closed"):
        cache.get(0, CountingSource())


def test_knobs_set_the_budgets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLCOMM_DATA_CACHE_MEMORY_BYTES", "0")
    monkeypatch.setenv("DLCOMM_DATA_CACHE_DIR", str(tmp_path / "knob_disk"))
    (tmp_path / "shm").mkdir()
    with SampleCache("k", memory_root=tmp_path / "shm") as cache:
        cache.get(0, CountingSource())
        assert cache.disk_dir.is_relative_to(tmp_path / "knob_disk")
        assert [p.name for p in cache.disk_dir.glob("*.pkl")] == ["0.pkl"]
    monkeypatch.setenv("DLCOMM_DATA_CACHE_DISK_BYTES", "lots")
    with pytest.raises(ValueError, match="DLCOMM_DATA_CACHE_DISK_BYTES"):
        SampleCache("k", memory_root=tmp_path / "shm")


def test_cached_dataset_serves_a_dataloader_the_same_batches(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    torch = pytest.importorskip("torch")
    from dlcomm.torch.data import CachedDataset

    monkeypatch.setenv("DLCOMM_DATA_CACHE_DIR", str(tmp_path / "disk"))
    g = torch.Generator().manual_seed(0)
    base = torch.utils.data.TensorDataset(torch.randn(37, 5, generator=g),
                                          torch.randint(0, 3, (37,), generator=g))
    data = CachedDataset(base, "tensors")
    plain = [b for b in torch.utils.data.DataLoader(base, batch_size=8)]
    for epoch in range(2):
        cached = [b for b in torch.utils.data.DataLoader(data, batch_size=8)]
        for (x, y), (cx, cy) in zip(plain, cached):
            assert torch.equal(x, cx) and torch.equal(y, cy)
        stats = data.epoch_stats()
        assert (stats.misses, stats.memory_hits) == ((37, 0) if epoch == 0 else (0, 37))
    with pytest.raises(IndexError):
        data[37]
    with pytest.raises(TypeError, match="map-style"):
        CachedDataset(iter([1]), "bad")
    data.close()
