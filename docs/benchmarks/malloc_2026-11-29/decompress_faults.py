"""Error feedback's compress and decompress (4 ranks' payloads) of the mlp's 4.7M-element
weight in one process, 60 steps: time and minor page faults per part, after the first 5.
Run with ``GLIBC_TUNABLES`` unset (glibc's defaults outside dlcommrun) and with dlcommrun's
setting (``MALLOC_TUNABLES`` of dlcomm/launcher/mpirun_command.py)."""
import resource
import statistics
import time

import numpy as np

from dlcomm.compression import get_compressor


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


c = get_compressor("topk:ratio=0.01,approx=1")
c.set_momentum(0.9)
rng = np.random.default_rng(0)
large = [rng.standard_normal((3072, 1536)).astype(np.float32) for _ in range(4)]
rows = []
for i in range(60):
    f0, t0 = faults(), time.perf_counter()
    payloads, ctx = c.compress(large[i % 4], "w1")
    f1, t1 = faults(), time.perf_counter()
    others = [[payloads[0] * np.float32(0.5), payloads[1]] for _ in range(3)]
    c.decompress_all([payloads, *others], ctx, "average")
    f2, t2 = faults(), time.perf_counter()
    np.empty_like(large[0])[:] = 1  # the optimizer's temporaries
    rows.append(((t1 - t0) * 1e3, f1 - f0, (t2 - t1) * 1e3, f2 - f1))
rows = rows[5:]
for k, name in enumerate(("compress ms", "compress faults", "decompress ms",
                          "decompress faults")):
    values = [r[k] for r in rows]
    print(f"{name}: median {statistics.median(values):.1f} max {max(values):.1f}")
