"""Compression state in torch checkpoints (issue 27 item 1): a run stopped after 4 steps and
resumed in a new process from ``optimizer.state_dict()`` (saved with ``torch.save``, loaded
with ``torch.load(weights_only=True)``) ends with exactly the parameters of the run that went
through all 8 steps, for every compressor with state, also after
``broadcast_optimizer_state`` (each rank keeps its own residuals); resuming from the same
checkpoint without the compression state does not (so the test can fail)."""
from __future__ import annotations

import pytest
from checkpoint_phases import assert_resume_equals_full, run_phases

SPECS = ["none", "topk:ratio=0.1", "powersgd:rank=2", "acpsgd:rank=2", "efsignsgd",
         "randomk:ratio=0.1,ef=1", "gtopk:ratio=0.1", "powersgd:rank=2,mc=0,start_iter=5"]
RANKS = 3

# --- every schedule (issue 27 item 1): DeAR flushes its pending updates into the checkpoint
# (also when the model is saved first, through the module's state_dict), MG-WFBP carries its
# step count, profile, cost model and merge plan under "dlcomm_schedule". DeAR sends
# uncompressed gradients, so it runs with "none"; the others with topk and powersgd. A plan
# that does not fit the model, or another schedule's state, raises ValueError.
SCHEDULE_CONFIGS = [("wfbp", "topk:ratio=0.1"), ("none", "topk:ratio=0.1"),
                    ("none", "powersgd:rank=2"), ("mgwfbp", "topk:ratio=0.1"),
                    ("mgwfbp", "powersgd:rank=2"), ("dear", "none")]

SCRIPT = r'''
import sys
import warnings
import numpy as np
import torch
import torch.nn.functional as F
import dlcomm.torch as hvd
from dlcomm.torch.compression_state import COMPRESSION_STATE_KEY, SCHEDULE_STATE_KEY
from dlcomm.torch.schedules import cost_model, mgwfbp

phase, out_dir = sys.argv[1], sys.argv[2]
specs, configs = (part.split(";") for part in sys.argv[3].split("|"))
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.load_state_dict(saved["optimizer"])
        # Horovod's pattern after loading: every rank keeps its own compression state.
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        first = 4
    for step in range(first, 8):
        idx = slice(8 * step % 64, 8 * step % 64 + 8)
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
        if phase == "full" and step == 3:  # the checkpoint, on the way
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(f"{out_dir}/{phase}_{tag}_{r}.npy", flat)

# --- every schedule
# MG-WFBP's plan follows measured times; a start-up cost of 1 s merges every gradient into
# one message whatever the timings, so the uninterrupted run and the resumed one plan alike.
mgwfbp.agreed_alpha_beta = lambda **kwargs: cost_model.AlphaBeta(1.0, 0.0)

for config in configs:
    schedule, spec = config.split("/")
    tag = config.replace(":", "_").replace("=", "_").replace(",", "_").replace("/", "_")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 72), torch.nn.ReLU(), torch.nn.Linear(72, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=spec, schedule=schedule)
    first = 0
    if phase in ("resume", "resume_plain"):
        model.load_state_dict(torch.load(f"{out_dir}/model_{tag}_{r}.pt", weights_only=True))
        saved = torch.load(f"{out_dir}/opt_{tag}_{r}.pt", weights_only=True)
        if phase == "resume_plain":
            saved.pop(SCHEDULE_STATE_KEY, None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt.load_state_dict(saved)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        first = 4
    for step in range(first, 8):
        idx = slice(8 * step % 64, 8 * step % 64 + 8)
        opt.zero_grad()
        F.cross_entropy(model(X[idx]), Y[idx]).backward()
        opt.step()
        if phase == "full" and step == 3:  # the checkpoint, on the way
            # The model first, in a file of its own: DeAR's pending updates must be in it.
            torch.save(model.state_dict(), f"{out_dir}/model_{tag}_{r}.pt")
            torch.save(opt.state_dict(), f"{out_dir}/opt_{tag}_{r}.pt")
    if schedule == "dear":
        opt.flush()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.save(f"{out_dir}/{phase}_{tag}_{r}.npy", flat)
if phase == "resume":  # a plan that does not fit the model, or another schedule's, is refused
    saved = torch.load(f"{out_dir}/opt_mgwfbp_topk_ratio_0.1_{r}.pt", weights_only=True)
    model = torch.nn.Sequential(torch.nn.Linear(24, 72), torch.nn.ReLU(), torch.nn.Linear(72, 5))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), schedule="mgwfbp")
    for bad, match in ((dict(saved[SCHEDULE_STATE_KEY], merge_plan=[["0.weight"]]), "exactly once"),
                       (dict(saved[SCHEDULE_STATE_KEY], schedule="dear"), "'dear'"),
                       (dict(saved[SCHEDULE_STATE_KEY], merge_plan=[["fc9.weight"]]), "fc9")):
        try:
            opt.load_state_dict({"state": {}, "param_groups": saved["param_groups"],
                                 SCHEDULE_STATE_KEY: bad})
        except ValueError as exc:
            assert match in str(exc), exc
        else:
            raise AssertionError(f"{bad} was accepted")
    print("REFUSED", flush=True)
print("OK", flush=True)
'''


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    """The three phases, each one job for every compressor and every schedule (start-up, 3x
    `import torch` on the CI's 2 cores, is most of a job's time). Every case already shared
    its phase's processes with the others of its kind; the resume phases are still jobs of
    their own, never the processes that wrote the checkpoints. Returns (folder, jobs)."""
    out = tmp_path_factory.mktemp("torch_ckpt")
    configs = ";".join(f"{s}/{c}" for s, c in SCHEDULE_CONFIGS)
    return out, run_phases(RANKS, SCRIPT, out, ";".join(SPECS) + "|" + configs, timeout=400)


def test_resume_from_checkpoint_equals_the_uninterrupted_run(phases):
    tmp_path, _ = phases
    for spec in SPECS:
        tag = spec.replace(":", "_").replace("=", "_").replace(",", "_")
        # without its state a compressor takes another path; "none" has no state
        assert_resume_equals_full(tmp_path, RANKS, tag, spec,
                                  state_matters=True if spec != "none" else None)


def test_every_schedule_resumes_from_checkpoint_as_the_uninterrupted_run(phases):
    tmp_path, jobs = phases
    resume = jobs["resume"]
    assert resume.count_per_rank("REFUSED") == [1] * RANKS, resume.report()
    for schedule, spec in SCHEDULE_CONFIGS:
        config = f"{schedule}/{spec}"
        tag = config.replace(":", "_").replace("=", "_").replace(",", "_").replace("/", "_")
        # MG-WFBP without its plan profiles afresh (per-parameter messages for 3 steps);
        # nothing else is in a schedule's state
        assert_resume_equals_full(tmp_path, RANKS, tag, config,
                                  state_matters=schedule == "mgwfbp")
