"""Compressed all-reduce of one group (same process set, dtype and compressor spec), through
compression's one round driver (``dlcomm.compression.exchange.run_rounds``).

The tensors of the group travel together: each round's all-reduce payloads (and the dense
tensors a compressor passes over) packed into as few fusion buffers as the threshold allows,
its all-gather payloads into one all-gather per group of ranks, each merge step's into one
message; reduce-scatters go tensor by tensor. Summable compressors (every round an
all-reduce) run on the process set's data communicator; the others on its exchange
communicator (MPI's own).
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.compression.exchange import run_rounds
from dlcomm.engine import fusion
from dlcomm.engine.negotiation import Response
from dlcomm.engine.operations.base import EngineState, Item, Operation
from dlcomm.engine.request import Request
from dlcomm.errors import PeerLostError
from dlcomm.kernels import scale_into
from dlcomm.ops import ReduceOp


def _tensors(response: Response, request: Request) -> list[tuple[str, Any, Any]]:
    """(name for the compressor's state, prescaled input, output) per tensor of a request."""
    sig = response.reference
    request.outputs = [np.empty_like(x) if o is None else o
                       for x, o in zip(request.arrays, request.outputs)]
    out = []
    for i, (x, o) in enumerate(zip(request.arrays, request.outputs)):
        name = response.name if len(request.arrays) == 1 else f"{response.name}.{i}"
        src = x
        if sig.prescale != 1.0:
            src = array_namespace(x).empty_like(x)
            scale_into(x, sig.prescale, src)
        out.append((name, src, o))
    return out


def _complete(request: Request) -> None:
    request.handle.set_result(request.outputs if request.grouped else request.outputs[0])


class CompressedAllreduce(Operation):
    batched = True

    def __init__(self, state: EngineState) -> None:
        self.state = state

    def execute(self, items: Sequence[Item]) -> None:
        """Every tensor of the group through one ``run_rounds``: each round's all-reduces
        summed in fusion buffers, its all-gathers packed into one all-gather."""
        for _, request in items:
            assert request is not None  # joined ranks are refused for compressed requests
        sig = items[0][0].reference
        ps = self.state.process_set(items[0][0])
        summable = items[0][1].compressor.summable
        # Summable payloads ride the data communicator (the dense path's algorithms);
        # all-gather and merge rounds run on MPI's own (``exchange_comm``).
        comm = ps.data_comm(sig.device) if summable else ps.exchange_comm()
        timeline = self.state.timeline
        try:
            tensors = [(response.name, request.compressor, name, src, out)
                       for response, request in items
                       for name, src, out in _tensors(response, request)]

            def phase(index: int, name: str) -> AbstractContextManager:
                return timeline.phase(tensors[index][0], name)

            communicate = contextlib.nullcontext() if summable else timeline.phase(
                [response.name for response, _ in items], "communicate",
                {"compression": sig.compression})
            with communicate:
                # Combined straight into the outputs where no scaling follows (top-k).
                outs = [t[4] for t in tensors] if sig.postscale == 1.0 else None
                results = run_rounds([(t[1], t[3], t[2]) for t in tensors], comm,
                                     sig.op == "average",
                                     lambda arrays: self._sum(arrays, comm), phase, outs)
            average = sig.op == "average"
            for (*_, out), (value, summed) in zip(tensors, results):
                if value is out and not summed:
                    continue  # already there, unscaled
                scale_into(value, sig.postscale / (comm.size if average and summed else 1),
                           out)
        except PeerLostError:  # the job is broken: the engine stops and closes the mesh
            raise
        except Exception as exc:
            for _, request in items:
                request.handle.set_error(exc)
            return
        for _, request in items:
            _complete(request)

    def _sum(self, arrays: list[Any], comm: Any) -> list[Any]:
        """Sum ``arrays`` over ranks in as few messages as the threshold allows (new arrays)."""
        out = [array_namespace(a).empty_like(a) for a in arrays]
        sizes = [a.nbytes for a in arrays]
        for idx in fusion.plan_fusion(sizes, [a.dtype.str for a in arrays],
                                      max(self.state.fusion_threshold, 1)):
            parts = [arrays[i] for i in idx]
            total = sum(a.size for a in parts)
            buf = self.state.buffers.get(parts[0].dtype, total, like=parts[0])
            offsets = fusion.pack(parts, buf)
            comm.allreduce(buf, buf, ReduceOp.SUM)
            fusion.unpack(buf, [out[i] for i in idx], offsets)
        return out
