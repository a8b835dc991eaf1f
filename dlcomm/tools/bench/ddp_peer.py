"""torch ``DistributedDataParallel`` as the peer of dlcomm's torch adapter in training benchmarks.

DESIGN.md names DDP (gloo on CPU, NCCL on GPU) the peer of every training figure, with its
communication hooks as the peers of dlcomm's compressors: ``fp16_compress_hook`` for
``fp16``, ``powerSGD_hook`` for ``powersgd:rank=R``. A job started by ``dlcommrun`` has no
torch.distributed rendezvous of its own, so ``start_process_group`` takes rank and size from
Open MPI's environment, lets rank 0 pick a free TCP port and hands it to the others over
MPI (so that concurrent jobs never collide on a fixed port), and meets at rank 0's host:
127.0.0.1 on one machine, ``dlc-h0`` over the emulated interface under ``--emulate``.
"""
from __future__ import annotations

import os
import socket
from typing import Any

from dlcomm.compression.registry import parse_spec

EMULATED_INTERFACE = "dlc-eth0"  # the interface dlcomm.tools.emulation gives every host
EMULATED_MASTER = "dlc-h0"  # emulated host 0's name in every host's /etc/hosts
# DDP hooks for dlcomm compressor names; a compressor missing here has no DDP peer.
HOOKS = {"none": "allreduce (no hook)", "fp16": "fp16_compress_hook",
         "powersgd": "powerSGD_hook"}
# PowerSGD's plain all-reduce iterations before compression starts: the fewest DDP allows
# with error feedback and warm start (both on, as in dlcomm's powersgd).
POWERSGD_START_ITER = 2
# PowerSGD state of a bucket is kept per bucket index; one bucket (DDP's default 25 MB
# buckets aborted on gloo in issue 19's measurement) keeps every layer in one exchange.
POWERSGD_BUCKET_CAP_MB = 1024.0


def ddp_hook_name(compression: str) -> str | None:
    """The DDP hook that is the peer of dlcomm's ``compression`` spec, or None when DDP has
    none (top-k, ACP-SGD, ...). A payload cast (``+fp16``) has no DDP peer either."""
    name, _params, cast = parse_spec(compression)
    if cast is not None:
        return None
    return HOOKS.get(name)


def mpi_rank_size() -> tuple[int, int]:
    """Rank and size from Open MPI's environment (PMIx's rank name as a fallback); (0, 1)
    outside a job."""
    size = os.environ.get("OMPI_COMM_WORLD_SIZE")
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK"))
    if size is None or rank is None:
        return 0, 1
    return int(rank), int(size)


def rendezvous_host(emulated: bool | None = None) -> tuple[str, str]:
    """(rank 0's address, the interface gloo should use): the loopback on one machine, the
    emulated network under ``--emulate`` (``DLCOMM_EMULATE`` set by dlcommrun)."""
    if emulated is None:
        emulated = bool(os.environ.get("DLCOMM_EMULATE"))
    return (EMULATED_MASTER, EMULATED_INTERFACE) if emulated else ("127.0.0.1", "lo")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((socket.gethostbyname(host), 0))
        return int(s.getsockname()[1])


def start_process_group(timeout_s: float = 300.0) -> tuple[int, int]:
    """Initialise torch.distributed over gloo for this MPI job; returns (rank, size).

    Collective over the job's ranks (one MPI broadcast of rank 0's free port)."""
    import datetime  # noqa: PLC0415 - only DDP jobs need it

    import torch.distributed as dist  # noqa: PLC0415 - torch is optional for the tools
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    rank, size = mpi_rank_size()
    host, interface = rendezvous_host()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    port = MPI.COMM_WORLD.bcast(_free_port(host) if rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{host}:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
    return rank, size


def stop_process_group() -> None:
    """Tear torch.distributed down on every rank at the same point.

    Drop every DDP model first: its reducer holds the process group, and gloo's destructor
    waits for queued work. Destroyed later, after the other ranks had moved on to MPI's
    finalize, it left rank 0 waiting for good (seen on ``--emulate 4x1gbit``)."""
    import gc  # noqa: PLC0415 - only DDP jobs need it

    import torch.distributed as dist  # noqa: PLC0415 - torch is optional for the tools

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def wrap_model(model: Any, compression: str, bucket_cap_mb: float | None = None) -> Any:
    """``model`` in DDP with the hook that is the peer of ``compression`` registered.

    ``bucket_cap_mb`` None keeps DDP's default buckets (25 MB), except for PowerSGD, which
    gets one bucket (``POWERSGD_BUCKET_CAP_MB``). ValueError when DDP has no peer."""
    import torch  # noqa: PLC0415 - torch is optional for the tools
    from torch.distributed.algorithms.ddp_comm_hooks import (  # noqa: PLC0415 - as above
        default_hooks,
        powerSGD_hook,
    )

    hook_name = ddp_hook_name(compression)
    if hook_name is None:
        raise ValueError(f"DDP has no communication hook that matches {compression!r}; "
                         f"peers exist for {', '.join(HOOKS)}")
    name, params, _cast = parse_spec(compression)
    if bucket_cap_mb is None and name == "powersgd":
        bucket_cap_mb = POWERSGD_BUCKET_CAP_MB
    extra = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = torch.nn.parallel.DistributedDataParallel(model, **extra)
    if name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "powersgd":
        # dlcomm's start_iter, where given, is DDP's start_powerSGD_iter (never below the
        # fewest DDP allows); error feedback as the spec says (DDP's has no momentum
        # correction: compare with dlcomm's mc=0)
        start = max(POWERSGD_START_ITER, int(params.get("start_iter", POWERSGD_START_ITER)))
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(params.get("rank", 4)),
            start_powerSGD_iter=start, use_error_feedback=bool(params.get("ef", True)),
            warm_start=True, random_seed=int(params.get("seed", 0)))
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp
