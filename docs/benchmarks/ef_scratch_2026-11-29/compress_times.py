"""Error feedback's compress of the mlp's 4.7M-element weight (approximate top-k at 1%,
momentum correction), 60 calls with the rest of a step's allocations between them; prints
the statistics of the calls after the first 5: ``python compress_times.py LABEL``."""
import statistics
import sys
import time

import numpy as np

from dlcomm.compression import get_compressor

c = get_compressor("topk:ratio=0.01,approx=1")
c.set_momentum(0.9)
rng = np.random.default_rng(0)
large = [rng.standard_normal((3072, 1536)).astype(np.float32) for _ in range(4)]
middle = [rng.standard_normal((1536, 1024)).astype(np.float32) for _ in range(4)]
times = []
for i in range(60):
    start = time.perf_counter()
    payloads, ctx = c.compress(large[i % 4], "w1")
    times.append((time.perf_counter() - start) * 1e3)
    c.decompress_all([payloads], ctx, "average")
    payloads, ctx = c.compress(middle[i % 4], "w3")
    c.decompress_all([payloads], ctx, "average")
    np.empty_like(large[0])[:] = 1  # the optimizer's temporaries
times = times[5:]
print(f"{sys.argv[1]}: compress w1 median {statistics.median(times):.1f} ms, mean "
      f"{statistics.mean(times):.1f}, max {max(times):.1f}, >20ms "
      f"{sum(t > 20 for t in times)} of {len(times)}")
