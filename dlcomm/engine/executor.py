"""Runs the agreed responses of one cycle on this rank: fusion, the collective, unpacking.

Every rank runs the same responses in the same order, so the collectives here match up
across ranks without further coordination.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.comm.counting import ByteCounter, CountingCommunicator
from dlcomm.engine import fusion
from dlcomm.engine.negotiation import Response
from dlcomm.engine.request import Kind, Request
from dlcomm.errors import MismatchError
from dlcomm.ops import ReduceOp

log = logging.getLogger("dlcomm")


class ProcessSetState:
    """A process set as the engine sees it: members and, on members, the communicators
    (wrapped to count the payload bytes sent through them)."""

    def __init__(self, set_id: int, ranks: tuple[int, ...], comm: Any,
                 counter: ByteCounter) -> None:
        self.id = set_id
        self.ranks = ranks
        self.comm = comm  # the transport communicator; None on ranks outside the set
        self.counter = counter
        self._data = None if comm is None else CountingCommunicator(comm, counter)
        self._exchange: Any = None  # compressed exchange's view of comm, made on first use
        self._nccl: Any = None  # NCCL communicator for device arrays, made on first use

    def data_comm(self, device: bool) -> Any:
        """MPI for host arrays; NCCL (created collectively on first use) for device ones."""
        if not device:
            return self._data
        if self._nccl is None:
            # CuPy's NCCL is an optional dependency, loaded for the first device array.
            from dlcomm.comm.nccl_backend import NCCLCommunicator  # noqa: PLC0415

            self._nccl = CountingCommunicator(NCCLCommunicator(self.comm), self.counter)
        return self._nccl

    def exchange_comm(self) -> Any:
        """The communicator compressed exchange runs its unfused rounds on (MPI's own
        all-reduce, as the rounds have always used)."""
        if self._exchange is None:
            self._exchange = CountingCommunicator(self.comm.plain, self.counter)
        return self._exchange

    def set_rank(self, world_rank: int) -> int:
        return self.ranks.index(world_rank)


class Executor:
    """Executes responses for one rank."""

    def __init__(self, rank: int, fusion_threshold: int, timeline: Any,
                 process_sets: dict[int, ProcessSetState],
                 on_add_process_set: Callable[[Response, Request | None], Any],
                 on_remove_process_set: Callable[[Response, Request | None], Any],
                 on_set_tunables: Callable[[Response, Request | None], Any]) -> None:
        self.rank = rank
        self.fusion_threshold = fusion_threshold
        self.timeline = timeline
        self.process_sets = process_sets
        self.buffers = fusion.FusionBuffer()
        self._on_add = on_add_process_set
        self._on_remove = on_remove_process_set
        self._on_set_tunables = on_set_tunables

    # --- dispatch ----------------------------------------------------------------------
    def run(self, responses: Sequence[Response], local: dict[str, Request]) -> None:
        """Execute ``responses``; complete the handles of this rank's requests."""
        allreduces: list[tuple[Response, Request | None]] = []
        for resp in responses:
            req = local.get(resp.name)
            if req is not None:
                self.timeline.end(resp.name, "negotiate")
            if resp.error is not None:
                if req is not None:
                    req.handle.set_error(MismatchError(resp.error))
                continue
            if self.rank not in resp.members:
                continue
            if resp.kind is Kind.ALLREDUCE:
                allreduces.append((resp, req))
            else:
                self._run_one(resp, req)
        if allreduces:
            self._run_allreduces(allreduces)

    def _run_one(self, resp: Response, req: Request | None) -> None:
        try:
            if resp.kind is Kind.ALLGATHER:
                result = self._allgather(resp, req)
            elif resp.kind is Kind.BROADCAST:
                result = self._broadcast(resp, req)
            elif resp.kind is Kind.ALLTOALL:
                result = self._alltoall(resp, req)
            elif resp.kind is Kind.REDUCESCATTER:
                result = self._reducescatter(resp, req)
            elif resp.kind is Kind.BARRIER:
                result = None
            elif resp.kind is Kind.JOIN:
                result = resp.last_joined
            elif resp.kind is Kind.ADD_PROCESS_SET:
                result = self._on_add(resp, req)
            elif resp.kind is Kind.REMOVE_PROCESS_SET:
                result = self._on_remove(resp, req)
            elif resp.kind is Kind.SET_TUNABLES:
                result = self._on_set_tunables(resp, req)
            else:  # pragma: no cover - every kind is handled above
                raise AssertionError(resp.kind)
        except Exception as exc:  # complete the handle; the engine keeps serving others
            if req is None:
                raise
            req.handle.set_error(exc)
            return
        if req is not None:
            req.handle.set_result(result)

    # --- all-reduce with fusion --------------------------------------------------------
    def _run_allreduces(self, items: list[tuple[Response, Request | None]]) -> None:
        def key(item: tuple[Response, Request | None]) -> tuple:
            sig = item[0].reference
            wire_op = "sum" if sig.op == "average" else sig.op
            return (sig.process_set_id, sig.dtype, wire_op, sig.compression,
                    tuple(sorted(item[0].joined)))

        # Compressed requests are grouped regardless of size: their payloads, not their
        # tensors, are what fills fusion buffers (thresholds scale with the compression).
        nbytes = [0 if r.reference.compression != "none" else
                  sum(math.prod(s) for s in r.reference.shapes)
                  * np.dtype(r.reference.dtype).itemsize for r, _ in items]
        groups = fusion.plan_fusion(nbytes, [key(i) for i in items], self.fusion_threshold)
        for group in groups:
            members = [items[i] for i in group]
            if members[0][0].reference.compression == "none":
                self._allreduce_group(members)
            elif members[0][1] is not None and members[0][1].compressor.summable:
                self._fused_compressed_allreduce(members)
            else:
                for item in members:
                    self._compressed_allreduce(*item)

    def _fused_compressed_allreduce(self, group: list[tuple[Response, Request | None]]) -> None:
        """Summable compressors: each round's payloads of every tensor travel fused."""
        sig = group[0][0].reference
        comm = self.process_sets[sig.process_set_id].data_comm(sig.device)
        average = sig.op == "average"
        tensors = []  # (request, index, name, compressor, payloads, ctx, dense)
        try:
            for resp, req in group:
                assert req is not None  # joined ranks are refused for compressed requests
                req.outputs = [np.empty_like(x) if o is None else o
                               for x, o in zip(req.arrays, req.outputs)]
                for i, x in enumerate(req.arrays):
                    name = resp.name if len(req.arrays) == 1 else f"{resp.name}.{i}"
                    src = x if sig.prescale == 1.0 else x * x.dtype.type(sig.prescale)
                    c = req.compressor
                    self.timeline.begin(resp.name, "compress")
                    if c.applies_to(src):
                        payloads, ctx = c.compress(src, name)
                        tensors.append([req, i, resp.name, c, payloads, ctx, False])
                    else:  # small or 1-D: sent dense in the first round
                        tensors.append([req, i, resp.name, c, [src], None, True])
                    self.timeline.end(resp.name, "compress")
            rounds = len(group[0][1].compressor.rounds)
            for r in range(rounds):
                active = [t for t in tensors if not t[6] or r == 0]
                reduced = self._sum_fused([p for t in active for p in t[4]], comm)
                pos = 0
                for t in active:
                    n = len(t[4])
                    t[4], pos = reduced[pos:pos + n], pos + n
                    if not t[6] and r < rounds - 1:
                        t[4], t[5] = t[3].resume(t[4], t[5])
            for req, i, rname, c, payloads, ctx, dense in tensors:
                self.timeline.begin(rname, "decompress")
                y = payloads[0] if dense else c.decompress(payloads, ctx)
                scale = sig.postscale / (comm.size if average else 1)
                np.multiply(y, scale, out=req.outputs[i], casting="unsafe")
                self.timeline.end(rname, "decompress")
        except Exception as exc:
            for _, req in group:
                if req is not None:
                    req.handle.set_error(exc)
            return
        for _, req in group:
            assert req is not None
            req.handle.set_result(req.outputs if req.grouped else req.outputs[0])

    def _sum_fused(self, arrays: list[Any], comm: Any) -> list[Any]:
        """Sum ``arrays`` over ranks in as few messages as the threshold allows (new arrays)."""
        out = [array_namespace(a).empty_like(a) for a in arrays]
        sizes = [a.nbytes for a in arrays]
        for idx in fusion.plan_fusion(sizes, [a.dtype.str for a in arrays],
                                      max(self.fusion_threshold, 1)):
            parts = [arrays[i] for i in idx]
            total = sum(a.size for a in parts)
            buf = self.buffers.get(parts[0].dtype, total, like=parts[0])
            offsets = fusion.pack(parts, buf)
            comm.allreduce(buf, buf, ReduceOp.SUM)
            fusion.unpack(buf, [out[i] for i in idx], offsets)
        return out

    def _compressed_allreduce(self, resp: Response, req: Request | None) -> None:
        """Drive the request's compressor round by round over the process set (unfused)."""
        from dlcomm.compression import compressed_allreduce

        assert req is not None  # joined ranks are refused for compressed requests
        sig = resp.reference
        try:
            exchange = self.process_sets[sig.process_set_id].exchange_comm()
            results = []
            req.outputs = [np.empty_like(x) if o is None else o
                           for x, o in zip(req.arrays, req.outputs)]
            for i, (x, out) in enumerate(zip(req.arrays, req.outputs)):
                name = resp.name if len(req.arrays) == 1 else f"{resp.name}.{i}"
                src = x if sig.prescale == 1.0 else x * x.dtype.type(sig.prescale)
                self.timeline.begin(resp.name, "communicate", {"compression": sig.compression})
                y = compressed_allreduce(req.compressor, src, name, exchange,
                                         average=sig.op == "average")
                self.timeline.end(resp.name, "communicate")
                np.multiply(y, sig.postscale, out=out, casting="unsafe")
                results.append(out)
        except Exception as exc:
            req.handle.set_error(exc)
            return
        req.handle.set_result(results if req.grouped else results[0])

    def _allreduce_group(self, group: list[tuple[Response, Request | None]]) -> None:
        first = group[0][0]
        sig = first.reference
        comm = self.process_sets[sig.process_set_id].data_comm(sig.device)
        op = ReduceOp(sig.op)
        wire_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
        dtype = np.dtype(sig.dtype)
        # Inputs and outputs of every tensor in the group (a grouped request has several).
        inputs: list[np.ndarray] = []
        outputs: list[np.ndarray] = []
        pre: list[float] = []
        post: list[float] = []
        owners: list[tuple[Request | None, int]] = []  # (request, number of its tensors)
        for resp, req in group:
            rsig = resp.reference
            divisor = resp.contributors if op is ReduceOp.AVERAGE else 1
            if req is None:  # this rank joined: it contributes zeros and keeps nothing
                arrays = [np.zeros(s, dtype=dtype) for s in rsig.shapes]
                outs = [None] * len(arrays)
            else:
                arrays, outs = req.arrays, req.outputs
            inputs += arrays
            outputs += outs
            pre += [rsig.prescale] * len(arrays)
            post += [rsig.postscale / divisor] * len(arrays)
            owners.append((req, len(arrays)))
        names = [resp.name for resp, _ in group]
        try:
            if len(inputs) == 1:
                if outputs[0] is None:
                    outputs[0] = array_namespace(inputs[0]).empty_like(inputs[0])
                self._allreduce_single(comm, inputs[0], outputs[0], pre[0], post[0], wire_op,
                                       names[0])
            elif all(o is None for o in outputs):
                outputs = self._fused_into_new(comm, inputs, pre, post, wire_op, names, dtype)
            else:
                outputs = [array_namespace(x).empty_like(x) if o is None else o
                           for x, o in zip(inputs, outputs)]
                total = sum(a.size for a in inputs)
                timed = names if self.timeline.enabled else ()
                for n in timed:
                    self.timeline.begin(n, "fuse", {"tensors": len(inputs), "bytes":
                                                    total * dtype.itemsize})
                buf = self.buffers.get(dtype, total, like=inputs[0])
                offsets = fusion.pack(inputs, buf, pre)
                for n in timed:
                    self.timeline.end(n, "fuse")
                    self.timeline.begin(n, "communicate")
                comm.allreduce(buf, buf, wire_op)
                for n in timed:
                    self.timeline.end(n, "communicate")
                    self.timeline.begin(n, "unpack")
                fusion.unpack(buf, outputs, offsets, post)
                for n in timed:
                    self.timeline.end(n, "unpack")
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

    def _fused_into_new(self, comm: Any, inputs: list[Any], pre: list[float],
                        post: list[float], op: ReduceOp, names: list[str],
                        dtype: np.dtype) -> list[Any]:
        """No caller-given outputs: reduce the packed buffer into a fresh one and return
        views of it, which saves the unpack copy."""
        xp = array_namespace(inputs[0])
        total = sum(a.size for a in inputs)
        timed = names if self.timeline.enabled else ()
        for n in timed:
            self.timeline.begin(n, "fuse", {"tensors": len(inputs),
                                            "bytes": total * dtype.itemsize})
        buf = self.buffers.get(dtype, total, like=inputs[0])
        offsets = fusion.pack(inputs, buf, pre)
        result = xp.empty(total, dtype=dtype)
        for n in timed:
            self.timeline.end(n, "fuse")
            self.timeline.begin(n, "communicate")
        comm.allreduce(buf, result, op)
        for n in timed:
            self.timeline.end(n, "communicate")
        if len(set(post)) == 1:
            if post[0] != 1.0:
                xp.multiply(result, post[0], out=result, casting="unsafe")
            post = [1.0] * len(post)
        outputs = []
        for x, start, scale in zip(inputs, offsets, post):
            view = result[start:start + x.size].reshape(x.shape)
            if scale != 1.0:
                xp.multiply(view, scale, out=view, casting="unsafe")
            outputs.append(view)
        return outputs

    def _allreduce_single(self, comm: Any, x: np.ndarray, out: np.ndarray, pre: float,
                          post: float, op: ReduceOp, name: str) -> None:
        """One tensor: reduce straight into its output (no fusion copy)."""
        self.timeline.begin(name, "communicate", {"bytes": x.nbytes})
        flat_out = out.reshape(-1)
        if pre != 1.0:
            np.multiply(x.reshape(-1), pre, out=flat_out, casting="unsafe")
            comm.allreduce(flat_out, flat_out, op)
        elif out is x:
            comm.allreduce(flat_out, flat_out, op)
        else:
            comm.allreduce(x.reshape(-1), flat_out, op)
        if post != 1.0:
            np.multiply(flat_out, post, out=flat_out, casting="unsafe")
        self.timeline.end(name, "communicate")

    # --- other collectives --------------------------------------------------------------
    def _members_comm(self, resp: Response) -> tuple[Any, ProcessSetState]:
        ps = self.process_sets[resp.process_set_id]
        return ps.data_comm(resp.reference.device), ps

    def _allgather(self, resp: Response, req: Request | None) -> np.ndarray:
        comm, ps = self._members_comm(resp)
        assert req is not None
        x = req.arrays[0]
        rest = x.shape[1:]
        row = math.prod(rest)
        rows = [resp.signatures[r].shapes[0][0] for r in ps.ranks]
        out = array_namespace(x).empty((sum(rows), *rest), dtype=x.dtype)
        self.timeline.begin(resp.name, "communicate", {"bytes": x.nbytes})
        comm.allgatherv(x.reshape(-1), out.reshape(-1),
                        [n * row for n in rows])
        self.timeline.end(resp.name, "communicate")
        return out

    def _broadcast(self, resp: Response, req: Request | None) -> np.ndarray:
        comm, ps = self._members_comm(resp)
        assert req is not None
        out = req.outputs[0]
        root = resp.reference.root  # rank within the process set, as in Horovod
        self.timeline.begin(resp.name, "communicate", {"bytes": out.nbytes})
        comm.bcast(out.reshape(-1), root)
        self.timeline.end(resp.name, "communicate")
        return out

    def _alltoall(self, resp: Response, req: Request | None) -> tuple[np.ndarray, list[int]]:
        comm, ps = self._members_comm(resp)
        assert req is not None
        x = req.arrays[0]
        rest = x.shape[1:]
        row = math.prod(rest)
        me = ps.set_rank(self.rank)
        send_rows = list(resp.signatures[self.rank].splits or ())
        recv_rows = [resp.signatures[r].splits[me] for r in ps.ranks]
        out = array_namespace(x).empty((sum(recv_rows), *rest), dtype=x.dtype)
        self.timeline.begin(resp.name, "communicate", {"bytes": x.nbytes})
        comm.alltoallv(x.reshape(-1), [n * row for n in send_rows],
                       out.reshape(-1), [n * row for n in recv_rows])
        self.timeline.end(resp.name, "communicate")
        return out, recv_rows

    def _reducescatter(self, resp: Response, req: Request | None) -> np.ndarray:
        comm, ps = self._members_comm(resp)
        assert req is not None
        sig = resp.reference
        x = req.arrays[0]
        rows = reducescatter_rows(x.shape[0], len(ps.ranks))
        rest = x.shape[1:]
        row = math.prod(rest)
        me = ps.set_rank(self.rank)
        op = ReduceOp(sig.op)
        src = x.reshape(-1)
        if sig.prescale != 1.0:
            src = src * x.dtype.type(sig.prescale)
        out = array_namespace(x).empty((rows[me], *rest), dtype=x.dtype)
        self.timeline.begin(resp.name, "communicate", {"bytes": x.nbytes})
        comm.reduce_scatter(src, out.reshape(-1), [n * row for n in rows],
                            ReduceOp.SUM if op is ReduceOp.AVERAGE else op)
        self.timeline.end(resp.name, "communicate")
        post = sig.postscale / (len(ps.ranks) if op is ReduceOp.AVERAGE else 1)
        if post != 1.0:
            np.multiply(out, post, out=out, casting="unsafe")
        return out


def reducescatter_rows(rows: int, parts: int) -> list[int]:
    """Horovod's split of the first dimension: the first ``rows % parts`` ranks get one more."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
