"""Samples per second of a model on synthetic data, per rank and in total, in the spirit of
Horovod's ``pytorch_synthetic_benchmark.py``.

    dlcommrun -np 4 python examples/torch_synthetic_benchmark.py --model mlp
    dlcommrun -np 4 python examples/torch_synthetic_benchmark.py --framework horovod,dlcomm

With several frameworks the same workload runs through each in one job, and the ratio
of dlcomm's throughput to each peer's is printed.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import timeit
from contextlib import nullcontext

import torch
import torch.nn.functional as F

MODELS = {
    # A communication-heavy model: ~6.3M parameters (25 MB of gradients per step).
    "mlp": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 1536), torch.nn.ReLU(),
        torch.nn.Linear(1536, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)),
    # A small CNN: more compute per byte of gradient.
    "cnn": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", default="dlcomm",
                   help="comma-separated: dlcomm, horovod (run in this order, same job)")
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--compression", default="none",
                   help="none, fp16, or a dlcomm compressor spec (dlcomm only)")
    p.add_argument("--fusion-threshold", default=None, help="bytes (dlcomm only; "
                   "for Horovod set HOROVOD_FUSION_THRESHOLD)")
    p.add_argument("--schedule", default=None,
                   help="wfbp, mgwfbp, dear or none (dlcomm only; default DLCOMM_SCHEDULE)")
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    return p.parse_args(argv)


def run(framework: str, args: argparse.Namespace) -> dict:
    """Train on synthetic data through ``framework``; return throughput figures (rank 0)."""
    hvd = importlib.import_module("dlcomm.torch" if framework == "dlcomm" else "horovod.torch")
    if framework == "dlcomm":
        hvd.init(fusion_threshold=args.fusion_threshold)
    else:
        hvd.init()
    torch.manual_seed(0)
    model = MODELS[args.model]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    if args.compression == "fp16":
        compression = hvd.Compression.fp16
    elif args.compression == "none":
        compression = hvd.Compression.none
    elif framework == "dlcomm":
        compression = hvd.Compression.lookup(args.compression)
    else:
        raise SystemExit(f"--compression {args.compression} is dlcomm-only")
    extra = {"schedule": args.schedule} if framework == "dlcomm" else {}
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   compression=compression, **extra)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    data = torch.randn(args.batch_size, 3, 32, 32)
    target = torch.randint(0, 10, (args.batch_size,))

    # dlcomm: forward/backward/step appear on the "(training)" row of DLCOMM_TIMELINE's trace,
    # next to each tensor's communication, so a plot shows what overlaps.
    mark = hvd.timeline_range if framework == "dlcomm" else (lambda name: nullcontext())

    def step() -> None:
        opt.zero_grad()
        with mark("forward"):
            loss = F.cross_entropy(model(data), target)
        with mark("backward"):
            loss.backward()
        with mark("step"):
            opt.step()

    timeit.timeit(step, number=args.num_warmup_batches)
    rates = []
    for _ in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / t)
    if hasattr(opt, "flush"):  # schedule=dear: apply the last step's updates
        opt.flush()
    per_rank = statistics.median(rates)
    total = hvd.allreduce(torch.tensor([per_rank]), name=f"{framework}.rate", op=hvd.Sum).item()
    result = {"framework": framework, "model": args.model, "ranks": hvd.size(),
              "batch_size": args.batch_size, "compression": args.compression,
              "schedule": args.schedule,
              "per_rank_samples_per_s": per_rank, "total_samples_per_s": total,
              "parameters": sum(p.numel() for p in model.parameters())}
    is_root = hvd.rank() == 0
    hvd.shutdown()
    return result if is_root else {}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    # MPI is initialised by mpi4py before any framework, so Horovod (which finalises MPI at
    # shutdown only when it initialised it) leaves MPI usable for the next framework.
    from mpi4py import MPI  # noqa: F401
    results = [run(f.strip(), args) for f in args.framework.split(",") if f.strip()]
    if not results[0]:
        return
    print(f"model {args.model} ({results[0]['parameters'] / 1e6:.1f}M parameters), batch "
          f"{args.batch_size} per rank, {results[0]['ranks']} ranks, compression "
          f"{args.compression}")
    for r in results:
        print(f"{r['framework']:>8}: {r['per_rank_samples_per_s']:8.1f} samples/s per rank, "
              f"{r['total_samples_per_s']:8.1f} total")
    ours = next((r for r in results if r["framework"] == "dlcomm"), None)
    for peer in results:
        if ours is not None and peer is not ours:
            print(f"dlcomm / {peer['framework']}: "
                  f"{ours['total_samples_per_s'] / peer['total_samples_per_s']:.3f}x")
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
