"""``topk:hierarchical=auto``: flat or hierarchical top-k, chosen per tensor by measured cost.

Flat top-k all-gathers every rank's ``k`` pairs across the slow links between hosts;
hierarchical top-k (``htopk``) sums densely inside each host first and sends only each
host's pairs between hosts. Which is faster depends on the density, the tensor's size, the
links inside and between hosts and what the cores are doing (on 2 hosts x 2 slots at 1 Gb/s
flat wins at 1% and ``htopk`` at 10%: docs/compression.md). So the choice is measured, not
assumed: on first use over a communicator whose ranks span several hosts with several ranks
each, both candidates are timed end to end on two probe sizes (``branch_costs``; every rank
gets the slowest rank's times), and each tensor goes to the one predicted faster for its size.
The costs are kept per topology in ``DLCOMM_COMPRESSION_COST_CACHE``, so later jobs on the
same hosts choose alike without measuring. A tensor keeps its choice for the whole run (and
in checkpoints). With one host, or a host of one rank, there is nothing to save inside a
host: flat, and nothing is measured.
"""
from __future__ import annotations

import logging
from typing import Any

from dlcomm.comm.counting import CountingCommunicator
from dlcomm.compression.base import Compressor, Context, with_param
from dlcomm.compression.branch_costs import BranchCosts, cache_directory, cached_branch_costs
from dlcomm.compression.topology import RANKS_PER_HOST_KNOB, HostTopology, host_groups
from dlcomm.config import knob_value

FLAT = "topk"
HIERARCHICAL = "htopk"
CHOICES = (FLAT, HIERARCHICAL)

log = logging.getLogger("dlcomm")


class HierarchyChoice(Compressor):
    """Routes each tensor to ``flat`` (a flat top-k) or ``hierarchical`` (an ``htopk``),
    each a whole compressor with its own error feedback; see the module doc.

    ``costs``: a ``BranchCosts`` to choose with instead of measuring (tests, or a model
    measured elsewhere); its candidates must be ``"topk"`` and ``"htopk"``.
    ``compression_cost_cache``: the cache directory (None: ``DLCOMM_COMPRESSION_COST_CACHE``;
    ``"off"``: measure in every job).
    """

    name = "topk"

    def __init__(self, flat: Compressor, hierarchical: Compressor,
                 costs: BranchCosts | None = None,
                 compression_cost_cache: str | None = None) -> None:
        for role, c in (("flat", flat), ("hierarchical", hierarchical)):
            if not isinstance(c, Compressor):
                raise TypeError(f"{role} must be a Compressor, got {type(c).__name__}")
        if flat.summable or hierarchical.summable:
            raise ValueError("both candidates must exchange sparse payloads (topk, htopk)")
        if costs is not None and (not isinstance(costs, BranchCosts)
                                  or set(costs.seconds) != set(CHOICES)):
            raise ValueError(f"costs must be a BranchCosts of {list(CHOICES)}, got {costs!r}")
        cache_directory(compression_cost_cache)  # a bad setting fails here, not mid-step
        self.cost_cache = compression_cost_cache
        self.flat = flat
        self.hierarchical = hierarchical
        self.fixed_costs = costs
        self.costs: BranchCosts | None = costs  # what the last choice was made with
        self.states: dict[str, str] = {}  # tensor name -> FLAT or HIERARCHICAL

    # -- what a driver reads ----------------------------------------------------------------
    @property
    def rounds(self) -> tuple[str, ...]:  # type: ignore[override]
        raise TypeError("topk:hierarchical=auto has the rounds of the compressor it picks "
                        "for each tensor: ask for_tensor(tensor, name, comm) first")

    @property
    def summable(self) -> bool:
        return False

    @property
    def min_compress_size(self) -> int:  # type: ignore[override]
        return self.flat.min_compress_size

    @property
    def compress_1d(self) -> bool:  # type: ignore[override]
        return self.flat.compress_1d

    def applies_to(self, tensor: object) -> bool:
        return self.flat.applies_to(tensor)

    def compresses(self, tensor: object, name: str) -> bool:
        return self.flat.compresses(tensor, name)

    @property
    def choices(self) -> dict[str, str]:
        """Tensor name -> ``"topk"`` or ``"htopk"``, for the tensors chosen so far."""
        return dict(self.states)

    def for_tensor(self, tensor: object, name: str, comm: Any) -> Compressor:
        """``flat`` or ``hierarchical`` for ``tensor``: its earlier choice, else the one
        predicted faster for its size (collective the first time on ``comm``: the topology,
        then the measurement)."""
        choice = self.states.get(name)
        if choice is None:
            choice = self.states[name] = self._choose(tensor, name, comm)
        return self.flat if choice == FLAT else self.hierarchical

    def _choose(self, tensor: object, name: str, comm: Any) -> str:
        topology = _hosts_of_several(comm)
        if topology is None:
            return FLAT
        costs = self.fixed_costs
        if costs is None:
            context = (topology.host_count, topology.shards,
                       int(knob_value(RANKS_PER_HOST_KNOB)))
            # The probes are not the job's payload: dlcomm.bytes_sent() does not count them.
            probe_comm = comm.inner if isinstance(comm, CountingCommunicator) else comm
            costs = comm.cached(("topk_hierarchy_costs", self.describe(), tensor.dtype.str),
                                lambda: cached_branch_costs(
                                    {FLAT: self.flat, HIERARCHICAL: self.hierarchical},
                                    probe_comm, tensor, context, self.cost_cache))
        self.costs = costs
        choice = costs.cheapest(int(tensor.size))
        if comm.rank == 0:
            log.info("%s: tensor %r (%d elements) goes %s (predicted %.2f ms flat, %.2f ms "
                     "hierarchical)", self.describe(), name, tensor.size, choice,
                     1e3 * costs.predict(FLAT, tensor.size),
                     1e3 * costs.predict(HIERARCHICAL, tensor.size))
        return choice

    # -- state shared by both candidates ------------------------------------------------------
    def set_momentum(self, momentum: float) -> None:
        self.flat.set_momentum(momentum)
        self.hierarchical.set_momentum(momentum)

    def reset_state(self, name: str | None = None) -> None:
        super().reset_state(name)
        self.flat.reset_state(name)
        self.hierarchical.reset_state(name)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "flat": self.flat.state_dict(),
                "hierarchical": self.hierarchical.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "flat" not in state or "hierarchical" not in state:
            raise ValueError(f"the checkpoint's compression state is not one of "
                             f"{self._identity()!r} (no 'flat' and 'hierarchical' parts)")
        super().load_state_dict(state)
        self.flat.load_state_dict(state["flat"])
        self.hierarchical.load_state_dict(state["hierarchical"])

    def describe(self) -> str:
        return with_param(self.flat.describe(), "hierarchical", "auto")

    # -- the protocol belongs to the chosen compressor ----------------------------------------
    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        raise TypeError("topk:hierarchical=auto exchanges each tensor through the compressor "
                        "for_tensor picks; the exchange driver (run_rounds) asks it")


def _hosts_of_several(comm: Any) -> HostTopology | None:
    """``comm``'s host topology where its ranks span several hosts that each hold several
    ranks (where ``htopk`` has a sum inside a host to make), else None. Collective the first
    time (``host_groups``)."""
    if comm.size == 1 or not all(hasattr(comm, a) for a in ("split", "split_by_host",
                                                              "cached")):
        return None
    topology = host_groups(comm).topology
    return topology if topology.host_count > 1 and topology.shards > 1 else None
