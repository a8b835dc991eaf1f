"""The event arithmetic of a BSP iteration: a compute stream (forward, backward, update) and
one communication channel (dlcomm's engine thread runs one collective at a time), with the
four schedules dlcomm's torch adapter offers.

* ``none``: after backward, every gradient in fused messages (up to the fusion threshold).
* ``wfbp``: whenever the channel is free, everything that is ready goes out fused (the
  engine's batching); the update waits for the last message.
* ``mgwfbp``: groups planned by MG-WFBP's merge rule from the ready times and the dense
  all-reduce's ``alpha + beta * bytes`` (what dlcomm measures at start-up).
* ``dear``: buckets (4 MiB) reduce-scattered as backward completes them; after the step the
  all-gathers go out in forward order and the next forward waits for each layer's bucket
  (and applies its update) just before the layer runs.

Plain arithmetic suffices (each stream runs its work in a fixed order): no event queue, no
randomness, so equal inputs give equal outputs. Iterations run back to back; the first
``warmup`` ones are discarded (DeAR's first forward has no all-gathers to wait for) and the
iteration time is the mean over the next ``measured`` ones (even by default, so ACP-SGD's
alternating P and Q count equally).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dlcomm.tools.simulate.messages import MessageCost, MessageModel
from dlcomm.tools.simulate.methods import Method
from dlcomm.tools.simulate.workload import Workload


@dataclasses.dataclass(frozen=True)
class IterationResult:
    """Steady-state figures per iteration of one worker (every worker alike under BSP)."""

    iteration_s: float
    compute_s: float
    comm_busy_s: float
    link_bytes: float
    payload_bytes: float
    iterations: tuple[float, ...]

    @property
    def exposed_comm_s(self) -> float:
        """Time per iteration not covered by computation."""
        return max(self.iteration_s - self.compute_s, 0.0)


def fusion_groups(order: Sequence[int], sizes: Sequence[float], threshold: float
                  ) -> list[list[int]]:
    """Consecutive items of ``order`` packed up to ``threshold`` bytes (a larger item alone),
    as the engine's fusion packs ready gradients."""
    groups: list[list[int]] = []
    current: list[int] = []
    total = 0.0
    for i in order:
        if current and total + sizes[i] > threshold:
            groups.append(current)
            current, total = [], 0.0
        current.append(i)
        total += sizes[i]
    if current:
        groups.append(current)
    return groups


def mgwfbp_groups(ready: Sequence[float], sizes: Sequence[float], alpha: float, beta: float
                  ) -> list[list[int]]:
    """MG-WFBP's merge rule on gradients in backward order (``ready`` non-decreasing):
    gradient j joins the open message when sending them together ends no later than
    sending the open message first and j after it (the rule of
    ``dlcomm.torch.schedules.mgwfbp.plan_merged_groups``; a test checks they agree).
    Returns lists of positions into ``ready``."""
    if len(ready) != len(sizes):
        raise ValueError("ready and sizes must have equal lengths")
    if any(b < a for a, b in zip(ready, ready[1:])):
        raise ValueError("ready times must be non-decreasing (backward order)")
    if not ready:
        return []

    def cost(nbytes: float) -> float:
        return alpha + beta * nbytes

    groups: list[list[int]] = []
    link_free = 0.0
    current, current_bytes, current_ready = [0], float(sizes[0]), float(ready[0])
    for j in range(1, len(sizes)):
        end_current = max(link_free, current_ready) + cost(current_bytes)
        separate = max(end_current, ready[j]) + cost(sizes[j])
        merged = max(link_free, ready[j]) + cost(current_bytes + sizes[j])
        if merged <= separate:
            current.append(j)
            current_bytes += sizes[j]
            current_ready = float(ready[j])
        else:
            groups.append(current)
            link_free = end_current
            current, current_bytes, current_ready = [j], float(sizes[j]), float(ready[j])
    groups.append(current)
    return groups


class _Channel:
    """The engine thread: one message at a time, in submission order."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.busy = 0.0
        self.link = 0.0
        self.payload = 0.0
        self.compute = 0.0

    def send(self, ready_at: float, message: MessageCost) -> float:
        start = max(self.free_at, ready_at)
        self.free_at = start + message.seconds
        self.busy += message.seconds
        self.link += message.link_bytes
        self.payload += message.payload_bytes
        self.compute += message.compute_s
        return self.free_at

    def take(self) -> tuple[float, float, float]:
        out = (self.busy, self.link, self.payload)
        self.busy = self.link = self.payload = self.compute = 0.0
        return out


def simulate_bsp(workload: Workload, method: Method, messages: MessageModel, *,
                 warmup: int = 1, measured: int = 2) -> IterationResult:
    """Run ``warmup + measured`` iterations of ``workload`` under ``method``'s schedule.

    With ``messages.compression_on_device`` compression shares the processor with training
    (a GPU's kernels, or an engine thread without a core of its own), so each iteration's
    compression time also delays the update; otherwise it only occupies the channel.
    """
    compression_on_device = messages.compression_on_device
    if warmup < 0 or measured < 1:
        raise ValueError(f"need warmup >= 0 and measured >= 1, got {warmup}, {measured}")
    tensors = workload.tensors
    layers = workload.layers
    layer_tensors: list[list[int]] = []
    for layer in layers:
        start = sum(len(x) for x in layer_tensors)
        layer_tensors.append(list(range(start, start + len(layer.tensors))))
    sizes = [float(t.nbytes) for t in tensors]
    backward_order = [i for li in reversed(range(len(layers)))
                      for i in reversed(layer_tensors[li])]
    schedule = method.schedule
    threshold = float(max(method.fusion_threshold, 1))

    mg_groups: list[list[int]] = []
    if schedule == "mgwfbp":
        offsets, clock = [0.0] * len(tensors), 0.0
        for li in reversed(range(len(layers))):
            clock += layers[li].backward_s
            for i in layer_tensors[li]:
                offsets[i] = clock
        a, b = messages.alpha_beta()
        plan = mgwfbp_groups([offsets[i] for i in backward_order],
                             [sizes[i] for i in backward_order], a, b)
        mg_groups = [[backward_order[p] for p in g] for g in plan]

    buckets: list[list[int]] = []
    layer_buckets: list[list[int]] = [[] for _ in layers]
    update_share: list[float] = []
    if schedule == "dear":
        buckets = fusion_groups(backward_order, sizes, float(max(method.dear_bucket_size, 1)))
        bucket_of = {i: b for b, group in enumerate(buckets) for i in group}
        for li, idx in enumerate(layer_tensors):
            layer_buckets[li] = sorted({bucket_of[i] for i in idx}, reverse=True)
        total = sum(sizes) or 1.0
        update_share = [workload.update_s * sum(sizes[i] for i in g) / total for g in buckets]

    channel = _Channel()
    t = 0.0
    starts: list[float] = []
    per_iteration: list[tuple[float, float, float]] = []
    ag_end: dict[int, float] = {}
    for it in range(warmup + measured + 1):
        starts.append(t)
        if it == warmup + measured:
            break
        applied: set[int] = set()
        for li, layer in enumerate(layers):  # forward
            for b in layer_buckets[li]:
                if b in ag_end and b not in applied:  # DeAR: this bucket's update first
                    t = max(t, ag_end[b]) + update_share[b]
                    applied.add(b)
            t += layer.forward_s
        ready = [0.0] * len(tensors)
        for li in reversed(range(len(layers))):  # backward
            t += layers[li].backward_s
            for i in layer_tensors[li]:
                ready[i] = t
        backward_end = t

        def group_cost(group: list[int], step: int = it) -> MessageCost:
            return messages.group([tensors[i] for i in group], step)

        def finish(backward_end: float = backward_end) -> float:
            busy_computing = backward_end + (channel.compute if compression_on_device else 0.0)
            return max(busy_computing, channel.free_at) + workload.update_s

        if schedule == "none":
            for g in fusion_groups(backward_order, sizes, threshold):
                channel.send(backward_end, group_cost(g))
            t = finish()
        elif schedule == "wfbp":
            pos = 0
            while pos < len(backward_order):
                first = backward_order[pos]
                start = max(channel.free_at, ready[first])
                group, total = [first], sizes[first]
                pos += 1
                while pos < len(backward_order):
                    nxt = backward_order[pos]
                    if ready[nxt] > start or total + sizes[nxt] > threshold:
                        break
                    group.append(nxt)
                    total += sizes[nxt]
                    pos += 1
                channel.send(start, group_cost(group))
            t = finish()
        elif schedule == "mgwfbp":
            for g in mg_groups:
                channel.send(max(ready[i] for i in g), group_cost(g))
            t = finish()
        else:  # dear
            for g in buckets:
                channel.send(max(ready[i] for i in g),
                             messages.reduce_scatter(sum(sizes[i] for i in g)))
            t = max(backward_end, channel.free_at)  # step() waits for the reduce-scatters
            for b in reversed(range(len(buckets))):  # all-gathers in forward order, queued
                # together by step()
                ag_end[b] = channel.send(t, messages.all_gather(
                    sum(sizes[i] for i in buckets[b])))
        per_iteration.append(channel.take())
    durations = [b - a for a, b in zip(starts, starts[1:])][warmup:]
    kept = per_iteration[warmup:]
    n = len(durations)
    return IterationResult(
        iteration_s=sum(durations) / n, compute_s=workload.compute_s,
        comm_busy_s=sum(k[0] for k in kept) / n, link_bytes=sum(k[1] for k in kept) / n,
        payload_bytes=sum(k[2] for k in kept) / n, iterations=tuple(durations))
