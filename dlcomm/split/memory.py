"""Per-sample memory around a codec, so that lossy split fine-tuning still converges.

An activation or its gradient belongs to the samples of a batch, and the next batch holds
other samples, so the usual error feedback (add this step's residual to the next step's
tensor) would add one sample's error to another's. Both corrections here are kept per sample
(``ids``: one integer per row of the batch's first axis) and applied the next time the same
sample comes by, an epoch later:

* ``delta`` (activations, as in AQ-SGD): sender and receiver both keep the last
  reconstruction ``m[s]`` of sample s. The sender encodes ``x - m[s]``, both add the decoded
  difference to ``m[s]``, and the receiver uses ``m[s]``. Once fine-tuning changes a sample's
  activation little between epochs, the difference is small and so is its compression error.
* ``feedback`` (gradients): the sender keeps what compression left out, ``e[s]``, and encodes
  ``g + e[s]`` next time; over the epochs what the edge receives for a sample adds up to what
  the cloud computed (its parameter updates are linear in the gradient).

Memory lives in host memory of the sending (and, for delta, receiving) side: one array of a
sample's activation shape per sample seen; every visit of a sample must have the same shape
(pad to a fixed length).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dlcomm.array_api import array_namespace
from dlcomm.split.codec import Codec, Encoded

MODES = ("delta", "feedback")


def check_ids(ids: Any, batch: int) -> np.ndarray:
    """``ids`` as an int64 vector of ``batch`` distinct sample ids; ValueError otherwise."""
    if ids is None:
        raise ValueError("this codec keeps a per-sample memory (memory=delta/feedback): pass "
                         "the batch's sample ids (one integer per sample)")
    arr = np.asarray(ids)
    if arr.ndim != 1 or arr.shape[0] != batch or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"sample ids must be {batch} integers, one per sample of the batch, "
                         f"got {arr.dtype} of shape {arr.shape}")
    if np.unique(arr).size != arr.size:
        raise ValueError("sample ids must be distinct within a batch")
    return arr.astype(np.int64)


class SampleMemory:
    """``codec`` with a per-sample memory in mode ``delta`` or ``feedback`` (see module)."""

    def __init__(self, codec: Codec, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"memory must be one of {list(MODES)}, got {mode!r}")
        self.codec = codec
        self.mode = mode
        self.store: dict[int, Any] = {}

    @property
    def last_stats(self) -> dict[str, float]:
        return self.codec.last_stats

    def _gather(self, ids: np.ndarray, like: Any) -> Any:
        xp = array_namespace(like)
        rows = []
        for sid in ids.tolist():
            kept = self.store.get(sid)
            if kept is not None and kept.shape != like.shape[1:]:
                raise ValueError(f"sample {sid} arrived with shape {tuple(like.shape[1:])} but "
                                 f"was {tuple(kept.shape)} before: a per-sample memory needs "
                                 "the same shape every time (pad to a fixed length)")
            rows.append(xp.zeros(like.shape[1:], dtype=like.dtype) if kept is None else kept)
        return xp.stack(rows) if rows else xp.zeros_like(like)

    def _scatter(self, ids: np.ndarray, values: Any) -> None:
        for i, sid in enumerate(ids.tolist()):
            self.store[sid] = values[i].copy()

    def encode(self, x: Any, ids: Any) -> Encoded:
        """The sender's side: encode batch ``x`` of samples ``ids``, updating the memory."""
        if x.ndim < 1:
            raise ValueError("a per-sample memory needs a batch axis first")
        ids = check_ids(ids, x.shape[0])
        kept = self._gather(ids, x)
        if self.mode == "delta":
            encoded = self.codec.encode(x - kept)
            self._scatter(ids, kept + self.codec.decode(encoded))
        else:
            acc = x + kept
            encoded = self.codec.encode(acc)
            self._scatter(ids, acc - self.codec.decode(encoded))
        return encoded

    def decode(self, encoded: Encoded, ids: Any) -> Any:
        """The receiver's side: the batch for samples ``ids`` (delta: updates the memory)."""
        decoded = self.codec.decode(encoded)
        if self.mode == "feedback":
            return decoded
        ids = check_ids(ids, decoded.shape[0])
        out = self._gather(ids, decoded) + decoded
        self._scatter(ids, out)
        return out

    def relative_error_bound(self, encoded: Encoded) -> float:
        """The codec's bound, relative to what was encoded (the delta, or ``g + e``)."""
        return self.codec.relative_error_bound(encoded)

    def describe(self) -> str:
        return f"{self.codec.describe()},memory={self.mode}"

    def __repr__(self) -> str:
        return f"SampleMemory({self.describe()!r})"
