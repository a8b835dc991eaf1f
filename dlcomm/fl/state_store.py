"""Client state kept off the model: in this process's memory up to a byte budget, the least
recently used spilled to disk beyond it; never one process or model copy per client.

Files live in a directory every rank can read (one host's temporary directory, or a shared
file system across hosts), named by client and by the round that produced the state, and are
written atomically. When the scheduler moves a client to another rank, the old owner writes
its state out and the new owner waits for exactly that round's file, so no extra collective
is needed and a stale file is never read.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from dlcomm.fl.arrays import NamedArrays, nbytes


class ClientStateStore:
    """States keyed by client id, each stamped with the round (``version``) that made it."""

    def __init__(self, directory: str | os.PathLike, memory_budget: int,
                 wait_seconds: float = 300.0) -> None:
        if not isinstance(memory_budget, int) or memory_budget < 0:
            raise ValueError(f"memory_budget must be a number of bytes >= 0, "
                             f"got {memory_budget!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.memory_budget = memory_budget
        self.wait_seconds = float(wait_seconds)
        self._memory: OrderedDict[int, tuple[int, NamedArrays]] = OrderedDict()
        self._on_disk: dict[int, int] = {}  # files this process wrote: client -> version
        self.bytes_in_memory = 0
        self.peak_bytes_in_memory = 0
        self.spills = 0
        self.loads = 0

    def path(self, client: int, version: int) -> Path:
        return self.directory / f"client{client:08d}_round{version:06d}.npz"

    def __contains__(self, client: int) -> bool:
        return client in self._memory

    def put(self, client: int, state: NamedArrays, version: int) -> None:
        """Keep ``state`` as ``client``'s, made in round ``version``; spill if over budget."""
        self._drop(client)
        self._memory[client] = (version, {n: np.asarray(a) for n, a in state.items()})
        self.bytes_in_memory += nbytes(state)
        while self.bytes_in_memory > self.memory_budget and self._memory:
            victim = next(iter(self._memory))
            self._spill(victim)
        # what the store holds between calls (the state just put is the caller's until then)
        self.peak_bytes_in_memory = max(self.peak_bytes_in_memory, self.bytes_in_memory)

    def get(self, client: int, version: int) -> NamedArrays:
        """``client``'s state of round ``version``: from memory, else from its file (waiting
        up to ``wait_seconds`` for another rank to write it). Raises if it never appears."""
        held = self._memory.get(client)
        if held is not None:
            if held[0] != version:
                raise RuntimeError(f"client {client}: this rank holds its state of round "
                                   f"{held[0]}, but round {version}'s was expected")
            self._memory.move_to_end(client)
            return held[1]
        path = self.path(client, version)
        deadline = time.monotonic() + self.wait_seconds
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"client {client}'s state of round {version} did not appear "
                                   f"in {self.directory} within {self.wait_seconds:g} s: is "
                                   "the state directory shared by every rank?")
            time.sleep(0.002)
        with np.load(path) as f:
            state = {n: f[n] for n in f.files}
        path.unlink()
        self._on_disk.pop(client, None)
        self.loads += 1
        self.put(client, state, version)
        return state

    def release(self, client: int) -> None:
        """Write ``client``'s state to its file and forget it here (it moves to another rank)."""
        if client in self._memory:
            self._spill(client)
        self._on_disk.pop(client, None)  # the next owner deletes the file when it loads it

    def _spill(self, client: int) -> None:
        version, state = self._memory.pop(client)
        self.bytes_in_memory -= nbytes(state)
        path = self.path(client, version)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(f, **state)
        os.replace(tmp, path)
        self._on_disk[client] = version
        self.spills += 1

    def _drop(self, client: int) -> None:
        held = self._memory.pop(client, None)
        if held is not None:
            self.bytes_in_memory -= nbytes(held[1])
        old = self._on_disk.pop(client, None)
        if old is not None:
            self.path(client, old).unlink(missing_ok=True)
