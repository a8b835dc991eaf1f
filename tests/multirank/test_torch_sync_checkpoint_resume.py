"""DS-Sync's and LB-BSP's state in torch checkpoints (issue 27 item 1): a run stopped after 4
steps and resumed in a new process from ``optimizer.state_dict()`` ends with exactly the
parameters of the run that went through all 8 steps, saving the same checkpoint at step 4
on the way (for DS-Sync a checkpoint is a global average of the model, so the uninterrupted
run averages there too). Without the ``dlcomm_sync`` state the resumed run differs: DS-Sync
shuffles its groups from step 0 again, LB-BSP starts from equal batches and no history.

LB-BSP's batch sizes follow measured compute times; the test replaces the clock of the
torch LB-BSP module with one that advances by ``(rank + 1) / 4`` s per reading, so every run
measures the same speeds (rank 0 the fastest).
"""
from __future__ import annotations

import numpy as np
from checkpoint_phases import assert_resume_equals_full, run_phases

MODES = ["dssync:group_size=2", "lbbsp:global_batch=24,min_batch=2,interval=4"]

SCRIPT = r'''
import sys
import types
import warnings
import numpy as np
import torch
import torch.nn.functional as F
import dlcomm.torch as hvd
from dlcomm.torch.compression_state import SYNC_STATE_KEY
from dlcomm.torch.heterogeneity import lbbsp

phase, out_dir, modes = sys.argv[1], sys.argv[2], sys.argv[3].split(";")
hvd.init()
torch.set_num_threads(1)
r = hvd.rank()
readings = iter(range(1, 1 << 30))
lbbsp.time = types.SimpleNamespace(perf_counter=lambda: next(readings) * (r + 1) / 4)
g = torch.Generator().manual_seed(7)
X, Y = torch.randn(8 * 24, 16, generator=g), torch.randint(0, 4, (8 * 24,), generator=g)
for mode in modes:
    tag = mode.split(":")[0]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), sync=mode)
    first = 0
    if phase in ("resume", "resume_plain"):
        model.load_state_dict(torch.load(f"{out_dir}/model_{tag}_{r}.pt", weights_only=True))
        saved = torch.load(f"{out_dir}/opt_{tag}_{r}.pt", weights_only=True)
        if phase == "resume_plain":
            saved.pop(SYNC_STATE_KEY)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.load_state_dict(saved)  # each rank its own: momentum differs under DS-Sync
        first = 4
    sizes = []
    for step in range(first, 8):
        if tag == "lbbsp":
            b = opt.balancer
            start = step * b.global_batch + b.offsets()[r]
            idx = slice(start, start + b.local_batch)
            sizes.append(list(b.batch_sizes))
        else:
            idx = slice(24 * step + 8 * r, 24 * step + 8 * r + 8)
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
        if step == 3:  # the checkpoint: taken by the uninterrupted run too
            model_state, opt_state = model.state_dict(), opt.state_dict()
            if phase == "full":
                torch.save(model_state, f"{out_dir}/model_{tag}_{r}.pt")
                torch.save(opt_state, f"{out_dir}/opt_{tag}_{r}.pt")
    if hasattr(opt, "synchronize_globally"):
        opt.synchronize_globally()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(f"{out_dir}/{phase}_{tag}_{r}.npy", flat)
    np.save(f"{out_dir}/{phase}_{tag}_sizes_{r}.npy", np.array(sizes[-4:], dtype=np.int64))
print("OK", flush=True)
'''


def test_sync_modes_resume_from_checkpoint_as_the_uninterrupted_run(tmp_path):
    ranks = 3
    run_phases(ranks, SCRIPT, tmp_path, ";".join(MODES), timeout=300)
    for mode in MODES:
        tag = mode.split(":")[0]
        assert_resume_equals_full(tmp_path, ranks, tag, mode, state_matters=True)
        if tag == "lbbsp":  # the balancer re-sized the batches, the same way after resuming
            full_sizes = np.load(tmp_path / f"full_{tag}_sizes_0.npy")
            assert len({tuple(s) for s in full_sizes}) > 1, full_sizes
            np.testing.assert_array_equal(np.load(tmp_path / f"resume_{tag}_sizes_0.npy"),
                                          full_sizes)
