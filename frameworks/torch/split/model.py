"""``SplitModel``: one ``torch.nn.Module`` run as an edge part and a cloud part.

Every rank builds it with the same arguments. On an edge rank it behaves like the model: call
it on a batch and back-propagate. With the labels on the cloud (default) the call takes
``labels=`` and returns the loss; with the labels on the edge it returns the model's output,
and the edge's own loss is back-propagated through the link. The cloud rank calls ``serve``,
which answers the edges until they close, stepping the cloud part's optimizer once per
training step of all edges, with the cloud part's gradient averaged over the edges (each edge's
batch weighs the same, as in data-parallel training). The edge parts are copies of one part:
their gradients are averaged over the edges through dlcomm's engine, by wrapping the edges'
optimizer in ``dlcomm.torch.DistributedOptimizer(..., process_set=split.edge_process_set)``.

A batch is cut into ``split_micro_batches`` pieces: the edge sends piece i as soon as its part
has computed it (a sender thread moves it) and computes piece i + 1 meanwhile, while the
cloud works on piece i; the loss and gradients equal those of the whole batch.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dlcomm import basics
from dlcomm.config import knob_value
from dlcomm.functions import allgather_object
from dlcomm.split import (
    Encoded,
    Flag,
    Kind,
    Message,
    NoneCodec,
    SampleMemory,
    SideCodec,
    Slot,
    SplitLink,
    check_agreement,
    get_codec,
    make_roles,
)
from dlcomm.torch.split.cut import ACTIVATION, LINK_POLICIES, SIDE, Cut, cut_module, parts_cut

LABEL_PLACES = ("cloud", "edge")
_ACTIVATION_TAGS = (Slot.ACTIVATION, Slot.LINK)


def to_array(t: torch.Tensor) -> np.ndarray:
    """A host numpy array of ``t``'s values (bfloat16 widened to float32)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().contiguous().numpy()


def micro_batches(batch: int, count: int) -> list[tuple[int, int]]:
    """``count`` near-equal [start, end) pieces of a batch (fewer if the batch is smaller)."""
    n = max(1, min(count, batch))
    bounds = [batch * i // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:])]


class SplitModel(torch.nn.Module):
    """``model`` cut after sub-module ``split_point`` (or the two ``parts``), run across an
    edge/cloud link; see the module docstring and docs/split.md for every argument."""

    def __init__(self, model: torch.nn.Module | None = None, split_point: str | None = None,
                 *, parts: tuple[torch.nn.Module, torch.nn.Module] | None = None,
                 loss_fn: Any = None, leaf_modules: Sequence[str | type] = (),
                 side_outputs: Sequence[int] | None = None,
                 split_activation_codec: str | None = None,
                 split_gradient_codec: str | None = None,
                 split_micro_batches: int | None = None, split_labels: str | None = None,
                 split_links: str | None = None, split_cloud_rank: int | None = None) -> None:
        super().__init__()
        state = basics.state()  # ShutdownError: call dlcomm.torch.init() first
        settings = {
            "activation_codec": knob_value("split_activation_codec", split_activation_codec),
            "gradient_codec": knob_value("split_gradient_codec", split_gradient_codec),
            "micro_batches": knob_value("split_micro_batches", split_micro_batches),
            "labels": knob_value("split_labels", split_labels),
            "links": knob_value("split_links", split_links),
            "cloud_rank": knob_value("split_cloud_rank", split_cloud_rank),
            "loss_fn": type(loss_fn).__name__ if loss_fn is not None else None,
        }
        cut, problem = None, None
        try:
            self._check_settings(settings, model, split_point, parts, loss_fn)
            cut = (parts_cut(*parts, side_outputs=side_outputs) if parts is not None else
                   cut_module(model, split_point, settings["links"], leaf_modules))
            settings["cut"] = cut.describe()
        except (TypeError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            settings["cut"] = "failed"
        # one gather: ranks with other settings, or a rank whose arguments were refused,
        # make every rank fail with the same message instead of leaving the others waiting
        every = allgather_object({"settings": settings, "problem": problem},
                                 name="split.settings")
        failed = [(r, e["problem"]) for r, e in enumerate(every) if e["problem"]]
        if failed:
            raise ValueError("SplitModel could not be built: " + "; ".join(
                f"rank {r}: {p}" for r, p in failed))
        check_agreement([e["settings"] for e in every], "SplitModel")
        assert cut is not None
        self.cut: Cut = cut
        self.settings = settings
        self.labels_on = settings["labels"]
        self.micro_count = int(settings["micro_batches"])
        self.loss_fn = loss_fn
        self.roles = make_roles(state.size, state.rank, settings["cloud_rank"])
        self.link = SplitLink(state.comm, threaded=state.mpi_threads)
        self.edge_process_set = basics.add_process_set(list(self.roles.edges))
        self.part = cut.edge if self.roles.is_edge else cut.cloud
        self.step_count = 0
        self.activation_stats: dict[str, float] = {}
        self.gradient_stats: dict[str, float] = {}
        self._codecs: dict[tuple[str, int, int], Any] = {}
        self._kinds: tuple[str, ...] | None = cut.kinds
        self._needs_ids = any(isinstance(get_codec(settings[w]), SampleMemory)
                              for w in ("activation_codec", "gradient_codec"))
        self._awaiting_backward = False
        self._closed = False
        self._closed_edges: set[int] = set()  # the cloud: edges that sent CLOSE

    @staticmethod
    def _check_settings(settings: dict[str, Any], model: Any, split_point: Any, parts: Any,
                        loss_fn: Any) -> None:
        if (model is None) == (parts is None):
            raise ValueError("give model= and split_point=, or parts=(edge, cloud)")
        if model is not None and not isinstance(split_point, str):
            raise TypeError(f"split_point must name a sub-module (str), got {split_point!r}")
        if parts is not None and (not isinstance(parts, (tuple, list)) or len(parts) != 2):
            raise ValueError("parts must be a pair (edge part, cloud part)")
        if parts is not None and settings["links"] != "keep":
            raise ValueError("split_links applies to a model cut at split_point; with given "
                             "parts, the edge part returns exactly what should cross")
        if settings["labels"] not in LABEL_PLACES:
            raise ValueError(f"split_labels must be one of {list(LABEL_PLACES)}, got "
                             f"{settings['labels']!r}")
        if settings["links"] not in LINK_POLICIES:
            raise ValueError(f"split_links must be one of {list(LINK_POLICIES)}, got "
                             f"{settings['links']!r}")
        if settings["labels"] == "cloud" and not callable(loss_fn):
            raise ValueError("split_labels='cloud' needs loss_fn=, the loss the cloud computes "
                             "from the output and the labels (e.g. torch.nn.CrossEntropyLoss())")
        for what in ("activation_codec", "gradient_codec"):
            get_codec(settings[what])  # ValueError for a bad spec

    # --- shared helpers ------------------------------------------------------------------
    @property
    def is_edge(self) -> bool:
        return self.roles.is_edge

    @property
    def is_cloud(self) -> bool:
        return self.roles.is_cloud

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent across the split, counted at the transport."""
        return self.link.bytes_sent

    def _codec(self, which: str, peer: int, index: int) -> Any:
        """The codec (with its memory) of activation ``index`` for ``which`` direction."""
        key = (which, peer, index)
        if key not in self._codecs:
            self._codecs[key] = get_codec(self.settings[f"{which}_codec"])
        return self._codecs[key]

    @staticmethod
    def _encode(codec: Any, array: np.ndarray, ids: np.ndarray | None) -> Encoded:
        return codec.encode(array, ids) if isinstance(codec, SampleMemory) else \
            codec.encode(array)

    @staticmethod
    def _decode(codec: Any, encoded: Encoded, ids: np.ndarray | None) -> np.ndarray:
        return codec.decode(encoded, ids) if isinstance(codec, SampleMemory) else \
            codec.decode(encoded)

    def _device(self) -> torch.device:
        for p in self.part.parameters():
            return p.device
        return torch.device("cpu")

    # --- the edge ------------------------------------------------------------------------
    def forward(self, *inputs: torch.Tensor, labels: torch.Tensor | None = None,
                sample_ids: Any = None) -> torch.Tensor:
        """Edge ranks: run the model on a batch (see the class docstring)."""
        if self.roles.is_cloud:
            raise RuntimeError("the cloud rank answers the edges with serve(); only edge "
                               "ranks call the split model")
        if self._closed:
            raise RuntimeError("this SplitModel was closed")
        if self._awaiting_backward:
            raise RuntimeError("the previous output was not back-propagated: with "
                               "split_labels='edge' and gradients enabled, call backward() on "
                               "a loss of the output (or run under torch.no_grad())")
        batch = self._check_inputs(inputs)
        if labels is not None and self.labels_on != "cloud":
            raise ValueError("split_labels='edge': the labels stay here; compute the loss "
                             "from the returned output")
        if labels is not None and (not isinstance(labels, torch.Tensor) or
                                   labels.shape[:1] != (batch,)):
            raise ValueError(f"labels must be a tensor with {batch} rows, one per sample")
        ids = None
        if self._needs_ids or sample_ids is not None:
            if sample_ids is None:
                raise ValueError("a codec with memory=delta/feedback keeps per-sample state: "
                                 "pass sample_ids= (one integer per sample)")
            ids = np.asarray(sample_ids.cpu() if isinstance(sample_ids, torch.Tensor)
                             else sample_ids).astype(np.int64)
            if ids.shape != (batch,):
                raise ValueError(f"sample_ids must hold {batch} integers, got shape {ids.shape}")
        grad = torch.is_grad_enabled()
        train = grad and (labels is not None or self.labels_on == "edge")
        pieces = micro_batches(batch, self.micro_count)
        sent: list[list[torch.Tensor]] = []
        need_grad = False
        for i, (lo, hi) in enumerate(pieces):
            values = self.part(*(x[lo:hi] for x in inputs))
            values = list(values) if isinstance(values, (tuple, list)) else [values]
            kinds = self._crossing_kinds(values)
            acts = [v for v, k in zip(values, kinds) if k == ACTIVATION]
            need_grad = need_grad or (train and any(a.requires_grad for a in acts))
            flags = (Flag.TRAIN if train else 0) | (Flag.MODULE_TRAINING if self.training
                                                    else 0) | (Flag.NEED_GRAD if need_grad else 0)
            piece_ids = None if ids is None else ids[lo:hi]
            slots = self._activation_slots(values, kinds, piece_ids)
            if labels is not None:
                slots.append((Slot.LABELS, SideCodec().encode(to_array(labels[lo:hi]))))
            slots.append((Slot.WEIGHT, NoneCodec().encode(
                np.array([(hi - lo) / batch], dtype=np.float64))))
            self.link.send(self.roles.cloud, Message(Kind.ACTIVATION, self.step_count, i,
                                                     len(pieces), int(flags), slots))
            sent.append(acts)
        flat = [a for acts in sent for a in acts]
        if train:
            self.step_count += 1
        if labels is not None:
            return _RemoteLoss.apply(self, pieces, need_grad, ids, *flat)
        return _RemoteOutput.apply(self, pieces, train, need_grad, ids, *flat)

    def _check_inputs(self, inputs: Sequence[Any]) -> int:
        if not inputs or not all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in inputs):
            raise TypeError("the split model takes tensors with a batch dimension first")
        batch = inputs[0].shape[0]
        if batch < 1 or any(x.shape[0] != batch for x in inputs):
            raise ValueError(f"every input needs the same batch size >= 1, got "
                             f"{[tuple(x.shape) for x in inputs]}")
        return int(batch)

    def _crossing_kinds(self, values: list[torch.Tensor]) -> tuple[str, ...]:
        if self._kinds is None:  # given parts: by side_outputs, else floating = activation
            sides = self.cut.side_outputs
            self._kinds = tuple(
                SIDE if (i in sides if sides is not None else not v.is_floating_point())
                else ACTIVATION for i, v in enumerate(values))
            if ACTIVATION not in self._kinds:
                raise ValueError("the edge part returned no floating-point activation to send")
        if len(values) != len(self._kinds):
            raise ValueError(f"the edge part returned {len(values)} tensors, expected "
                             f"{len(self._kinds)}")
        return self._kinds

    def _activation_slots(self, values: list[torch.Tensor], kinds: Sequence[str],
                          ids: np.ndarray | None) -> list[tuple[int, Encoded]]:
        slots: list[tuple[int, Encoded]] = []
        if ids is not None:
            slots.append((Slot.SAMPLE_IDS, SideCodec().encode(ids)))
        index = 0
        for v, kind in zip(values, kinds):
            if kind == SIDE:
                slots.append((Slot.SIDE, SideCodec().encode(to_array(v))))
                continue
            codec = self._codec("activation", self.roles.cloud, index)
            slots.append((Slot.ACTIVATION if index == 0 else Slot.LINK,
                          self._encode(codec, to_array(v).astype(np.float32, copy=False), ids)))
            self.activation_stats = dict(codec.last_stats)
            index += 1
        return slots

    def _receive_gradients(self, message: Message, like: list[torch.Tensor],
                           ids: np.ndarray | None) -> list[torch.Tensor]:
        grads = []
        for index, (enc, a) in enumerate(zip(message.slot(Slot.GRADIENT), like)):
            codec = self._codec("gradient", self.roles.cloud, index)
            g = self._decode(codec, enc, ids)
            grads.append(torch.from_numpy(np.ascontiguousarray(g)).to(a.device, a.dtype))
        if len(grads) != len(like):
            raise RuntimeError(f"the cloud sent {len(grads)} gradients for {len(like)} "
                               "activations")
        return grads

    def close(self) -> None:
        """Edges: tell the cloud this edge is done. Every rank: finish the link (collective,
        after ``serve`` returned on the cloud)."""
        if self._closed:
            return
        if self.roles.is_edge:
            self.link.send(self.roles.cloud, Message(Kind.CLOSE, self.step_count))
        self._closed = True
        self.link.close()

    def __enter__(self) -> SplitModel:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()

    # --- the cloud -----------------------------------------------------------------------
    def serve(self, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
              max_steps: int | None = None) -> int:
        """Cloud rank: answer the edges until every edge closed, or until ``max_steps``
        training steps were taken (call ``serve`` again to go on); step ``optimizer`` (and
        ``scheduler``) once per training step of the edges. Returns the steps taken."""
        if not self.roles.is_cloud:
            raise RuntimeError("serve() runs on the cloud rank; edge ranks call the model")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        if max_steps is not None and (isinstance(max_steps, bool) or
                                      not isinstance(max_steps, int) or max_steps < 1):
            raise ValueError(f"max_steps must be None or an int >= 1, got {max_steps!r}")
        if self._closed:
            raise RuntimeError("this SplitModel was closed")
        open_edges = [e for e in self.roles.edges if e not in self._closed_edges]
        steps = 0
        while open_edges and (max_steps is None or steps < max_steps):
            contributed = 0
            for edge in list(open_edges):
                while True:
                    first = self.link.recv(edge, (Kind.ACTIVATION, Kind.CLOSE))
                    if first.kind == Kind.CLOSE:
                        open_edges.remove(edge)
                        self._closed_edges.add(edge)
                        break
                    if self._serve_call(edge, first):
                        contributed += 1
                        break
            if contributed:
                if contributed > 1:
                    for p in self.part.parameters():
                        if p.grad is not None:
                            p.grad.div_(contributed)
                if optimizer is not None:
                    optimizer.step()
                    optimizer.zero_grad()
                if scheduler is not None:
                    scheduler.step()
                steps += 1
        self.link.flush()
        return steps

    def _serve_call(self, edge: int, first: Message) -> bool:
        """Answer one call of ``edge`` (all its micro-batches); True if it trained."""
        train = bool(first.flags & Flag.TRAIN)
        need_grad = bool(first.flags & Flag.NEED_GRAD)
        self.part.train(bool(first.flags & Flag.MODULE_TRAINING))
        pending = []
        for i in range(first.micro_count):
            msg = first if i == 0 else self.link.recv(edge, Kind.ACTIVATION, i)
            ids_slot = msg.slot(Slot.SAMPLE_IDS)
            ids = SideCodec().decode(ids_slot[0]) if ids_slot else None
            args, acts = self._cloud_inputs(edge, msg, ids, train and need_grad)
            with torch.set_grad_enabled(train):
                out = self.part(*args)
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"the cloud part must return one tensor, got {type(out).__name__}")
            labels = msg.slot(Slot.LABELS)
            if labels:
                weight = float(NoneCodec().decode(msg.slot(Slot.WEIGHT)[0])[0])
                target = torch.from_numpy(SideCodec().decode(labels[0])).to(out.device)
                loss = self.loss_fn(out, target) * weight
                slots = [(Slot.LOSS, NoneCodec().encode(
                    np.array([float(loss.detach())], dtype=np.float64)))]
                if train:
                    loss.backward()
                    if need_grad:
                        slots += self._gradient_slots(edge, acts, ids)
                self.link.send(edge, Message(Kind.GRADIENT, msg.step, i, msg.micro_count,
                                             msg.flags, slots))
            else:
                self.link.send(edge, Message(Kind.OUTPUT, msg.step, i, msg.micro_count,
                                             msg.flags, [(Slot.OUTPUT, NoneCodec().encode(
                                                 to_array(out)))]))
                if train:
                    pending.append((out, acts, ids, msg))
        for i, (out, acts, ids, msg) in enumerate(pending):
            reply = self.link.recv(edge, Kind.OUTPUT_GRADIENT, i)
            grad_out = torch.from_numpy(NoneCodec().decode(reply.slot(Slot.OUTPUT)[0]))
            out.backward(grad_out.to(out.device, out.dtype))
            if need_grad:
                self.link.send(edge, Message(Kind.GRADIENT, msg.step, i, msg.micro_count,
                                             msg.flags, self._gradient_slots(edge, acts, ids)))
        return train

    def _cloud_inputs(self, edge: int, msg: Message, ids: np.ndarray | None,
                      requires_grad: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        device = self._device()
        args, acts = [], []
        index = 0
        for tag, enc in msg.slots:
            if tag in _ACTIVATION_TAGS:
                codec = self._codec("activation", edge, index)
                t = torch.from_numpy(np.ascontiguousarray(self._decode(codec, enc, ids)))
                t = t.to(device).requires_grad_(requires_grad)
                acts.append(t)
                args.append(t)
                index += 1
            elif tag == Slot.SIDE:
                args.append(torch.from_numpy(SideCodec().decode(enc)).to(device))
        return args, acts

    def _gradient_slots(self, edge: int, acts: list[torch.Tensor], ids: np.ndarray | None
                        ) -> list[tuple[int, Encoded]]:
        slots = []
        for index, a in enumerate(acts):
            g = a.grad if a.grad is not None else torch.zeros_like(a)
            codec = self._codec("gradient", edge, index)
            slots.append((Slot.GRADIENT, self._encode(codec, to_array(g), ids)))
            self.gradient_stats = dict(codec.last_stats)
        return slots


def _piece_ids(ids: np.ndarray | None, piece: tuple[int, int]) -> np.ndarray | None:
    return None if ids is None else ids[piece[0]:piece[1]]


class _RemoteLoss(torch.autograd.Function):
    """The cloud's loss of the sent micro-batches; its backward hands each activation the
    gradient the cloud already sent back."""

    @staticmethod
    def forward(ctx: Any, split: SplitModel, pieces: list[tuple[int, int]], need_grad: bool,
                ids: Any, *acts: torch.Tensor) -> torch.Tensor:
        per_piece = len(acts) // len(pieces)
        total, grads = 0.0, []
        for i, piece in enumerate(pieces):
            msg = split.link.recv(split.roles.cloud, Kind.GRADIENT, i)
            total += float(NoneCodec().decode(msg.slot(Slot.LOSS)[0])[0])
            if need_grad:
                grads += split._receive_gradients(
                    msg, list(acts[i * per_piece:(i + 1) * per_piece]), _piece_ids(ids, piece))
        ctx.grads, ctx.count = grads, len(acts)
        return torch.tensor(total, dtype=torch.float32)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        if not ctx.grads:
            return (None,) * (4 + ctx.count)
        return (None, None, None, None, *(g * grad_output for g in ctx.grads))


class _RemoteOutput(torch.autograd.Function):
    """The cloud part's output of the sent micro-batches; its backward sends the output's
    gradient to the cloud and hands each activation the gradient that comes back."""

    @staticmethod
    def forward(ctx: Any, split: SplitModel, pieces: list[tuple[int, int]], train: bool,
                need_grad: bool, ids: Any, *acts: torch.Tensor) -> torch.Tensor:
        outs = []
        for i in range(len(pieces)):
            msg = split.link.recv(split.roles.cloud, Kind.OUTPUT, i)
            outs.append(torch.from_numpy(NoneCodec().decode(msg.slot(Slot.OUTPUT)[0])))
        out = torch.cat(outs).to(acts[0].device)
        ctx.split, ctx.pieces, ctx.need_grad, ctx.ids = split, pieces, need_grad, ids
        ctx.acts = acts
        split._awaiting_backward = train
        if not train:
            ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        split, pieces = ctx.split, ctx.pieces
        split._awaiting_backward = False
        for i, (lo, hi) in enumerate(pieces):
            split.link.send(split.roles.cloud, Message(
                Kind.OUTPUT_GRADIENT, split.step_count, i, len(pieces), 0,
                [(Slot.OUTPUT, NoneCodec().encode(to_array(grad_output[lo:hi])))]))
        if not ctx.need_grad:
            return (None,) * (5 + len(ctx.acts))
        per_piece = len(ctx.acts) // len(pieces)
        grads = []
        for i, piece in enumerate(pieces):
            msg = split.link.recv(split.roles.cloud, Kind.GRADIENT, i)
            grads += split._receive_gradients(
                msg, list(ctx.acts[i * per_piece:(i + 1) * per_piece]),
                _piece_ids(ctx.ids, piece))
        return (None, None, None, None, None, *grads)
