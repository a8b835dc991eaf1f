"""Top-k's decompress of a 4.7M-element weight with 4 ranks' payloads and momentum
correction, one process: ``decompress_all`` + copy into the gradient (``old``) against
``decompress_all_into`` (``into``), checking equal bits each step. ``python decompress_times.py``"""
import statistics
import time

import numpy as np

from dlcomm.compression import get_compressor
from dlcomm.kernels import scale_into

res: dict = {}
rng = np.random.default_rng(0)
large = [rng.standard_normal((3072, 1536)).astype(np.float32) for _ in range(4)]
cs = {m: get_compressor("topk:ratio=0.01,approx=1") for m in ("old", "into")}
for c in cs.values():
    c.set_momentum(0.9)
outs = {m: np.empty((3072, 1536), np.float32) for m in cs}
for i in range(60):
    for m, c in cs.items():
        payloads, ctx = c.compress(large[i % 4].copy(), "w1")
        others = [payloads] + [[payloads[0] * (j + 2), (payloads[1] + 1000 * j) % large[0].size]
                               for j in range(3)]
        t1 = time.perf_counter()
        if m == "old":
            v = c.decompress_all(others, ctx, "average")
            scale_into(v, 1.0, outs[m])
        else:
            assert c.decompress_all_into(others, ctx, "average", outs[m]) is not None
        res.setdefault(m, []).append((time.perf_counter() - t1) * 1e3)
    assert np.array_equal(outs["old"].view(np.uint32), outs["into"].view(np.uint32)), i
print("  ".join(f"{m} {statistics.median(v[5:]):.2f} ms" for m, v in res.items()), "bits equal")
