"""Start the all-reduce of gradients through the user's compression and hand back the step
that completes it: shared by the wait-free optimizer and the other schedules."""
from __future__ import annotations

from typing import Any

import torch

from dlcomm.mpi_ops import Handle
from dlcomm.torch import mpi_ops


def momentum_after_allreduce(optimizer: torch.optim.Optimizer) -> float:
    """The momentum ``optimizer`` applies to the averaged gradients, for error feedback's
    momentum correction (docs/compression.md): SGD's ``momentum`` when every parameter group
    uses the same one without dampening or Nesterov; 0 otherwise (other optimizers, Nesterov,
    dampening, groups that differ), where compressors keep plain error feedback."""
    if not isinstance(optimizer, torch.optim.SGD):
        return 0.0
    settings = {(float(g.get("momentum", 0.0)), float(g.get("dampening", 0.0)),
                 bool(g.get("nesterov", False))) for g in optimizer.param_groups}
    if len(settings) != 1:
        return 0.0
    momentum, dampening, nesterov = settings.pop()
    return momentum if 0.0 < momentum < 1.0 and dampening == 0.0 and not nesterov else 0.0


def start_gradient_allreduce(grads: list[torch.Tensor], name: str, *, compression: Any,
                             core_compressor: Any, op: Any, prescale_factor: float,
                             postscale_factor: float, process_set: Any,
                             momentum: float = 0.0) -> Handle:
    """Compress ``grads`` (a cast such as fp16 happens here; a core compressor inside the
    engine), start one all-reduce request (grouped when there are several) and return its
    handle; waiting for it writes cast results back into the gradients in place.
    ``momentum`` (``momentum_after_allreduce`` of the optimizer) goes to the core compressor
    before it compresses: error feedback then corrects for the optimizer's momentum."""
    if core_compressor is not None:
        core_compressor.set_momentum(momentum)
    packed, ctxs = zip(*(compression.compress(g) for g in grads))
    kwargs = dict(name=name, op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set,
                  compression=core_compressor)
    if len(grads) == 1:
        handle = mpi_ops.allreduce_async_(packed[0], **kwargs)
    else:
        handle = mpi_ops.grouped_allreduce_async_(list(packed), **kwargs)

    def write_back(_: Any) -> None:
        for g, c, ctx in zip(grads, packed, ctxs):
            if c is not g:  # a cast (fp16): bring the result back into the gradient
                g.copy_(compression.decompress(c, ctx))

    return handle.then(write_back)
