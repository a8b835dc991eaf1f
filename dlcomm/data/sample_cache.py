"""A multi-level cache of decoded training samples: host memory shared by the ranks of a
host, then local disk, then the source.

Decoding (reading a file, decompressing, converting) is paid once per sample per host: the
first rank that needs a sample loads it from the source and writes the decoded value into
the memory level, a directory on a RAM file system (``/dev/shm``) that every rank of the host
reads. Each rank may fill the memory level up to its share of the host's byte budget; beyond
it samples spill to a directory on local disk (with a budget of its own), and beyond that
they are simply not kept. Files are written under a temporary name and renamed, so a reader
never sees half a sample, and two ranks that miss the same sample at once both write a whole
copy. A cache that is not ``persistent`` belongs to the job: the last rank of the host to
close it (or to exit) removes its directories.
"""
from __future__ import annotations

import atexit
import dataclasses
import os
import pickle
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlcomm import basics
from dlcomm.config import knob_value

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MEMORY_ROOT = "/dev/shm"  # a RAM file system every process of the host sees


@dataclasses.dataclass
class CacheStats:
    """Where a rank's ``get`` calls found their samples, and the time they took."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0  # loaded from the source
    seconds: float = 0.0  # wall time inside get(), source loads included
    bytes_to_memory: int = 0  # written by this rank
    bytes_to_disk: int = 0

    @property
    def requests(self) -> int:
        return self.memory_hits + self.disk_hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Fraction of requests served from either level (0 when there were none)."""
        return (self.memory_hits + self.disk_hits) / self.requests if self.requests else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "requests": self.requests, "hit_rate": self.hit_rate}


def _local_rank_and_size() -> tuple[int, int]:
    """This process's rank among the ranks of its host, and their number (0 of 1 before
    ``dlcomm.init()``)."""
    if basics.is_initialized():
        return basics.local_rank(), basics.local_size()
    return 0, 1


def _job_scope() -> str:
    """A name for the running job, so two jobs on a host do not share a non-persistent cache
    (Open MPI sets ``PMIX_NAMESPACE``; outside mpirun, this process)."""
    namespace = os.environ.get("PMIX_NAMESPACE") or f"pid{os.getpid()}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", namespace)


class SampleCache:
    """Decoded samples by integer index: ``get(index, load)`` returns the cached value or
    ``load(index)``, keeping what it loaded for every rank of the host.

    ``name`` identifies the data set and its decoding (different data under one name would be
    read back as if it were the same). ``memory_bytes``, ``disk_dir`` and ``disk_bytes``
    default to the knobs ``DLCOMM_DATA_CACHE_MEMORY_BYTES``, ``DLCOMM_DATA_CACHE_DIR`` and
    ``DLCOMM_DATA_CACHE_DISK_BYTES``; budgets are per host, each rank filling at most its
    share. A ``persistent`` cache outlives the job and is shared by later jobs that use the
    same name; otherwise its files belong to this job and go when each rank closes it.
    """

    def __init__(self, name: str, memory_bytes: int | None = None,
                 disk_dir: str | os.PathLike | None = None, disk_bytes: int | None = None,
                 persistent: bool = False, memory_root: str | os.PathLike = MEMORY_ROOT,
                 local_rank: int | None = None, local_size: int | None = None) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"name must be letters, digits, '.', '_' or '-' (it names "
                             f"directories), got {name!r}")
        memory_bytes = knob_value("data_cache_memory_bytes", memory_bytes)
        disk_bytes = knob_value("data_cache_disk_bytes", disk_bytes)
        for what, value in (("memory_bytes", memory_bytes), ("disk_bytes", disk_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{what} must be a whole number of bytes >= 0, got {value!r}")
        if (local_rank is None) != (local_size is None):
            raise ValueError("give local_rank and local_size together, or neither")
        if local_rank is None:
            local_rank, local_size = _local_rank_and_size()
        if not (isinstance(local_size, int) and local_size >= 1
                and isinstance(local_rank, int) and 0 <= local_rank < local_size):
            raise ValueError(f"local_rank must be in [0, local_size), got {local_rank} of "
                             f"{local_size}")
        memory_root = Path(memory_root)
        if not memory_root.is_dir():
            raise ValueError(f"memory_root {str(memory_root)!r} is not a directory (the "
                             "memory level needs a RAM file system such as /dev/shm)")
        disk_root = knob_value("data_cache_dir", None if disk_dir is None else str(disk_dir))
        disk_root = Path(disk_root or tempfile.gettempdir())
        scope = name if persistent else f"{name}.{_job_scope()}"
        self.name = name
        self.persistent = bool(persistent)
        self.memory_dir = memory_root / f"dlcomm-data-cache.{os.getuid()}" / scope
        self.disk_dir = disk_root / f"dlcomm-data-cache.{os.getuid()}" / scope
        self.memory_dir.mkdir(parents=True, exist_ok=True)
        self.disk_dir.mkdir(parents=True, exist_ok=True)
        self.memory_quota = memory_bytes // local_size
        self.disk_quota = disk_bytes // local_size
        self.local_rank = local_rank
        self.stats = CacheStats()
        self._marker = self.memory_dir / f".open.{local_rank}.{os.getpid()}"
        self._marker.touch()
        self._closed = False
        atexit.register(self.close)

    # --- levels -----------------------------------------------------------------------------
    def _file(self, directory: Path, index: int) -> Path:
        return directory / f"{index}.pkl"

    @staticmethod
    def _read(path: Path) -> tuple[bool, Any]:
        try:
            with open(path, "rb") as f:
                return True, pickle.load(f)
        except FileNotFoundError:
            return False, None

    def _write(self, directory: Path, index: int, payload: bytes) -> None:
        final = self._file(directory, index)
        temporary = directory / f".{index}.{os.getpid()}.tmp"
        temporary.write_bytes(payload)
        os.replace(temporary, final)  # atomic: readers see the whole sample or none

    def get(self, index: int, load: Callable[[int], Any]) -> Any:
        """The sample ``index``: from host memory, else local disk, else ``load(index)``
        (then kept in the first level with room in this rank's share)."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"index must be an int >= 0, got {index!r}")
        if self._closed:
            raise RuntimeError(f"SampleCache {self.name!r} is closed")
        start = time.perf_counter()
        try:
            found, value = self._read(self._file(self.memory_dir, index))
            if found:
                self.stats.memory_hits += 1
                return value
            found, value = self._read(self._file(self.disk_dir, index))
            if found:
                self.stats.disk_hits += 1
                return value
            value = load(index)
            self.stats.misses += 1
            payload = pickle.dumps(value, protocol=5)
            if self.stats.bytes_to_memory + len(payload) <= self.memory_quota:
                self._write(self.memory_dir, index, payload)
                self.stats.bytes_to_memory += len(payload)
            elif self.stats.bytes_to_disk + len(payload) <= self.disk_quota:
                self._write(self.disk_dir, index, payload)
                self.stats.bytes_to_disk += len(payload)
            return value
        finally:
            self.stats.seconds += time.perf_counter() - start

    def reset_stats(self) -> CacheStats:
        """Return the statistics so far and start counting afresh (e.g. once per epoch)."""
        stats, self.stats = self.stats, CacheStats()
        self.stats.bytes_to_memory = stats.bytes_to_memory  # the budgets keep counting
        self.stats.bytes_to_disk = stats.bytes_to_disk
        return stats

    def close(self) -> None:
        """Stop using the cache. The last process of the host to close a non-persistent cache
        removes its samples (a process that forked from this one, such as a DataLoader
        worker, shares this one's opening)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        self._marker.unlink(missing_ok=True)
        if self.persistent or any(self.memory_dir.glob(".open.*")):
            return
        for directory in (self.memory_dir, self.disk_dir):
            shutil.rmtree(directory, ignore_errors=True)

    def clear(self) -> None:
        """Remove every cached sample of this name on this host (all ranks' files; call it
        on one rank while no other uses the cache)."""
        for directory in (self.memory_dir, self.disk_dir):
            for path in directory.glob("*.pkl"):
                path.unlink(missing_ok=True)
        self.stats.bytes_to_memory = self.stats.bytes_to_disk = 0

    def __enter__(self) -> SampleCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
