"""``dlcomm.torch.elastic``: Horovod's ``hvd.elastic`` for PyTorch. ``TorchState`` commits a
model, an optimizer (with dlcomm's own state: compression residuals, schedule state) and
any picklable attributes; ``ElasticSampler`` shards the samples an epoch has not yet seen
over however many ranks the job has now."""
from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sized
from typing import Any

import torch

import dlcomm
from dlcomm.elastic import HostsUpdatedInterrupt, ObjectState, PeerLostError, State, run
from dlcomm.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "PeerLostError", "State",
           "TorchState", "run"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards one epoch's (shuffled) sample indices over the ranks, skipping those already
    processed, so that after the job re-forms the epoch goes on where it stopped.
    ``record_batch(batch_idx, batch_size)`` after each step counts the samples every rank
    processed; ``set_epoch(epoch)`` starts an epoch."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        if not hasattr(dataset, "__len__"):
            raise TypeError("ElasticSampler needs a dataset with a length")
        self.dataset, self.shuffle, self.seed = dataset, bool(shuffle), int(seed)
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: a fresh order, nothing processed."""
        self.epoch, self.processed_num = int(epoch), 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Count one step of ``batch_size`` samples on every rank as processed."""
        if batch_size < 0:
            raise ValueError(f"batch_size must be >= 0, got {batch_size}")
        self.processed_num += batch_size * self.num_replicas

    def reset(self) -> None:
        """Re-shard the remaining samples over the current ranks (iteration then starts
        after the samples processed so far)."""
        self.num_replicas, self.rank = dlcomm.size(), dlcomm.rank()
        self._skip = self.processed_num
        remaining = max(len(self.dataset) - self.processed_num, 0)
        self.num_samples = math.ceil(remaining / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.processed_num = int(state["epoch"]), int(state["processed_num"])
        self.reset()

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        else:
            order = list(range(len(self.dataset)))
        remaining = order[self._skip:]
        if remaining:  # pad by repeating so every rank gets the same number of samples
            copies = math.ceil(self.total_size / len(remaining))
            remaining = (remaining * copies)[:self.total_size]
        return iter(remaining[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


class TorchState(ObjectState):
    """Elastic state of a PyTorch job: ``model``'s ``state_dict``, ``optimizer``'s (a
    ``DistributedOptimizer``'s includes dlcomm's per-rank state), samplers given as keywords
    (``ElasticSampler``) and any other picklable keyword attributes (``epoch=0``)."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.model, self.optimizer = model, optimizer
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self._samplers})
        for name, sampler in self._samplers.items():
            setattr(self, name, sampler)
        self.save()

    def save(self) -> None:
        super().save()
        self._saved_model = (None if self.model is None else
                             {k: v.detach().clone() for k, v in self.model.state_dict().items()})
        self._saved_optimizer = (None if self.optimizer is None
                                 else copy.deepcopy(self.optimizer.state_dict()))
        self._saved_samplers = {k: s.state_dict() for k, s in self._samplers.items()}

    def restore(self) -> None:
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            discard = getattr(self.optimizer, "discard_in_flight", None)
            if discard is not None:  # a DistributedOptimizer stopped mid-step by the failure
                discard()
            self.optimizer.load_state_dict(copy.deepcopy(self._saved_optimizer))
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(self._saved_samplers[name])
        super().restore()

    def sync(self) -> None:
        root = self.sync_root()
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=root)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=root, model=self.model)
        samplers = broadcast_object({k: s.state_dict() for k, s in self._samplers.items()},
                                    root_rank=root, name="dlcomm.elastic.samplers")
        for name, sampler in self._samplers.items():
            sampler.load_state_dict(samplers[name])
        self.sync_objects(root)
        self.save()

    def reset(self) -> None:
        for sampler in self._samplers.values():
            sampler.reset()
