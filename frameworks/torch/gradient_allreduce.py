"""Start the all-reduce of gradients through the user's compression and hand back the step
that completes it: shared by the wait-free optimizer and the other schedules."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dlcomm.torch import mpi_ops


def start_gradient_allreduce(grads: list[torch.Tensor], name: str, *, compression: Any,
                             core_compressor: Any, op: Any, prescale_factor: float,
                             postscale_factor: float, process_set: Any) -> Callable[[], None]:
    """Compress ``grads`` (a cast such as fp16 happens here; a core compressor inside the
    engine), start one all-reduce request (grouped when there are several) and return
    ``finish()``, which waits and writes cast results back into the gradients in place."""
    packed, ctxs = zip(*(compression.compress(g) for g in grads))
    kwargs = dict(name=name, op=op, prescale_factor=prescale_factor,
                  postscale_factor=postscale_factor, process_set=process_set,
                  compression=core_compressor)
    if len(grads) == 1:
        handle = mpi_ops.allreduce_async_(packed[0], **kwargs)
    else:
        handle = mpi_ops.grouped_allreduce_async_(list(packed), **kwargs)

    def finish() -> None:
        handle.wait()
        for g, c, ctx in zip(grads, packed, ctxs):
            if c is not g:  # a cast (fp16): bring the result back into the gradient
                g.copy_(compression.decompress(c, ctx))

    return finish
