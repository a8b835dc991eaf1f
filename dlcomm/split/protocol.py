"""The edge <-> cloud protocol of split fine-tuning: what is sent each step, in which order,
and how a message is laid out in bytes.

One training step of one edge, batch cut into M micro-batches (i = 0 .. M-1):

* labels on the cloud (default)::

    edge -> cloud  ACTIVATION i   the split point's output (+ kept links, side inputs such as
                                  the attention mask, the labels, the sample ids)
    cloud -> edge  GRADIENT i     the loss of micro-batch i and the gradient of the activation

  The edge sends micro-batch i as soon as it is computed; the cloud runs forward, loss and
  backward of i on arrival and sends its gradient while the edge computes i + 1.
* labels on the edge::

    edge -> cloud  ACTIVATION i        (no labels)
    cloud -> edge  OUTPUT i            the cloud part's output
    edge -> cloud  OUTPUT_GRADIENT i   the gradient of the edge's loss w.r.t. that output
    cloud -> edge  GRADIENT i          the gradient of the activation

Evaluation (no gradient) sends ACTIVATION and gets OUTPUT back, nothing else. An edge that is
done sends CLOSE. Every message is two transport messages: a fixed header of ``HEADER_WORDS``
int64 (magic, kind, step, micro-batch, micro-batch count, flags, layout words, body bytes)
and a body: the layout (int64 words describing each slot: its tag, its codec's integers, and
its parts' dtypes and shapes), then the parts' bytes in order. Each (kind, micro-batch) pair
has its own MPI tags (CLOSE shares ACTIVATION's), so messages of different kinds or
micro-batches never match each other.
"""
from __future__ import annotations

import dataclasses
import enum

import numpy as np

from dlcomm.array_api import to_host
from dlcomm.split.codec import Encoded, code_dtype, dtype_code

MAGIC = 0x53504C54  # "SPLT"
HEADER_WORDS = 8
MAX_MICRO_BATCHES = 1024


class Kind(enum.IntEnum):
    """What a message carries (see the module docstring for the order)."""

    ACTIVATION = 1
    GRADIENT = 2
    OUTPUT = 3
    OUTPUT_GRADIENT = 4
    CLOSE = 5


class Flag(enum.IntFlag):
    """Bits of a message's ``flags``."""

    TRAIN = 1  # the cloud back-propagates this micro-batch and counts it towards its step
    MODULE_TRAINING = 2  # the edge's module is in training mode (dropout on): the cloud's too
    NEED_GRAD = 4  # the edge wants the activations' gradients back


class Slot(enum.IntEnum):
    """What one encoded array of a message is (its tag in the layout)."""

    ACTIVATION = 1  # the split point's output
    LINK = 2  # another activation that crosses (links='keep')
    SIDE = 3  # an input the cloud part needs (e.g. an attention mask), sent losslessly
    LABELS = 4
    SAMPLE_IDS = 5
    LOSS = 6
    OUTPUT = 7
    GRADIENT = 8
    WEIGHT = 9  # the micro-batch's share of the batch (its loss is weighted by it)


@dataclasses.dataclass
class Message:
    """One protocol message: its kind, step, micro-batch and slots (tag, encoded array)."""

    kind: Kind
    step: int
    micro: int = 0
    micro_count: int = 1
    flags: int = 0
    slots: list[tuple[int, Encoded]] = dataclasses.field(default_factory=list)

    def slot(self, tag: int) -> list[Encoded]:
        """The encoded arrays of slot ``tag``, in order."""
        return [enc for t, enc in self.slots if t == tag]


# Which tags a kind travels on: CLOSE shares ACTIVATION's, since the cloud waits for either.
CHANNELS = {Kind.ACTIVATION: 1, Kind.CLOSE: 1, Kind.OUTPUT_GRADIENT: 2, Kind.OUTPUT: 3,
            Kind.GRADIENT: 4}


def tags(kind: Kind, micro: int) -> tuple[int, int]:
    """The MPI tags of the header and of the body of (``kind``, micro-batch ``micro``)."""
    if not 0 <= micro < MAX_MICRO_BATCHES:
        raise ValueError(f"micro-batch index must be in [0, {MAX_MICRO_BATCHES}), got {micro}")
    base = (CHANNELS[kind] * MAX_MICRO_BATCHES + micro) * 2
    return base, base + 1


def layout_words(message: Message) -> np.ndarray:
    """The layout of ``message``'s slots as int64 words."""
    words: list[int] = [len(message.slots)]
    for tag, enc in message.slots:
        words += [int(tag), len(enc.meta), *map(int, enc.meta), len(enc.parts)]
        for part in enc.parts:
            words += [dtype_code(part.dtype), part.ndim, *map(int, part.shape)]
    return np.asarray(words, dtype=np.int64)


def pack(message: Message) -> tuple[np.ndarray, np.ndarray]:
    """(header, body) of ``message``: int64[HEADER_WORDS] and the body's bytes (host)."""
    layout = layout_words(message)
    chunks = [layout.view(np.uint8)]
    for _, enc in message.slots:
        for part in enc.parts:
            host = np.ascontiguousarray(to_host(part))
            chunks.append(host.reshape(-1).view(np.uint8))
    body = np.concatenate(chunks) if len(chunks) > 1 else chunks[0].copy()
    header = np.array([MAGIC, int(message.kind), message.step, message.micro,
                       message.micro_count, int(message.flags), layout.size, body.size],
                      dtype=np.int64)
    return header, body


def read_header(header: np.ndarray) -> tuple[Kind, int, int, int, int, int, int]:
    """(kind, step, micro, micro_count, flags, layout words, body bytes) of a header."""
    if header.shape != (HEADER_WORDS,) or int(header[0]) != MAGIC:
        raise ValueError("not a split-protocol header (wrong magic or size): ranks disagree "
                         "about who is the edge and who the cloud?")
    kind = Kind(int(header[1]))
    return (kind, *(int(v) for v in header[2:]))  # type: ignore[return-value]


def unpack(header: np.ndarray, body: np.ndarray) -> Message:
    """The message that ``pack`` turned into ``header`` and ``body``."""
    kind, step, micro, micro_count, flags, n_layout, n_body = read_header(header)
    if body.size != n_body or n_layout * 8 > n_body:
        raise ValueError(f"split message body has {body.size} bytes, header says {n_body}")
    words = body[:n_layout * 8].view(np.int64).tolist()
    offset = n_layout * 8
    pos = 0

    def take(n: int = 1) -> list[int]:
        nonlocal pos
        if pos + n > len(words):
            raise ValueError("malformed split message layout")
        out = words[pos:pos + n]
        pos += n
        return out

    slots: list[tuple[int, Encoded]] = []
    for _ in range(take()[0]):
        tag, n_meta = take(2)
        meta = tuple(take(n_meta))
        parts = []
        for _ in range(take()[0]):
            code, ndim = take(2)
            shape = tuple(take(ndim))
            dtype = code_dtype(code)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if offset + nbytes > body.size:
                raise ValueError("split message body is shorter than its layout says")
            parts.append(body[offset:offset + nbytes].copy().view(dtype).reshape(shape))
            offset += nbytes
        slots.append((tag, Encoded(tuple(parts), meta)))
    if offset != body.size:
        raise ValueError("split message body is longer than its layout says")
    return Message(kind, step, micro, micro_count, flags, slots)


def message_nbytes(message: Message) -> int:
    """Bytes ``message`` puts on the link: header, layout and parts."""
    return HEADER_WORDS * 8 + layout_words(message).nbytes + sum(
        enc.nbytes for _, enc in message.slots)
