"""Plain-numpy references for the compression tests (imported by the single- and multi-rank tests).

``simulate`` runs P compressor instances in lockstep in one process, doing each round's
collective with numpy (sum / gather / a sequential merge tree); the per-compressor functions
are independent textbook implementations that do not use dlcomm.compression's maths.
"""
from __future__ import annotations

import numpy as np

from dlcomm.compression import ALLGATHER, ALLREDUCE, SPARSE_MERGE, Compressor

ALL_SPECS = [
    "none", "fp16", "bf16", "topk:ratio=0.05", "topk:ratio=0.05,approx=1", "randomk:ratio=0.1",
    "randomk:ratio=0.1,ef=1", "randomk:ratio=0.1,unbiased=1", "gtopk:ratio=0.05", "efsignsgd",
    "signum", "qsgd:levels=4",
    "powersgd:rank=2", "acpsgd:rank=2", "powersgd:rank=2+fp16", "topk:ratio=0.05+bf16",
]


def _tree_merge(compressor: Compressor, per_rank: list, ctx: object) -> list:
    """The exchange's merge tree, run sequentially: fold extras, recursive doubling."""
    size = len(per_rank)
    vals = [list(p) for p in per_rank]
    base = 1 << (size.bit_length() - 1)
    for r in range(base, size):
        vals[r - base] = compressor.merge(vals[r - base], vals[r], ctx)
    mask = 1
    while mask < base:
        vals = [
            compressor.merge(vals[min(r, r ^ mask)], vals[max(r, r ^ mask)], ctx)
            for r in range(base)
        ]
        mask <<= 1
    return vals[0]


def simulate(compressors: list, tensors: list, name: str, average: bool = True) -> np.ndarray:
    """What every rank should get from compressed_allreduce, for P = len(compressors) ranks."""
    size = len(compressors)
    compressed = [c.compresses(t, name) for c, t in zip(compressors, tensors)]
    assert len(set(compressed)) == 1, compressed  # every rank decides alike
    if not compressed[0]:
        out = np.sum(tensors, axis=0, dtype=tensors[0].dtype)
        return out / out.dtype.type(size) if average else out
    steps = [c.compress(t, name) for c, t in zip(compressors, tensors)]
    rounds = compressors[0].rounds
    for i, kind in enumerate(rounds):
        if kind == ALLREDUCE:
            summed = [np.sum([s[0][j] for s in steps], axis=0, dtype=steps[0][0][j].dtype)
                      for j in range(len(steps[0][0]))]
            results = [[p.copy() for p in summed] for _ in range(size)]
        elif kind == ALLGATHER:
            gathered = [[p.reshape(-1).copy() for p in s[0]] for s in steps]
            results = [gathered] * size
        elif kind == SPARSE_MERGE:
            merged = _tree_merge(compressors[0], [s[0] for s in steps], steps[0][1])
            results = [[p.copy() for p in merged] for _ in range(size)]
        if i < len(rounds) - 1:
            steps = [c.resume(res, s[1]) for c, res, s in zip(compressors, results, steps)]
    outs = []
    for c, res, s in zip(compressors, results, steps):
        if rounds[-1] == ALLREDUCE:
            out = c.decompress(res, s[1])
            outs.append(out / out.dtype.type(size) if average else out)
        else:  # as the drivers do: every rank's payloads combined once per step
            outs.append(c.decompress_all(res, s[1], "average" if average else "sum"))
    for out in outs[1:]:
        np.testing.assert_array_equal(out, outs[0])
    return outs[0]


# -- independent references -------------------------------------------------------------------
def topk_dense(v: np.ndarray, k: int) -> np.ndarray:
    """``v`` with all but its k largest magnitudes zeroed (by full sort)."""
    flat = v.reshape(-1)
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(v.shape)


def gtopk_indices(accs: list, k: int) -> np.ndarray:
    """Global indices chosen by gTop-k's tree, computed on dense vectors."""
    vals = [topk_dense(a.reshape(-1), k) for a in accs]
    size = len(vals)
    base = 1 << (size.bit_length() - 1)
    for r in range(base, size):
        vals[r - base] = topk_dense(vals[r - base] + vals[r], k)
    mask = 1
    while mask < base:
        vals = [topk_dense(vals[min(r, r ^ mask)] + vals[max(r, r ^ mask)], k)
                for r in range(base)]
        mask <<= 1
    return np.flatnonzero(vals[0])


def gtopk_steps(grads_per_step: list, ratio: float) -> list:
    """gTop-k with error feedback over several steps: the averaged result of each step."""
    size = len(grads_per_step[0])
    residuals = [np.zeros_like(g) for g in grads_per_step[0]]
    results = []
    for grads in grads_per_step:
        accs = [g + r for g, r in zip(grads, residuals)]
        k = max(1, int(ratio * accs[0].size))
        idx = gtopk_indices(accs, k)
        out = np.zeros(accs[0].size, dtype=accs[0].dtype)
        out[idx] = np.sum([a.reshape(-1)[idx] for a in accs], axis=0)
        results.append((out / size).reshape(accs[0].shape))
        for a in accs:
            a.reshape(-1)[idx] = 0
        residuals = accs
    return results


def htopk_steps(grads_per_step: list, ratio: float, hosts: list) -> list:
    """Hierarchical top-k with per-rank error feedback, written from the description (not
    from dlcomm's code): ``hosts`` lists each host's ranks. Per step, each host sums its
    ranks' ``g + e``; the flat tensor is cut into ``min(len(host))`` near-equal contiguous
    shards and each host keeps the ``max(1, int(ratio * len))`` largest magnitudes of each
    shard of its sum; the result is the sum of what every host kept, over the rank count.
    A rank's new residual is its ``g + e`` with the host's kept positions zeroed.
    Returns ``(averaged result, residuals per rank, kept positions per host)`` per step.
    """
    size = sum(len(h) for h in hosts)
    shards = min(len(h) for h in hosts)
    shape = grads_per_step[0][0].shape
    residuals = [np.zeros(int(np.prod(shape)), dtype=np.float64) for _ in range(size)]
    steps = []
    for grads in grads_per_step:
        accs = [np.asarray(g, np.float64).reshape(-1) + e for g, e in zip(grads, residuals)]
        n = accs[0].size
        total = np.zeros(n)
        kept_per_host = []
        for host in hosts:
            host_sum = np.sum([accs[r] for r in host], axis=0)
            kept = []
            for j in range(shards):
                lo, hi = n * j // shards, n * (j + 1) // shards
                if hi > lo:
                    k = max(1, min(hi - lo, int(ratio * (hi - lo))))
                    kept.extend(lo + np.argsort(-np.abs(host_sum[lo:hi]), kind="stable")[:k])
            kept = np.array(sorted(kept), dtype=np.int64)
            total[kept] += host_sum[kept]
            for r in host:
                accs[r][kept] = 0
            kept_per_host.append(kept)
        residuals = accs
        steps.append(((total / size).reshape(shape), [e.copy() for e in residuals],
                      kept_per_host))
    return steps


def lowrank_factor(seed: int, name: str, which: int, shape: tuple) -> np.ndarray:
    """The seeded starting factor, derived as documented: rng([seed, crc32(name), which])."""
    import zlib

    return np.random.default_rng([seed, zlib.crc32(name.encode()), which]).standard_normal(shape)


def powersgd_step0(grads: list, rank: int, name: str, seed: int = 0) -> np.ndarray:
    """One PowerSGD step without error feedback, averaged over ranks."""
    ms = [g.reshape(g.shape[0], -1).astype(np.float64) for g in grads]
    r = min(rank, *ms[0].shape)
    q0 = lowrank_factor(seed, name, 0, (ms[0].shape[1], r))
    p_hat, _ = np.linalg.qr(sum(m @ q0 for m in ms))
    q = sum(m.T @ p_hat for m in ms)
    return (p_hat @ q.T / len(grads)).reshape(grads[0].shape)


def acpsgd_steps(grads_per_step: list, rank: int, name: str, seed: int = 0) -> list:
    """ACP-SGD without error feedback for a few steps (P on even, Q on odd), averaged."""
    shape = grads_per_step[0][0].shape
    rows = shape[0]
    cols = int(np.prod(shape[1:]))
    r = min(rank, rows, cols)
    p = lowrank_factor(seed, name, 1, (rows, r))
    q = lowrank_factor(seed, name, 0, (cols, r))
    outs = []
    for step, grads in enumerate(grads_per_step):
        ms = [g.reshape(rows, cols).astype(np.float64) for g in grads]
        if step % 2 == 0:
            q_hat, _ = np.linalg.qr(q)
            p = sum(m @ q_hat for m in ms)
            out = p @ q_hat.T
        else:
            p_hat, _ = np.linalg.qr(p)
            q = sum(m.T @ p_hat for m in ms)
            out = p_hat @ q.T
        outs.append((out / len(grads)).reshape(shape))
    return outs


def signum_vote(grads: list) -> np.ndarray:
    """Majority vote of signs (zeros count as +1); 0 on a tie."""
    return np.sign(np.sum([np.where(g >= 0, 1.0, -1.0) for g in grads], axis=0))


def efsign_average(grads: list) -> np.ndarray:
    """Mean over ranks of mean|g| * sign(g) (zeros as +), one step without memory."""
    return np.mean([np.abs(g).mean() * np.where(g >= 0, 1.0, -1.0) for g in grads], axis=0)
