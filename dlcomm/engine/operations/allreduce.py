"""Dense all-reduce of one fusion group: one tensor straight into its output, several packed
into the fusion buffer (reduced in place, then unpacked into the outputs), or, when no
caller gave outputs, reduced into a fresh buffer whose views are the results.

Prescale factors are applied while packing; postscale factors and the average's division
(by every member of the process set, as Horovod: joined ranks send zeros) while unpacking,
float16 scaled in float32 and integers in float64 (``scale_into``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.engine import fusion
from dlcomm.engine.operations.base import EngineState, Item, Operation
from dlcomm.engine.request import Request
from dlcomm.errors import PeerLostError
from dlcomm.kernels import scale_into
from dlcomm.ops import ReduceOp

# A tensor this large is all-reduced on its own rather than packed into the fusion buffer:
# its start-up cost is small next to the two copies packing would add.
SOLO_TENSOR_BYTES = 4 << 20


class DenseAllreduce(Operation):
    batched = True

    def __init__(self, state: EngineState) -> None:
        self.state = state

    def execute(self, items: Sequence[Item]) -> None:
        """All-reduce one fusion group (same process set, dtype, op and joined ranks)."""
        sig = items[0][0].reference
        comm = self.state.process_set(items[0][0]).data_comm(sig.device)
        op = ReduceOp(sig.op)
        wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
        dtype = np.dtype(sig.dtype)
        # Inputs and outputs of every tensor in the group (a grouped request has several).
        inputs: list[np.ndarray] = []
        outputs: list[np.ndarray | None] = []
        pre: list[float] = []
        post: list[float] = []
        owners: list[tuple[Request | None, int]] = []  # (request, number of its tensors)
        tensor_names: list[str] = []  # the request of each tensor
        for resp, req in items:
            rsig = resp.reference
            divisor = len(resp.members) if op is ReduceOp.AVERAGE else 1
            if req is None:  # this rank joined: it contributes zeros and keeps nothing
                arrays = [np.zeros(s, dtype=dtype) for s in rsig.shapes]
                outs: list[Any] = [None] * len(arrays)
            else:
                arrays, outs = req.arrays, req.outputs
            inputs += arrays
            outputs += outs
            pre += [rsig.prescale] * len(arrays)
            post += [rsig.postscale / divisor] * len(arrays)
            owners.append((req, len(arrays)))
            tensor_names += [resp.name] * len(arrays)
        names = [resp.name for resp, _ in items]
        try:
            if len(inputs) == 1:
                if outputs[0] is None:
                    outputs[0] = array_namespace(inputs[0]).empty_like(inputs[0])
                self._single(comm, inputs[0], outputs[0], pre[0], post[0], wire_op, names[0])
            elif all(o is None for o in outputs):
                outputs = self._fused_into_new(comm, inputs, pre, post, wire_op, names, dtype)
            else:
                outputs = [array_namespace(x).empty_like(x) if o is None else o
                           for x, o in zip(inputs, outputs)]
                self._fused(comm, inputs, outputs, pre, post, wire_op, tensor_names, dtype)
        except PeerLostError:  # the job is broken: the engine stops and closes the mesh
            raise
        except Exception as exc:
            for req, _ in owners:
                if req is not None:
                    req.handle.set_error(exc)
            if any(req is None for req, _ in owners):
                raise
            return
        pos = 0
        for req, count in owners:
            if req is not None:
                outs = outputs[pos:pos + count]
                req.handle.set_result(outs if req.grouped else outs[0])
            pos += count

    def _names(self, names: list[str]) -> list[str]:
        """The rows a fused phase is drawn on (none when the timeline is off)."""
        return names if self.state.timeline.enabled else []

    def _single(self, comm: Any, x: np.ndarray, out: np.ndarray, pre: float, post: float,
                op: ReduceOp, name: str) -> None:
        """One tensor: reduce straight into its output (no fusion copy)."""
        with self.state.timeline.phase(name, "communicate", {"bytes": x.nbytes}):
            flat_out = out.reshape(-1)
            if pre != 1.0:
                scale_into(x.reshape(-1), pre, flat_out)
                comm.allreduce(flat_out, flat_out, op)
            elif out is x:
                comm.allreduce(flat_out, flat_out, op)
            else:
                comm.allreduce(x.reshape(-1), flat_out, op)
            if post != 1.0:
                scale_into(flat_out, post, flat_out)

    def _fused(self, comm: Any, inputs: list[Any], outputs: list[Any], pre: list[float],
               post: list[float], op: ReduceOp, names: list[str], dtype: np.dtype) -> None:
        """Several tensors with outputs (``names``: each tensor's request): each large one
        reduced straight into its output (packing it would copy it twice to save one
        start-up cost), the rest packed, reduced in place and unpacked. Every rank splits
        alike (the sizes are negotiated); ``auto``'s rank-order bits do not depend on the
        split. The small ones go first: after a large all-reduce the ranks finish at
        slightly different times, and a small one there would make every rank wait for the
        last again (a bias after its weight, at the end of every backward pass)."""
        alone = [i for i, x in enumerate(inputs) if x.nbytes >= SOLO_TENSOR_BYTES]
        rest = [i for i, x in enumerate(inputs) if x.nbytes < SOLO_TENSOR_BYTES]
        if alone and len(rest) == 1:  # nothing to pack it with
            alone, rest = rest + alone, []
        if rest:
            self._packed(comm, [inputs[i] for i in rest], [outputs[i] for i in rest],
                         [pre[i] for i in rest], [post[i] for i in rest], op,
                         list(dict.fromkeys(names[i] for i in rest)), dtype)
        for i in alone:
            self._single(comm, inputs[i], outputs[i], pre[i], post[i], op, names[i])

    def _packed(self, comm: Any, inputs: list[Any], outputs: list[Any], pre: list[float],
                post: list[float], op: ReduceOp, names: list[str], dtype: np.dtype) -> None:
        """Pack ``inputs`` into the fusion buffer, all-reduce it in place, unpack."""
        timeline, rows = self.state.timeline, self._names(names)
        total = sum(a.size for a in inputs)
        with timeline.phase(rows, "fuse", {"tensors": len(inputs),
                                           "bytes": total * dtype.itemsize}):
            buf = self.state.buffers.get(dtype, total, like=inputs[0])
            offsets = fusion.pack(inputs, buf, pre)
        with timeline.phase(rows, "communicate"):
            comm.allreduce(buf, buf, op)
        with timeline.phase(rows, "unpack"):
            fusion.unpack(buf, outputs, offsets, post)

    def _fused_into_new(self, comm: Any, inputs: list[Any], pre: list[float],
                        post: list[float], op: ReduceOp, names: list[str],
                        dtype: np.dtype) -> list[Any]:
        """No caller-given outputs: reduce the packed buffer into a fresh one and return
        views of it, which saves the unpack copy."""
        timeline, rows = self.state.timeline, self._names(names)
        xp = array_namespace(inputs[0])
        total = sum(a.size for a in inputs)
        with timeline.phase(rows, "fuse", {"tensors": len(inputs),
                                           "bytes": total * dtype.itemsize}):
            buf = self.state.buffers.get(dtype, total, like=inputs[0])
            offsets = fusion.pack(inputs, buf, pre)
            result = xp.empty(total, dtype=dtype)
        with timeline.phase(rows, "communicate"):
            comm.allreduce(buf, result, op)
        if len(set(post)) == 1:
            if post[0] != 1.0:
                scale_into(result, post[0], result)
            post = [1.0] * len(post)
        outputs = []
        for x, start, scale in zip(inputs, offsets, post):
            view = result[start:start + x.size].reshape(x.shape)
            if scale != 1.0:
                scale_into(view, scale, view)
            outputs.append(view)
        return outputs
