"""``start_iter=N``: each tensor's first N exchanges go dense, then the compressor takes over.

DDP's PowerSGD hook all-reduces plainly for its first ``start_powerSGD_iter`` iterations (at
least 2 with error feedback or warm start), and the PowerSGD paper's authors recommend such
a warm-up: the first steps of training move the parameters most, where a low-rank or sparse
estimate loses most. During the warm-up the wrapped compressor (and its error feedback) is
not called at all, so it starts from an empty state when compression begins.
"""
from __future__ import annotations

from dlcomm.compression.base import Compressor, CompressorWrapper, with_param


def check_start_iter(start_iter: object) -> int:
    """``start_iter`` as an int; ValueError unless it is an int >= 0."""
    if isinstance(start_iter, bool) or not isinstance(start_iter, int) or start_iter < 0:
        raise ValueError(f"start_iter must be an int >= 0 (exchanges sent dense before "
                         f"compression starts), got {start_iter!r}")
    return start_iter


class DenseStart(CompressorWrapper):
    """Sends each tensor's first ``start_iter`` exchanges dense (counted per tensor name,
    kept in ``states`` and so in checkpoints), then compresses through ``inner``."""

    def __init__(self, inner: Compressor, start_iter: int) -> None:
        super().__init__(inner)
        self.start_iter = check_start_iter(start_iter)

    def compresses(self, tensor: object, name: str) -> bool:
        if not self.inner.compresses(tensor, name):
            return False
        sent = self.states.get(name, 0)
        if sent < self.start_iter:
            self.states[name] = sent + 1
            return False
        return True

    def for_tensor(self, tensor: object, name: str, comm: object) -> Compressor:
        """Once ``compresses`` has counted this exchange, the rest is the inner compressor's
        (a choice among compressors chooses here)."""
        chosen = self.inner.for_tensor(tensor, name, comm)
        return self if chosen is self.inner else chosen

    def describe(self) -> str:
        return with_param(self.inner.describe(), "start_iter", self.start_iter)
