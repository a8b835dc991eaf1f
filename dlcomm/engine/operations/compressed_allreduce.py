"""Compressed all-reduce of one group (same process set, dtype and compressor spec), through
compression's one round driver (``dlcomm.compression.exchange.run_rounds``).

Summable compressors (every round an all-reduce): the payloads of every tensor in the group
travel together, each round packed into as few fusion buffers as the threshold allows, over
the process set's data communicator. Others run tensor by tensor
(``compressed_allreduce``) on the set's exchange communicator.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.compression.exchange import compressed_allreduce, run_rounds
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
        for _, request in items:
            assert request is not None  # joined ranks are refused for compressed requests
        if items[0][1].compressor.summable:
            self._fused(items)
        else:
            for item in items:
                self._one_by_one(*item)

    def _fused(self, items: Sequence[Item]) -> None:
        """Every round's payloads of every tensor summed together, fused."""
        sig = items[0][0].reference
        comm = self.state.process_set(items[0][0]).data_comm(sig.device)
        timeline = self.state.timeline
        try:
            tensors = [(response.name, request, name, src, out)
                       for response, request in items
                       for name, src, out in _tensors(response, request)]

            def phase(index: int, name: str) -> AbstractContextManager:
                return timeline.phase(tensors[index][0], name)

            results = run_rounds([(t[1].compressor, t[3], t[2]) for t in tensors], comm,
                                 sig.op == "average", lambda arrays: self._sum(arrays, comm),
                                 phase)
            scale = sig.postscale / (comm.size if sig.op == "average" else 1)
            for (_, _, _, _, out), (value, _) in zip(tensors, results):
                scale_into(value, scale, out)
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

    def _one_by_one(self, response: Response, request: Request) -> None:
        """A compressor with all-gather or merge rounds: each tensor through its rounds."""
        sig = response.reference
        exchange = self.state.process_set(response).exchange_comm()
        timeline = self.state.timeline

        def phase(_: int, name: str) -> AbstractContextManager:  # inside "communicate"
            return timeline.phase(response.name, name)

        try:
            for name, src, out in _tensors(response, request):
                with timeline.phase(response.name, "communicate",
                                    {"compression": sig.compression}):
                    y = compressed_allreduce(request.compressor, src, name, exchange,
                                             average=sig.op == "average", phase=phase)
                scale_into(y, sig.postscale, out)
        except PeerLostError:  # the job is broken: the engine stops and closes the mesh
            raise
        except Exception as exc:
            request.handle.set_error(exc)
            return
        _complete(request)
