"""The native selection as it was (fresh output buffers every call), timed and its minor
page faults counted per part, inside error feedback's compress of the mlp's two large
weights; prints the calls slower than 15 ms."""
import resource
import time

import numpy as np

from dlcomm import kernels
from dlcomm.compression import get_compressor

log = []


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def fresh_buffers_select(grad, threshold, residual=None, index_dtype=np.int32, **kwargs):
    thr = kernels._threshold(threshold, grad.dtype)
    index_dtype = np.dtype(index_dtype)
    n = grad.size
    parts = []
    start, before = time.perf_counter(), faults()
    values = np.empty(n, dtype=grad.dtype)
    indices = np.empty(n, dtype=index_dtype)
    new_residual = np.empty(grad.shape, dtype=grad.dtype)
    parts.append(("alloc", time.perf_counter() - start, faults() - before))
    start, before = time.perf_counter(), faults()
    count = kernels._LIB.dlc_ef_select_f32(
        kernels._ptr(grad), None if residual is None else kernels._ptr(residual), n, thr,
        kernels._ptr(values), kernels._ptr(indices), index_dtype.itemsize,
        kernels._ptr(new_residual))
    parts.append(("native", time.perf_counter() - start, faults() - before))
    log.append(parts)
    return values[:count].copy(), indices[:count].copy(), new_residual


kernels.ef_select = fresh_buffers_select
c = get_compressor("topk:ratio=0.01,approx=1")
c.set_momentum(0.9)
rng = np.random.default_rng(0)
large = [rng.standard_normal((3072, 1536)).astype(np.float32) for _ in range(4)]
middle = [rng.standard_normal((1536, 1024)).astype(np.float32) for _ in range(4)]
for i in range(60):
    for tensor, name in ((large[i % 4], "w1"), (middle[i % 4], "w3")):
        payloads, ctx = c.compress(tensor, name)
        c.decompress_all([payloads], ctx, "average")
    np.empty_like(large[0])[:] = 1
for parts in log:
    if sum(p[1] for p in parts) > 0.015:
        print(" | ".join(f"{name} {s * 1e3:.1f} ms {f} faults" for name, s, f in parts))
