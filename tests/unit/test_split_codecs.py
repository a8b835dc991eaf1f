"""Split fine-tuning's codecs, per-sample memory and protocol (dlcomm.split), on numpy."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlcomm.split import (
    Float16Codec,
    Kind,
    LowRankCodec,
    Message,
    NoneCodec,
    SampleMemory,
    SideCodec,
    Slot,
    TopKCodec,
    get_codec,
    message_nbytes,
    pack,
    unpack,
)
from dlcomm.split.codec import Encoded
from dlcomm.split.lowrank import spectrum
from dlcomm.split.protocol import HEADER_WORDS, layout_words, tags


def rel_error(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.linalg.norm((x - y).astype(np.float64)) / np.linalg.norm(x.astype(np.float64)))


def activation(rng: np.random.Generator, batch: int = 6, tokens: int = 11, hidden: int = 24,
               rank: int = 5, noise: float = 0.05) -> np.ndarray:
    """A [batch, tokens, hidden] array of low rank plus noise, like a hidden state."""
    a = rng.standard_normal((batch * tokens, rank)) @ rng.standard_normal((rank, hidden))
    a += noise * rng.standard_normal(a.shape)
    return a.reshape(batch, tokens, hidden).astype(np.float32)


CODEC_SPECS = ["none", "fp16", "lowrank:rank=3", "lowrank:rank=3,dtype=float16",
               "lowrank:energy=0.9", "lowrank:energy=0.999,max_rank=8,dtype=float16",
               "topk:ratio=0.1", "topk:ratio=0.3,dtype=float16"]


@pytest.mark.parametrize("spec", CODEC_SPECS)
@pytest.mark.parametrize("shape", [(6, 11, 24), (5, 7), (40, 3), (3, 50), (13,), (1, 1)])
def test_round_trip_within_stated_bound(spec: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(len(spec) * 31 + len(shape))
    x = rng.standard_normal(shape).astype(np.float32) * 3
    codec = get_codec(spec)
    enc = codec.encode(x)
    y = codec.decode(enc)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert rel_error(x, y) <= codec.relative_error_bound(enc)


@pytest.mark.parametrize("energy", [0.5, 0.9, 0.99, 0.999])
def test_lowrank_energy_keeps_the_energy_and_the_bound_is_tight(energy: float) -> None:
    x = activation(np.random.default_rng(1))
    codec = LowRankCodec(energy=energy)
    enc = codec.encode(x)
    err = rel_error(x, codec.decode(enc))
    assert err <= math.sqrt(1 - energy) + 1e-5
    assert codec.last_stats["energy_kept"] >= energy
    # the error is exactly the energy left out (truncated SVD is optimal)
    assert err == pytest.approx(math.sqrt(1 - codec.last_stats["energy_kept"]), abs=1e-5)
    # and the smallest rank that keeps it: one rank less would not
    s = np.linalg.svd(x.reshape(-1, x.shape[-1]).astype(np.float64), compute_uv=False) ** 2
    r = codec.last_stats["rank"]
    assert s[:r].sum() / s.sum() >= energy * (1 - 1e-12)
    assert r == 1 or s[:r - 1].sum() / s.sum() < energy


def test_lowrank_matches_the_svd_truncation() -> None:
    x = activation(np.random.default_rng(2), noise=0.3)
    m = x.reshape(-1, x.shape[-1]).astype(np.float64)
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    best = (u[:, :4] * s[:4]) @ vt[:4]
    for shape in (x.shape, (x.shape[-1], -1)):  # tall, and wide (the other Gram matrix)
        xm = x.reshape(shape) if shape[0] != x.shape[-1] else m.T.astype(np.float32)
        ref = best.reshape(x.shape) if shape[0] != x.shape[-1] else best.T
        y = LowRankCodec(rank=4).decode(LowRankCodec(rank=4).encode(xm))
        assert np.allclose(y, ref, atol=1e-4)


def test_lowrank_sends_raw_when_factors_are_not_smaller() -> None:
    x = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    codec = LowRankCodec(rank=3)  # 3 * (4 + 5) = 27 >= 20
    enc = codec.encode(x)
    assert len(enc.parts) == 1 and np.array_equal(codec.decode(enc), x)
    assert codec.relative_error_bound(enc) == 0.0


def test_lowrank_bytes_are_the_factors() -> None:
    x = activation(np.random.default_rng(4), batch=8, tokens=16, hidden=64)
    enc = LowRankCodec(rank=4, dtype="float16").encode(x)
    rows = 8 * 16
    assert enc.nbytes == (rows * 4 + 64 * 4) * 2 + 4 * 4  # fp16 factors + float32 scales
    enc32 = LowRankCodec(rank=4).encode(x)
    assert enc32.nbytes == (rows * 4 + 64 * 4) * 4 + 4 * 4


def test_zero_and_tiny_arrays() -> None:
    zero = np.zeros((6, 8), dtype=np.float32)
    for spec in CODEC_SPECS:
        codec = get_codec(spec)
        assert np.array_equal(codec.decode(codec.encode(zero)), zero)
    tiny = np.full((10, 10), 1e-7, dtype=np.float32)
    tiny[0, 0] = 3e-7
    for spec in ("fp16", "lowrank:rank=1,dtype=float16", "topk:ratio=0.5,dtype=float16"):
        codec = get_codec(spec)
        enc = codec.encode(tiny)
        assert rel_error(tiny, codec.decode(enc)) <= codec.relative_error_bound(enc)


def test_float16_keeps_small_gradients() -> None:
    g = np.random.default_rng(5).standard_normal(1000).astype(np.float32) * 1e-6
    codec = Float16Codec()
    enc = codec.encode(g)
    assert enc.parts[0].dtype == np.float16
    assert rel_error(g, codec.decode(enc)) < 2 ** -10


def test_topk_keeps_the_largest() -> None:
    x = np.arange(-10, 10, dtype=np.float32)
    codec = TopKCodec(ratio=0.2)
    y = codec.decode(codec.encode(x))
    assert np.count_nonzero(y) == 4
    assert set(np.flatnonzero(y)) == {0, 1, 18, 19}
    assert rel_error(x, y) <= math.sqrt(1 - 4 / 20) + 1e-6


def test_codecs_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError, match="exactly one of"):
        LowRankCodec()
    with pytest.raises(ValueError, match="exactly one of"):
        LowRankCodec(rank=2, energy=0.9)
    with pytest.raises(ValueError, match="energy"):
        LowRankCodec(energy=1.5)
    with pytest.raises(ValueError, match="rank"):
        LowRankCodec(rank=0)
    with pytest.raises(ValueError, match="dtype"):
        LowRankCodec(rank=2, dtype="int8")
    with pytest.raises(ValueError, match="ratio"):
        TopKCodec(ratio=0)
    with pytest.raises(TypeError, match="floating"):
        LowRankCodec(rank=1).encode(np.ones((3, 3), dtype=np.int64))
    with pytest.raises(TypeError, match="numpy"):
        NoneCodec().encode([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown split codec"):
        get_codec("svd:rank=2")
    with pytest.raises(ValueError, match="unknown parameter"):
        get_codec("lowrank:ratio=2")
    with pytest.raises(ValueError, match="is not int"):
        get_codec("lowrank:rank=two")
    with pytest.raises(ValueError, match="memory"):
        get_codec("lowrank:rank=2,memory=forever")
    with pytest.raises(ValueError, match="non-empty"):
        get_codec("")


def test_spec_round_trip() -> None:
    for spec in CODEC_SPECS + ["lowrank:rank=2,memory=delta", "topk:ratio=0.1,memory=feedback"]:
        codec = get_codec(spec)
        assert get_codec(codec.describe()).describe() == codec.describe()


def test_delta_memory_converges_on_a_repeated_sample() -> None:
    """A sample seen again: the error of the delta shrinks; sender and receiver agree."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 9, 16)).astype(np.float32)
    sender = SampleMemory(LowRankCodec(rank=2), "delta")
    receiver = SampleMemory(LowRankCodec(rank=2), "delta")
    ids = np.array([3, 1, 4, 0])
    errors = []
    for _ in range(8):
        out = receiver.decode(sender.encode(x, ids), ids)
        errors.append(rel_error(x, out))
    assert errors[0] > 0.3 and errors[-1] < 1e-4
    assert all(b <= a + 1e-6 for a, b in zip(errors, errors[1:]))
    for sid in ids.tolist():
        assert np.array_equal(sender.store[sid], receiver.store[sid])


def test_feedback_memory_sends_everything_over_time() -> None:
    """What the receiver got for a sample adds up to what was sent, up to the residual."""
    rng = np.random.default_rng(7)
    ids = np.array([0, 1, 2])
    sender = SampleMemory(TopKCodec(ratio=0.1), "feedback")
    receiver = SampleMemory(TopKCodec(ratio=0.1), "feedback")
    total_in = np.zeros((3, 20), dtype=np.float64)
    total_out = np.zeros((3, 20), dtype=np.float64)
    for _ in range(30):
        g = rng.standard_normal((3, 20)).astype(np.float32)
        total_in += g
        total_out += receiver.decode(sender.encode(g, ids), ids)
    residual = np.stack([sender.store[i] for i in range(3)])
    assert np.allclose(total_in, total_out + residual, atol=1e-4)


def test_memory_needs_ids_and_fixed_shapes() -> None:
    mem = SampleMemory(NoneCodec(), "delta")
    x = np.ones((2, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="sample ids"):
        mem.encode(x, None)
    with pytest.raises(ValueError, match="2 integers"):
        mem.encode(x, [1])
    with pytest.raises(ValueError, match="distinct"):
        mem.encode(x, [1, 1])
    mem.encode(x, [1, 2])
    with pytest.raises(ValueError, match="same shape"):
        mem.encode(np.ones((2, 4), dtype=np.float32), [1, 2])


def test_protocol_round_trip_and_byte_count() -> None:
    rng = np.random.default_rng(8)
    x = activation(rng)
    codec = LowRankCodec(rank=3, dtype="float16")
    slots = [(Slot.ACTIVATION, codec.encode(x)),
             (Slot.SIDE, NoneCodec().encode(np.ones((6, 11), dtype=np.bool_))),
             (Slot.LABELS, NoneCodec().encode(np.arange(6, dtype=np.int64))),
             (Slot.LOSS, Encoded((), (7,)))]
    msg = Message(Kind.ACTIVATION, step=12, micro=3, micro_count=4, flags=1, slots=slots)
    header, body = pack(msg)
    assert header.nbytes + body.nbytes == message_nbytes(msg)
    assert header.nbytes == HEADER_WORDS * 8
    assert body.nbytes == layout_words(msg).nbytes + sum(e.nbytes for _, e in slots)
    back = unpack(header, body)
    assert (back.kind, back.step, back.micro, back.micro_count, back.flags) == \
        (Kind.ACTIVATION, 12, 3, 4, 1)
    assert [t for t, _ in back.slots] == [t for t, _ in slots]
    for (_, a), (_, b) in zip(slots, back.slots):
        assert a.meta == b.meta
        assert all(np.array_equal(p, q) and p.dtype == q.dtype for p, q in zip(a.parts, b.parts))
    assert np.allclose(codec.decode(back.slot(Slot.ACTIVATION)[0]),
                       codec.decode(slots[0][1]))


def test_protocol_refuses_garbage() -> None:
    msg = Message(Kind.CLOSE, step=0)
    header, body = pack(msg)
    bad = header.copy()
    bad[0] = 0
    with pytest.raises(ValueError, match="magic"):
        unpack(bad, body)
    with pytest.raises(ValueError, match="bytes"):
        unpack(header, np.zeros(body.size + 8, dtype=np.uint8))
    with pytest.raises(ValueError, match="micro-batch"):
        tags(Kind.ACTIVATION, 5000)
    channels = {k for k in Kind if k is not Kind.CLOSE}  # CLOSE travels as ACTIVATION does
    assert len({tags(k, m)[i] for k in channels for m in (0, 1, 1023) for i in (0, 1)}) == \
        len(channels) * 3 * 2
    assert tags(Kind.CLOSE, 0) == tags(Kind.ACTIVATION, 0)


def test_side_codec_packs_masks_and_keeps_the_rest() -> None:
    codec = SideCodec()
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=np.int64)
    enc = codec.encode(mask)
    assert enc.nbytes == 2  # 15 bits
    back = codec.decode(enc)
    assert back.dtype == np.int64 and np.array_equal(back, mask)
    flags = np.array([True, False, True])
    assert np.array_equal(codec.decode(codec.encode(flags)), flags)
    labels = np.array([0, 2, 1, 2], dtype=np.int64)
    enc = codec.encode(labels)
    assert enc.nbytes == labels.nbytes and np.array_equal(codec.decode(enc), labels)
    floats = np.array([0.0, 1.0, 0.5], dtype=np.float32)
    assert np.array_equal(codec.decode(codec.encode(floats)), floats)


def test_spectrum_orders_energies() -> None:
    m = np.random.default_rng(9).standard_normal((30, 7))
    energies, vectors, right = spectrum(m)
    assert right and np.all(np.diff(energies) <= 1e-9)
    assert np.allclose(energies, np.linalg.svd(m, compute_uv=False) ** 2)
