"""Samples per second of a model on synthetic data, per rank and in total, in the spirit of
Horovod's ``pytorch_synthetic_benchmark.py``.

    dlcommrun -np 4 python examples/torch_synthetic_benchmark.py --model mlp
    dlcommrun -np 4 python examples/torch_synthetic_benchmark.py --framework ddp,dlcomm
    dlcommrun -np 4 python examples/torch_synthetic_benchmark.py --framework horovod,dlcomm

``ddp`` is torch's DistributedDataParallel over gloo, the peer every training figure is a
ratio against, with ``fp16_compress_hook`` for ``--compression fp16`` and ``powerSGD_hook``
for ``--compression powersgd:rank=R``. Every framework trains the same model from the same
initial weights on the same per-rank batches with the same SGD settings, so the final loss
(averaged over ranks) must agree; it is printed with the throughput. With several frameworks
the same workload runs through each in one job, and the ratio of dlcomm's throughput to each
peer's is printed (``dlcomm bench train`` runs them as separate, alternating jobs instead).
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time
import timeit
from contextlib import nullcontext

import torch
import torch.nn.functional as F

FRAMEWORKS = ("dlcomm", "ddp", "horovod")
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
    # ~100k parameters: for tests of the plumbing, not for figures.
    "tiny": lambda: torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 10)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", default="dlcomm",
                   help=f"comma-separated: {', '.join(FRAMEWORKS)} (run in this order, same job)")
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the rank count")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--compression", default="none",
                   help="none, fp16, or a dlcomm compressor spec (DDP: none, fp16 and "
                   "powersgd:rank=R; Horovod: none and fp16)")
    p.add_argument("--fusion-threshold", default=None, help="bytes (dlcomm only; "
                   "for Horovod set HOROVOD_FUSION_THRESHOLD)")
    p.add_argument("--schedule", default=None,
                   help="wfbp, mgwfbp, dear or none (dlcomm only; default DLCOMM_SCHEDULE)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP's bucket size (default: DDP's 25 MB; one bucket for PowerSGD)")
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    args = p.parse_args(argv)
    names = [f.strip() for f in args.framework.split(",") if f.strip()]
    unknown = sorted(set(names) - set(FRAMEWORKS))
    if not names or unknown:
        p.error(f"--framework: unknown {unknown or 'empty list'}; choose from "
                f"{', '.join(FRAMEWORKS)}")
    args.frameworks = names
    for name in ("batch_size", "num_batches_per_iter", "num_iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_warmup_batches < 0:
        p.error("--num-warmup-batches must be >= 0")
    return args


class _Framework:
    """What the training loop needs from one framework: rank, size, the wrapped model and
    optimizer, a timeline mark, an average over ranks, and shutdown."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.flush = None
        if name == "ddp":
            # The peer's rendezvous and hooks live with the benchmarks (dlcomm.tools).
            from dlcomm.tools.bench import ddp_peer

            self.rank, self.size = ddp_peer.start_process_group()
            self._model = _seeded_model(args.model)
            self.model = ddp_peer.wrap_model(self._model, args.compression, args.bucket_cap_mb)
            self.optimizer = _sgd(self._model, args, self.size)
            self.mark = lambda name: nullcontext()
            return
        hvd = importlib.import_module("dlcomm.torch" if name == "dlcomm" else "horovod.torch")
        self.hvd = hvd
        if name == "dlcomm":
            hvd.init(fusion_threshold=args.fusion_threshold)
        else:
            hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self._model = self.model = _seeded_model(args.model)
        if args.compression == "fp16":
            compression = hvd.Compression.fp16
        elif args.compression == "none":
            compression = hvd.Compression.none
        elif name == "dlcomm":
            compression = hvd.Compression.lookup(args.compression)
        else:
            raise SystemExit(f"--compression {args.compression} is not available in {name}")
        extra = {"schedule": args.schedule} if name == "dlcomm" else {}
        self.optimizer = hvd.DistributedOptimizer(
            _sgd(self.model, args, self.size), named_parameters=self.model.named_parameters(),
            compression=compression, **extra)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        # dlcomm: forward/backward/step appear on the "(training)" row of DLCOMM_TIMELINE's
        # trace, next to each tensor's communication, so a plot shows what overlaps.
        self.mark = hvd.timeline_range if name == "dlcomm" else (lambda name: nullcontext())
        self.flush = getattr(self.optimizer, "flush", None)  # schedule=dear

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self._model.parameters())

    def sum_over_ranks(self, value: float) -> float:
        if self.name == "ddp":
            import torch.distributed as dist

            t = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(t)
            return float(t.item())
        return float(self.hvd.allreduce(torch.tensor([value], dtype=torch.float64),
                                        name=f"{self.name}.sum", op=self.hvd.Sum).item())

    def shutdown(self) -> None:
        if self.name == "ddp":
            from dlcomm.tools.bench import ddp_peer

            self.model = self.optimizer = None  # the DDP wrapper holds the process group
            ddp_peer.stop_process_group()
        else:
            self.hvd.shutdown()


def _seeded_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights in every framework and on every rank
    return MODELS[name]()


def _sgd(model: torch.nn.Module, args: argparse.Namespace, size: int) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)


def synthetic_batch(batch_size: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch: its own images and labels (the same in every framework)."""
    gen = torch.Generator().manual_seed(1000 + rank)
    data = torch.randn(batch_size, 3, 32, 32, generator=gen)
    target = torch.randint(0, 10, (batch_size,), generator=gen)
    return data, target


def run(framework: str, args: argparse.Namespace) -> dict:
    """Train on synthetic data through ``framework``; return throughput figures (rank 0)."""
    fw = _Framework(framework, args)
    data, target = synthetic_batch(args.batch_size, fw.rank)
    last_loss = [float("nan")]

    def step() -> None:
        fw.optimizer.zero_grad()
        with fw.mark("forward"):
            loss = F.cross_entropy(fw.model(data), target)
        with fw.mark("backward"):
            loss.backward()
        with fw.mark("step"):
            fw.optimizer.step()
        last_loss[0] = loss.item()

    timeit.timeit(step, number=args.num_warmup_batches)
    rates = []
    process_cpu, main_cpu = time.process_time(), time.thread_time()
    for _ in range(args.num_iters):
        t = timeit.timeit(step, number=args.num_batches_per_iter)
        rates.append(args.batch_size * args.num_batches_per_iter / t)
    # CPU time per iteration of this rank's training thread and of its other threads (the
    # communication engine's): where ranks share cores, their sum bounds the speed.
    main_ms = (time.thread_time() - main_cpu) * 1e3 / args.num_iters
    other_ms = (time.process_time() - process_cpu) * 1e3 / args.num_iters - main_ms
    if fw.flush is not None:  # schedule=dear: apply the last step's updates
        fw.flush()
    per_rank = statistics.median(rates)
    total = fw.sum_over_ranks(per_rank)
    loss = fw.sum_over_ranks(last_loss[0]) / fw.size
    steps = args.num_warmup_batches + args.num_iters * args.num_batches_per_iter
    result = {"framework": framework, "model": args.model, "ranks": fw.size,
              "batch_size": args.batch_size, "compression": args.compression,
              "schedule": args.schedule if framework == "dlcomm" else None,
              "per_rank_samples_per_s": per_rank, "total_samples_per_s": total,
              "ms_per_iteration": 1e3 * args.batch_size / per_rank,
              "steps": steps, "final_loss": loss, "lr": args.lr * fw.size,
              "momentum": args.momentum, "parameters": fw.parameters,
              "iteration_ms": [1e3 * args.batch_size * args.num_batches_per_iter / r
                               for r in rates],  # this rank's (rank 0's in the JSON)
              "cpu_ms_per_iteration": {  # means over ranks
                  "main_thread": fw.sum_over_ranks(main_ms) / fw.size,
                  "other_threads": fw.sum_over_ranks(other_ms) / fw.size}}
    is_root = fw.rank == 0
    fw.shutdown()
    return result if is_root else {}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    # MPI is initialised by mpi4py before any framework, so Horovod (which finalises MPI at
    # shutdown only when it initialised it) leaves MPI usable for the next framework.
    from mpi4py import MPI  # noqa: F401
    results = [run(f, args) for f in args.frameworks]
    if not results[0]:
        return
    print(f"model {args.model} ({results[0]['parameters'] / 1e6:.1f}M parameters), batch "
          f"{args.batch_size} per rank, {results[0]['ranks']} ranks, compression "
          f"{args.compression}")
    for r in results:
        print(f"{r['framework']:>8}: {r['per_rank_samples_per_s']:8.1f} samples/s per rank, "
              f"{r['total_samples_per_s']:8.1f} total, final loss {r['final_loss']:.6f}")
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
