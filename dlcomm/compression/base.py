"""The compressor interface: one tensor into payloads and back, driven round by round.

A step of a compressed all-reduce for one tensor is a short, fixed list of rounds, declared
by ``Compressor.rounds``. Each round is one collective over the payloads the compressor
produced:

* ``ALLREDUCE``: payloads are summable; the driver sums each payload over ranks.
* ``ALLGATHER``: payloads are not summable; the driver gathers every rank's payloads.
* ``SPARSE_MERGE``: payloads are sparse (values, indices); the driver merges them pairwise
  over a tree with ``Compressor.merge`` (gTop-k) and every rank ends with the same result.
* ``REDUCE_SCATTER``: payloads are summable and 1-D; rank ``i`` of the round's group gets
  the sum of part ``i`` (``Compressor.scatter_counts`` sizes the parts; never the last round).

Protocol (what a driver, the unfused ``exchange.compressed_allreduce`` or a fusion engine,
does)::

    payloads, ctx = c.compress(tensor, name)            # round 0 payloads
    for i, kind in enumerate(c.rounds):
        result = <collective `kind` over payloads>      # summed / gathered / merged
        if i < len(c.rounds) - 1:
            payloads, ctx = c.resume(result, ctx)       # next round's payloads
    if kind == ALLREDUCE:
        out = c.decompress(result, ctx)                 # sum over ranks; / size to average
    else:  # ALLGATHER
        out = c.decompress_all(result, ctx, op)         # all ranks' payloads, combined
        # or, into the caller's buffer where the compressor offers it (sparse ones):
        # c.decompress_all_into(result, ctx, op, out) is not None

A round spans every rank unless ``Compressor.groups`` says HOST (the ranks of this rank's
host) or PEER (the ranks with this local rank on every host); the driver then runs it on those
sub-communicators and gives the compressor the ``HostTopology`` in ``ctx.topology`` (htopk).

All rounds of all tensors with the same round index can be fused into one buffer: a round's
payloads depend only on that tensor's previous round. Results are sums; averaging divides at
the end (low-rank compressors orthogonalise, which is scale-free, so sums are enough).

Compressors hold no state other than per-tensor-name state objects (``self.states``), e.g.
PowerSGD's warm-start Q or a step counter. ``decompress`` on ALLREDUCE results and
``decompress_all`` (or ``decompress_all_into``) are called exactly once per step and tensor, so
they may update such state
(error feedback's momentum correction does); ``local_estimate`` (what this rank alone sent,
used by error feedback), ``unsent`` and ``decompress`` of ALLGATHER payloads must not.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlcomm.array_api import FLOAT_DTYPES, array_namespace

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
SPARSE_MERGE = "sparse_merge"
REDUCE_SCATTER = "reduce_scatter"
ROUND_KINDS = (ALLREDUCE, ALLGATHER, SPARSE_MERGE, REDUCE_SCATTER)
# Which ranks a round's collective spans (``Compressor.groups``): all of them, the ranks of
# this rank's host, or this rank's peers (the ranks with its local rank on the other hosts).
WORLD = "world"
HOST = "host"
PEER = "peer"
GROUPS = (WORLD, HOST, PEER)
OPS = ("sum", "average")

DEFAULT_MIN_COMPRESS_SIZE = 1024


@dataclass
class Context:
    """What decompress needs besides payloads: shape, dtype, current round, per-call data.

    ``shape``/``dtype``/``name`` are the same on every rank, so a context can decompress
    another rank's payloads (ALLGATHER). ``data`` holds call-local values (e.g. PowerSGD's
    orthogonalised P, error feedback's accumulated gradient).
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    round: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    # The driver's ``HostTopology`` for compressors with HOST or PEER rounds (else None).
    topology: Any = None

    @property
    def size(self) -> int:
        """Number of elements of the original tensor."""
        return int(np.prod(self.shape, dtype=np.int64))


def check_tensor(tensor: object, name: object) -> None:
    """Raise TypeError unless ``tensor`` is a float16/32/64 array and ``name`` a str."""
    array_namespace(tensor)
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"tensor {name!r}: dtype {tensor.dtype} is not compressible; expected one of "
            f"{[str(d) for d in FLOAT_DTYPES]}"
        )
    if not isinstance(name, str) or not name:
        raise TypeError(f"tensor name must be a non-empty str, got {name!r}")


def check_momentum(momentum: object) -> float:
    """Return ``momentum`` as float; ValueError unless it is a number in [0, 1)."""
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float, np.floating)) \
            or not 0 <= momentum < 1:
        raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
    return float(momentum)


def check_op(op: str) -> None:
    """Raise ValueError unless ``op`` is 'sum' or 'average'."""
    if op not in OPS:
        raise ValueError(f"op must be one of {list(OPS)}, got {op!r}")


class Compressor:
    """Base class: a lossy (or lossless) codec for one tensor plus how its payloads combine.

    Subclasses set ``name`` and ``rounds`` and implement ``_compress`` and ``decompress``;
    multi-round ones also ``_resume``; SPARSE_MERGE ones ``merge``. Arguments common to all:
    ``min_compress_size`` (tensors with fewer elements bypass compression) and
    ``compress_1d`` (1-D tensors, e.g. biases, bypass unless True); see ``applies_to``.
    """

    name: str = "base"
    rounds: tuple[str, ...] = (ALLREDUCE,)
    # Per round, the ranks its collective spans (see GROUPS); None: every round over all.
    round_groups: tuple[str, ...] | None = None

    def __init__(
        self, *, min_compress_size: int = DEFAULT_MIN_COMPRESS_SIZE, compress_1d: bool = False
    ) -> None:
        if not isinstance(min_compress_size, (int, np.integer)) or min_compress_size < 0:
            raise ValueError(f"min_compress_size must be an int >= 0, got {min_compress_size!r}")
        self.min_compress_size = int(min_compress_size)
        self.compress_1d = bool(compress_1d)
        self.states: dict[str, Any] = {}

    # -- properties a driver reads -------------------------------------------------------
    @property
    def groups(self) -> tuple[str, ...]:
        """Per round, the ranks its collective spans: WORLD (all ranks, the default), HOST
        (this rank's host) or PEER (the ranks with this local rank on every host)."""
        return self.round_groups or (WORLD,) * len(self.rounds)

    @property
    def summable(self) -> bool:
        """True when every round is an all-reduce over all ranks (payloads can ride dense
        fusion buffers)."""
        return all(kind == ALLREDUCE for kind in self.rounds) and \
            all(group == WORLD for group in self.groups)

    def applies_to(self, tensor: object) -> bool:
        """Whether ``tensor`` is compressed; small and (by default) 1-D tensors go dense."""
        if tensor.size < max(1, self.min_compress_size):
            return False
        return tensor.ndim >= 2 or self.compress_1d

    def compresses(self, tensor: object, name: str) -> bool:
        """Whether this exchange of ``tensor`` (named ``name``) is compressed: ``applies_to``
        here; ``DenseStart`` also sends a tensor's first exchanges dense. A driver calls it
        once per exchange (it may count)."""
        return self.applies_to(tensor)

    def for_tensor(self, tensor: object, name: str, comm: Any) -> Compressor:
        """The compressor that exchanges ``tensor`` over ``comm`` once ``compresses`` said
        yes: this one, or for a choice among compressors (``topk:hierarchical=auto``) the
        one chosen for it. The driver calls it on every rank at the same point, so a choice
        may run collectives over ``comm`` (its first measurement)."""
        return self

    # -- the protocol ----------------------------------------------------------------------
    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        """Return round 0's payloads for ``tensor`` and the context for the next calls."""
        check_tensor(tensor, name)
        return self._compress(tensor, name)

    def resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        """Given the collective's result of the current round, return the next round's payloads."""
        if ctx.round >= len(self.rounds) - 1:
            raise ValueError(
                f"tensor {ctx.name!r}: {self.name} has {len(self.rounds)} round(s); "
                f"resume called after round {ctx.round}"
            )
        ctx.round += 1
        return self._resume(reduced, ctx)

    def decompress(self, payloads: list, ctx: Context) -> object:
        """Rebuild a tensor of ``ctx.shape``/``ctx.dtype`` from final-round payloads."""
        raise NotImplementedError

    def local_estimate(self, payloads: list, ctx: Context) -> object:
        """This rank's own contribution from its final-round payloads (pure; error feedback)."""
        return self.decompress(payloads, ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object | None:
        """``tensor`` less what this step's selection sent of it, for compressors whose
        selection is linear (sparsifiers: zeros at the sent indices; low rank: minus the
        projection onto the sent subspace); None for the others. Pure; called with the final
        round's payloads (error feedback's momentum factor masking)."""
        return None

    def aggregate(self, tensors: list, op: str = "average") -> object:
        """Combine decompressed ALLGATHER results of all ranks (default: sum or mean)."""
        check_op(op)
        if not tensors:
            raise ValueError("aggregate needs at least one tensor")
        out = tensors[0].copy()
        for t in tensors[1:]:
            out += t
        if op == "average":
            out /= len(tensors)
        return out

    def decompress_all(self, per_rank: list, ctx: Context, op: str = "average") -> object:
        """Every rank's final ALLGATHER payloads combined into one tensor: by default
        ``aggregate`` of each rank's ``decompress``; sparse compressors override it to add
        each rank's values into one buffer instead of building a dense tensor per rank.
        Returns a new array, which the caller owns (error feedback keeps it as it is)."""
        return self.aggregate([self.decompress(p, ctx) for p in per_rank], op)

    def decompress_all_into(self, per_rank: list, ctx: Context, op: str, out: object
                            ) -> object | None:
        """``decompress_all`` written into ``out`` (an array of ``ctx.shape``/``ctx.dtype``)
        instead of a new array, for compressors whose result is sparse: returns the flat
        indices outside which ``out`` is now zero (repeats allowed; ``slice(None)``: any
        position may be non-zero). None (``out`` untouched;
        the caller then calls ``decompress_all``) where the compressor does not offer it.
        The same bits as ``decompress_all``; it saves the dense temporaries and the copy."""
        return None

    def merge(self, lower: list, higher: list, ctx: Context) -> list:
        """Combine two ranks' SPARSE_MERGE payloads (lower rank first, so all ranks agree)."""
        raise NotImplementedError(f"{self.name} has no SPARSE_MERGE round")

    def scatter_counts(self, n: int, size: int, ctx: Context) -> list[int]:
        """For a REDUCE_SCATTER round over ``size`` ranks: how many of a payload's ``n``
        elements (contiguous, in rank order) each rank receives summed. Default: near-equal
        parts. The same on every rank of the group."""
        return [n * (i + 1) // size - n * i // size for i in range(size)]

    def set_momentum(self, momentum: float) -> None:
        """The momentum the optimizer applies after the all-reduce (SGD's ``momentum``).
        Only error feedback uses it (momentum correction, see ``error_feedback``); a
        compressor without error feedback checks it and otherwise ignores it."""
        check_momentum(momentum)

    def reset_state(self, name: str | None = None) -> None:
        """Forget per-tensor state (all tensors when ``name`` is None)."""
        if name is None:
            self.states.clear()
        else:
            self.states.pop(name, None)

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Copies of every piece of state that affects the next step, by tensor name (step
        counters, warm-start factors; wrappers add theirs), with the spec it belongs to, so
        that a run resumed through ``load_state_dict`` compresses exactly as the
        uninterrupted run would have."""
        return {"compressor": self._identity(), "states": copy_state(self.states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (copies); ValueError if it came from another
        compressor or is not such a dict."""
        if not isinstance(state, dict) or "compressor" not in state or "states" not in state:
            raise ValueError("load_state_dict expects what Compressor.state_dict() returned "
                             "(a dict with 'compressor' and 'states')")
        if state["compressor"] != self._identity():
            raise ValueError(f"the checkpoint's compression state is for "
                             f"{state['compressor']!r}, but this compressor is "
                             f"{self._identity()!r}: build the same compressor to resume")
        self.states = copy_state(state["states"])

    def _identity(self) -> str:
        """The class and spec, so a checkpoint is never loaded into another compressor."""
        return f"{type(self).__name__}({self.describe()})"

    # -- for subclasses --------------------------------------------------------------------
    def _compress(self, tensor: object, name: str) -> tuple[list, Context]:
        raise NotImplementedError

    def _resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        raise NotImplementedError

    @staticmethod
    def _context(tensor: object, name: str) -> Context:
        return Context(name=name, shape=tuple(tensor.shape), dtype=np.dtype(tensor.dtype))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"

    def describe(self) -> str:
        """The registry spec that builds an equivalent compressor (best effort)."""
        return self.name


class CompressorWrapper(Compressor):
    """A compressor that delegates to ``inner`` (error feedback, payload casts)."""

    def __init__(self, inner: Compressor) -> None:
        if not isinstance(inner, Compressor):
            raise TypeError(f"expected a Compressor, got {type(inner).__name__}")
        self.inner = inner
        self.name = inner.name
        self.states = {}

    @property
    def rounds(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.rounds

    @property
    def groups(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.groups

    @property
    def min_compress_size(self) -> int:  # type: ignore[override]
        return self.inner.min_compress_size

    @property
    def compress_1d(self) -> bool:  # type: ignore[override]
        return self.inner.compress_1d

    @property
    def summable(self) -> bool:
        return self.inner.summable

    def compresses(self, tensor: object, name: str) -> bool:
        return self.inner.compresses(tensor, name)

    def compress(self, tensor: object, name: str) -> tuple[list, Context]:
        return self.inner.compress(tensor, name)

    def resume(self, reduced: list, ctx: Context) -> tuple[list, Context]:
        return self.inner.resume(reduced, ctx)

    def decompress(self, payloads: list, ctx: Context) -> object:
        return self.inner.decompress(payloads, ctx)

    def local_estimate(self, payloads: list, ctx: Context) -> object:
        return self.inner.local_estimate(payloads, ctx)

    def unsent(self, tensor: object, payloads: list, ctx: Context) -> object | None:
        return self.inner.unsent(tensor, payloads, ctx)

    def aggregate(self, tensors: list, op: str = "average") -> object:
        return self.inner.aggregate(tensors, op)

    def decompress_all(self, per_rank: list, ctx: Context, op: str = "average") -> object:
        # Only valid while this wrapper's decompress is the inner one's; wrappers that
        # transform payloads (PayloadCast) override it.
        return self.inner.decompress_all(per_rank, ctx, op)

    def decompress_all_into(self, per_rank: list, ctx: Context, op: str, out: object
                            ) -> object | None:
        return self.inner.decompress_all_into(per_rank, ctx, op, out)

    def merge(self, lower: list, higher: list, ctx: Context) -> list:
        return self.inner.merge(lower, higher, ctx)

    def scatter_counts(self, n: int, size: int, ctx: Context) -> list[int]:
        return self.inner.scatter_counts(n, size, ctx)

    def set_momentum(self, momentum: float) -> None:
        self.inner.set_momentum(momentum)

    def reset_state(self, name: str | None = None) -> None:
        super().reset_state(name)
        self.inner.reset_state(name)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "inner" not in state:
            raise ValueError(f"the checkpoint's compression state has no 'inner' part, but "
                             f"{self._identity()!r} wraps another compressor")
        super().load_state_dict(state)
        self.inner.load_state_dict(state["inner"])

    def describe(self) -> str:
        return self.inner.describe()


def with_param(spec: str, key: str, value: object) -> str:
    """The registry ``spec`` with ``key=value`` added to its parameters (before a ``+cast``),
    for ``describe`` of a wrapper that a spec parameter builds."""
    head, plus, cast = spec.partition("+")
    sep = "," if ":" in head else ":"
    return f"{head}{sep}{key}={value}{plus}{cast}"


def copy_state(state: Any) -> Any:
    """A copy of nested per-tensor state: dicts, lists and tuples rebuilt, arrays copied,
    numbers and strings as they are."""
    if isinstance(state, dict):
        return {k: copy_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(copy_state(v) for v in state)
    if hasattr(state, "shape") and hasattr(state, "copy"):
        return state.copy()
    return state
