"""Error feedback's compress of the mlp's 4.7M-element weight (top-k 1%, momentum 0.9):
the median of 55 calls after 5. ``python compress_times.py LABEL``"""
import statistics
import sys
import time

import numpy as np

from dlcomm.compression import get_compressor

c = get_compressor("topk:ratio=0.01,approx=1")
c.set_momentum(0.9)
rng = np.random.default_rng(0)
large = [rng.standard_normal((3072, 1536)).astype(np.float32) for _ in range(4)]
ts = []
for i in range(60):
    t0 = time.perf_counter()
    c.compress(large[i % 4], "w1")
    ts.append(time.perf_counter() - t0)
print(sys.argv[1], "compress median %.2f ms" % (statistics.median(ts[5:]) * 1e3))
