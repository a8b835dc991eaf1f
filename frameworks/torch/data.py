"""``dlcomm.torch.data``: a torch ``Dataset`` whose decoded samples come from dlcomm's
multi-level cache (host memory shared by the host's ranks, then local disk)."""
from __future__ import annotations

import os
from typing import Any

import torch.utils.data

from dlcomm.data import CacheStats, SampleCache

__all__ = ["CacheStats", "CachedDataset", "SampleCache"]


class CachedDataset(torch.utils.data.Dataset):
    """``dataset`` (map-style) with every ``dataset[i]`` kept in a ``SampleCache``.

    The first epoch pays each sample's loading and decoding once per host; later epochs (and
    the host's other ranks, whatever shard they draw) read the decoded value back. ``name``
    identifies the data and its transform; the other arguments go to ``SampleCache``. Use it
    under a ``DistributedSampler`` (or ``BalancedBatchSampler``) as any dataset.
    """

    def __init__(self, dataset: torch.utils.data.Dataset, name: str,
                 memory_bytes: int | None = None, disk_dir: str | os.PathLike | None = None,
                 disk_bytes: int | None = None, persistent: bool = False) -> None:
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"CachedDataset wraps a map-style dataset (with __getitem__ and "
                            f"__len__), got {type(dataset).__name__}")
        self.dataset = dataset
        self.cache = SampleCache(name, memory_bytes=memory_bytes, disk_dir=disk_dir,
                                 disk_bytes=disk_bytes, persistent=persistent)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        index = int(index)
        if not 0 <= index < len(self.dataset):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)}")
        return self.cache.get(index, self.dataset.__getitem__)

    def epoch_stats(self) -> CacheStats:
        """This process's hits, misses and load time since the last call (call it once per
        epoch; with DataLoader workers each worker counts its own)."""
        return self.cache.reset_stats()

    def close(self) -> None:
        """Close the cache (see ``SampleCache.close``)."""
        self.cache.close()
