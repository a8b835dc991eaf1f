"""Compression state in torch checkpoints (issue 27 item 1): a run stopped after 4 steps and
resumed in a new process from ``optimizer.state_dict()`` (saved with ``torch.save``, loaded
with ``torch.load(weights_only=True)``) ends with exactly the parameters of the run that went
through all 8 steps, for every compressor with state, also after
``broadcast_optimizer_state`` (each rank keeps its own residuals); resuming from the same
checkpoint without the compression state does not (so the test can fail)."""
from __future__ import annotations

import numpy as np
from mpi_run import run_mpi

SPECS = ["none", "topk:ratio=0.1", "powersgd:rank=2", "acpsgd:rank=2", "efsignsgd",
         "randomk:ratio=0.1,ef=1", "gtopk:ratio=0.1"]

SCRIPT = r'''
import sys
import numpy as np
import torch
import torch.nn.functional as F
import dlcomm.torch as hvd
from dlcomm.torch.compression_state import COMPRESSION_STATE_KEY

phase, out_dir, specs = sys.argv[1], sys.argv[2], sys.argv[3].split(";")
hvd.init()
torch.set_num_threads(1)
r = hvd.rank()
g = torch.Generator().manual_seed(100 + r)
X, Y = torch.randn(64, 24, generator=g), torch.randint(0, 5, (64,), generator=g)
for spec in specs:
    tag = spec.replace(":", "_").replace("=", "_").replace(",", "_")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 72), torch.nn.ReLU(), torch.nn.Linear(72, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=spec)
    ckpt = f"{out_dir}/ckpt_{tag}_{r}.pt"
    first = 0
    if phase in ("resume", "resume_plain"):
        saved = torch.load(ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        if phase == "resume_plain":
            saved["optimizer"].pop(COMPRESSION_STATE_KEY, None)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.load_state_dict(saved["optimizer"])
        # Horovod's pattern after loading: every rank keeps its own compression state.
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        first = 4
    last = 4 if phase == "first" else 8
    for step in range(first, last):
        idx = slice(8 * step % 64, 8 * step % 64 + 8)
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
    if phase == "first":
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    else:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
        np.save(f"{out_dir}/{phase}_{tag}_{r}.npy", flat)
print("OK", flush=True)
'''


def test_resume_from_checkpoint_equals_the_uninterrupted_run(tmp_path):
    ranks = 3
    specs = ";".join(SPECS)
    for phase in ("full", "first", "resume", "resume_plain"):
        proc = run_mpi(ranks, SCRIPT, tmp_path, timeout=300, args=[phase, str(tmp_path), specs])
        assert proc.count_per_rank("OK") == [1] * ranks, proc.report()
    for spec in SPECS:
        tag = spec.replace(":", "_").replace("=", "_").replace(",", "_")
        for r in range(ranks):
            full = np.load(tmp_path / f"full_{tag}_{r}.npy")
            resumed = np.load(tmp_path / f"resume_{tag}_{r}.npy")
            np.testing.assert_array_equal(resumed, full, err_msg=f"{spec} rank {r}")
            plain = np.load(tmp_path / f"resume_plain_{tag}_{r}.npy")
            if spec != "none":  # without its state the compressor takes another path
                assert not np.array_equal(plain, full), f"{spec}: the state made no difference"
