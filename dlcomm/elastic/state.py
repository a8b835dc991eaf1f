"""What an elastic job keeps across a lost or added worker: the training state each rank
commits in memory, rolls back to after a failure, and receives from a survivor after the
job re-forms. Horovod's ``State``/``ObjectState`` API; the frameworks add model and
optimizer handling (``dlcomm.torch.elastic.TorchState``)."""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from dlcomm import mpi_ops, runtime
from dlcomm.errors import HostsUpdatedInterrupt
from dlcomm.functions import allgather_object, broadcast_object
from dlcomm.ops import ReduceOp


class State:
    """Training state that survives a re-formed job: ``commit()`` keeps a copy in memory,
    ``restore()`` rolls back to it after a failure, ``sync()`` hands the newest committed
    copy from a survivor to every rank (new ones included)."""

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self.commits = 0  # how many commits this state has seen (travels with sync)

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call each of ``callbacks`` (no arguments) after every re-formation of the job,
        e.g. to scale the learning rate to the new number of ranks."""
        callbacks = list(callbacks)
        for callback in callbacks:
            if not callable(callback):
                raise TypeError(f"reset callbacks must be callable, got {callback!r}")
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run after the job re-formed: ``reset()``, then the registered callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep the current state as the one to roll back to, then raise
        ``HostsUpdatedInterrupt`` on every rank if the driver added or lost hosts. A
        collective call: every rank commits at the same step."""
        self.commits += 1
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank when the elastic driver wants the
        job re-formed (collective; a no-op outside elastic jobs)."""
        st = runtime.state()
        if st.elastic is None:
            return
        wanted = st.elastic.client.hosts_updated(st.elastic.assignment.round_id)
        # Ranks may ask at slightly different moments: agree, so all stop at this commit.
        agreed = mpi_ops.allreduce(np.array([int(wanted)], dtype=np.int32),
                                   name="dlcomm.elastic.hosts_updated", op=ReduceOp.MAX)
        if agreed[0]:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def sync_root(self) -> int:
        """The rank holding the newest committed state (the most commits; the lowest rank
        among equals): a survivor, never a worker that just joined."""
        counts = allgather_object(self.commits, name="dlcomm.elastic.commits")
        return int(np.argmax(counts))

    def save(self) -> None:
        """Copy the state to roll back to (called by ``commit``)."""
        raise NotImplementedError

    def restore(self) -> None:
        """Roll back to the last saved copy (after a failure)."""
        raise NotImplementedError

    def sync(self) -> None:
        """Make every rank's state the newest committed one (collective)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Adjust to the re-formed job (subclasses; nothing by default)."""


class ObjectState(State):
    """State made of picklable attributes given as keywords: ``ObjectState(epoch=0,
    batch=0)`` then ``state.epoch += 1``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = self._values()

    def _values(self) -> dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in self._names}

    def save(self) -> None:
        self._saved = self._values()

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        self.sync_objects(self.sync_root())

    def sync_objects(self, root: int) -> None:
        """Take ``root``'s attributes and commit count (collective)."""
        commits, values = broadcast_object((self.commits, self._values()), root,
                                           name="dlcomm.elastic.objects")
        self.commits = commits
        for name, value in values.items():
            setattr(self, name, value)
        self._saved = self._values()
