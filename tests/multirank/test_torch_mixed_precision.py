"""Mixed precision on real ranks: bfloat16 autocast with torch's GradScaler (Horovod's recipe)
and with dlcomm's LossScaler; one rank's gradient is made non-finite at two steps and every
rank must skip exactly those steps, keep the same scale and end with identical parameters."""

import pytest
from mpi_run import run_mpi
from shared_job import read_rank_results

torch = pytest.importorskip("torch")

SCRIPT = r'''
import json, sys, traceback
import torch
import dlcomm.torch as hvd

modes, out = sys.argv[1].split(","), sys.argv[2]
hvd.init()
r, n = hvd.rank(), hvd.size()


def run(mode):
  torch.manual_seed(1)
  # the first weight (1240 elements) is above the compressors' bypass size, so topk compresses it
  model = torch.nn.Sequential(torch.nn.Linear(40, 31), torch.nn.ReLU(), torch.nn.Linear(31, 3))
  compression = hvd.Compression.none
  if mode == "topk_separate":
      compression = hvd.Compression.lookup("topk:ratio=0.3")  # error feedback: reset on skip
  elif mode == "fp16_fused":
      compression = hvd.Compression.fp16
  opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                 named_parameters=model.named_parameters(),
                                 compression=compression)
  inject = {2: 1 % n, 5: n - 1}  # step -> the one rank whose gradient overflows
  if mode == "gradscaler":
      scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
  else:
      flag = mode.split("_")[1]
      scaler = hvd.LossScaler(opt, loss_scale_init=1024.0, loss_scale_growth_interval=3,
                              loss_scale_flag=flag)
      assert scaler.fused == (flag in ("fused", "auto"))  # auto: no compressor, so fused
  stepped, scales = [], []
  for step in range(8):
      g = torch.Generator().manual_seed(100 * step + r)
      x = torch.randn(3 + 2 * r, 40, generator=g)  # uneven local batches
      y = torch.randint(0, 3, (3 + 2 * r,), generator=g)
      before = [p.detach().clone() for p in model.parameters()]
      with torch.autocast("cpu", dtype=torch.bfloat16):
          logits = model(x)
          assert logits.dtype == torch.bfloat16
          loss = torch.nn.functional.cross_entropy(logits.float(), y)
      if inject.get(step) == r:
          loss = loss * float("inf")  # this rank's gradients become inf/NaN
      if mode == "gradscaler":
          scaler.scale(loss).backward()
          opt.synchronize()
          scaler.unscale_(opt)
          with opt.skip_synchronize():
              scaler.step(opt)
          scaler.update()
          scale = scaler.get_scale()
      else:
          scaler.scale(loss).backward()
          scaler.step()
          scale = scaler.loss_scale
      opt.zero_grad()
      stepped.append(any(not torch.equal(b, p) for b, p in zip(before, model.parameters())))
      scales.append(scale)
  flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
  assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights
  with open(f"{out}/rank{r}_{mode}.json", "w") as f:
      json.dump({"stepped": stepped, "scales": scales, "params": flat.tolist()}, f)

# One job per rank count runs its modes in turn (a fresh model and optimizer each): one
# start-up of MPI and torch instead of one per mode. A mode's error is written to its result
# file, and the next modes still run.
for mode in modes:
  try:
      run(mode)
  except Exception:
      with open(f"{out}/rank{r}_{mode}.json", "w") as f:
          json.dump({"error": traceback.format_exc()}, f)
'''

EXPECTED_STEPPED = [True, True, False, True, True, False, True, True]


MODES_BY_RANKS = {2: ["gradscaler", "fp16_fused", "dlcomm_auto"],
                  3: ["gradscaler", "dlcomm_fused"], 4: ["dlcomm_separate"],
                  5: ["topk_separate"]}


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    """One job per rank count; returns (ranks, folder of its per-rank, per-mode results)."""
    np_ = request.param
    out = tmp_path_factory.mktemp(f"amp{np_}")
    run_mpi(np_, SCRIPT, out, timeout=300, args=[",".join(MODES_BY_RANKS[np_]), str(out)])
    return np_, out


@pytest.mark.parametrize("job,mode", [(n, m) for n, ms in MODES_BY_RANKS.items() for m in ms],
                         indirect=["job"], scope="module")
def test_one_rank_overflows_every_rank_skips(job, mode):
    np_, out = job
    results = read_rank_results(out, np_, mode, lambda m, r: f"rank{r}_{m}.json")
    for r, res in enumerate(results):
        assert res["stepped"] == EXPECTED_STEPPED, (r, res["stepped"])
        assert res["scales"] == results[0]["scales"], r
        assert res["params"] == results[0]["params"], f"rank {r} parameters differ from rank 0"
    scales = results[0]["scales"]
    # backoff at each skipped step, growth after 3 clean steps
    assert scales[2] == 512.0 and scales[5] < scales[4], scales
    assert all(v == v and abs(v) < float("inf") for v in results[0]["params"])
