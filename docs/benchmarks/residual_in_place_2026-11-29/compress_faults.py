"""Compress time and page faults of error feedback's native top-k on the mlp's large weight,
one process: ``python compress_faults.py 0`` (a new residual array every step) or ``1`` (the
residual written in place; needs residual_in_place.patch applied)."""
import resource
import statistics
import sys
import time

import numpy as np

import dlcomm.compression.error_feedback as efm
from dlcomm.compression import get_compressor
from dlcomm.compression.topk_select import native_topk_with_residual as original

in_place = sys.argv[1] == "1"
efm.native_topk_with_residual = lambda g, r, k, **kw: original(g, r, k, in_place=in_place)
c = get_compressor("topk:ratio=0.01,approx=1")
c.set_momentum(0.9)
rng = np.random.default_rng(0)
large = [rng.standard_normal((3072, 1536)).astype(np.float32) for _ in range(4)]
middle = [rng.standard_normal((1536, 1024)).astype(np.float32) for _ in range(4)]
times, faults, per_step = [], [], []
for i in range(60):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    payloads, ctx = c.compress(large[i % 4], "w1")
    times.append((time.perf_counter() - start) * 1e3)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    c.decompress_all([payloads], ctx, "average")
    payloads, ctx = c.compress(middle[i % 4], "w3")
    c.decompress_all([payloads], ctx, "average")
    np.empty_like(large[0])[:] = 1  # the optimizer's temporaries
    end = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    faults.append(after - before)
    per_step.append(end - before)
times, faults, per_step = times[5:], faults[5:], per_step[5:]
print(f"in_place={in_place}: compress w1 median {statistics.median(times):.1f} ms, max "
      f"{max(times):.1f}; faults in compress median {statistics.median(faults)} max "
      f"{max(faults)}; per step median {statistics.median(per_step)}")
