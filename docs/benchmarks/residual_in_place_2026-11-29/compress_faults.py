import numpy as np, time, statistics, sys, resource
import dlcomm.compression.error_feedback as efm
from dlcomm.compression.topk_select import native_topk_with_residual as orig
from dlcomm.compression import get_compressor
inplace = sys.argv[1] == "1"
efm.native_topk_with_residual = lambda g, r, k, **kw: orig(g, r, k, in_place=inplace)
c = get_compressor("topk:ratio=0.01,approx=1"); c.set_momentum(0.9)
rng = np.random.default_rng(0)
gs = [rng.standard_normal((3072,1536)).astype(np.float32) for _ in range(4)]
hs = [rng.standard_normal((1536,1024)).astype(np.float32) for _ in range(4)]
ts=[]; fs=[]; allf=[]
for i in range(60):
    f0=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t=time.perf_counter()
    p, ctx = c.compress(gs[i%4], "w1")
    ts.append((time.perf_counter()-t)*1e3)
    f1=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = c.decompress_all([p], ctx, "average")
    p2, ctx2 = c.compress(hs[i%4], "w3"); c.decompress_all([p2], ctx2, "average")
    tmp = np.empty_like(gs[0]); tmp[:] = 1
    f2=resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fs.append(f1-f0); allf.append(f2-f0)
ts=ts[5:]; fs=fs[5:]; allf=allf[5:]
print(f"in_place={inplace}: compress w1 median {statistics.median(ts):.1f} ms, max {max(ts):.1f}; faults in compress median {statistics.median(fs)} max {max(fs)}; per step median {statistics.median(allf)}")
