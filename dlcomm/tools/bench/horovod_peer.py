"""Horovod as the peer of dlcomm's benchmarks: the recipe that builds it here, and a fusion run.

``python -m dlcomm.tools.bench.horovod_peer install-horovod [--version 0.28.1]`` builds Horovod from
its PyPI source distribution against the torch already installed (no build isolation, so pip
never pulls a second torch). Horovod 0.28.1's sdist does not build as shipped against torch
2.13: ``horovod/torch/CMakeLists.txt`` sets ``CMAKE_CXX_STANDARD 14`` while torch's headers
need C++17, and CMake's flag wins over ``CXXFLAGS``; the recipe raises that one line to 17.
Running it again with that version installed and working does nothing.

``dlcommrun -np 4 python -m dlcomm.tools.bench.horovod_peer fusion`` all-reduces the same N small
tensors (default 200 x 40 KB) through ``horovod.torch`` and ``dlcomm.torch`` in one job, both
as N async calls then ``synchronize`` (what tensor fusion serves) and as one call on the
concatenation (the limit fusion aims at), and prints the times and the ratios.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_VERSION = "0.28.1"
CXX_STANDARD = 17
TORCH_CMAKELISTS = Path("horovod") / "torch" / "CMakeLists.txt"
BUILD_ENV = {
    "HOROVOD_WITH_MPI": "1",
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "HOROVOD_WITHOUT_GLOO": "1",
}
# ``set(CMAKE_CXX_STANDARD <n>)`` with any spacing; group 1 is the number.
_STANDARD_LINE = re.compile(r"set\(\s*CMAKE_CXX_STANDARD\s+(\d+)\s*\)")
_VERSION = re.compile(r"\d+(\.\d+)*([a-z]+\d*)?")


class RecipeError(RuntimeError):
    """A step of the Horovod recipe failed; the message names the step and what to do."""


def _check_version(version: Any) -> str:
    if not isinstance(version, str):
        raise TypeError(f"version must be a str such as '0.28.1', got {type(version).__name__}")
    if not _VERSION.fullmatch(version):
        raise ValueError(f"version must look like '0.28.1', got {version!r}")
    return version


def patch_cxx_standard(cmakelists: str | os.PathLike, standard: int = CXX_STANDARD) -> bool:
    """Raise every ``set(CMAKE_CXX_STANDARD n)`` with n < ``standard`` in ``cmakelists``.

    Returns True when the file was changed, False when every such line already asks for
    ``standard`` or more. Raises ``RecipeError`` when the file has no such line: the sdist's
    layout changed and the recipe must be looked at again rather than silently skipped.
    """
    if isinstance(standard, bool) or not isinstance(standard, int):
        raise TypeError(f"standard must be an int such as 17, got {type(standard).__name__}")
    if standard < 11:
        raise ValueError(f"standard must be a C++ standard >= 11, got {standard}")
    path = Path(cmakelists)
    if not path.is_file():
        raise RecipeError(f"{path} does not exist: is this an unpacked Horovod source tree?")
    text = path.read_text()
    found = _STANDARD_LINE.findall(text)
    if not found:
        raise RecipeError(
            f"no 'set(CMAKE_CXX_STANDARD <n>)' line in {path}: this Horovod release's build "
            f"files differ from the ones the recipe knows (0.28.1); set the C++ standard to "
            f"{standard} by hand or update dlcomm/tools/bench/horovod_peer.py")

    def raise_line(match: re.Match[str]) -> str:
        if int(match.group(1)) >= standard:
            return match.group(0)
        return f"set(CMAKE_CXX_STANDARD {standard})"

    patched = _STANDARD_LINE.sub(raise_line, text)
    if patched == text:
        return False
    path.write_text(patched)
    return True


def installed_version(distribution: str = "horovod") -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    if not isinstance(distribution, str) or not distribution:
        raise ValueError(f"distribution must be a package name, got {distribution!r}")
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_build(python: str = sys.executable) -> str:
    """Import ``horovod.torch`` in a fresh interpreter and confirm it was built with MPI.

    Returns a one-line summary; raises ``RecipeError`` naming what is missing.
    """
    probe = ("import horovod, horovod.torch as h; "
             "print(horovod.__version__, h.mpi_built(), h.gloo_built())")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RecipeError("'import horovod.torch' failed; rebuild with "
                          "'python -m dlcomm.tools.bench.horovod_peer install-horovod --force':\n"
                          + done.stderr.strip()[-2000:])
    version, mpi, gloo = done.stdout.split()[-3:]
    if mpi != "True":
        raise RecipeError(f"horovod {version} was built without MPI; rebuild with "
                          f"HOROVOD_WITH_MPI=1 (install-horovod --force)")
    return f"horovod {version}: import horovod.torch ok, MPI built {mpi}, Gloo built {gloo}"


def _run_step(what: str, argv: Sequence[str], env: dict[str, str] | None = None,
              cwd: str | None = None) -> None:
    print(f"== {what}: {' '.join(argv)}", flush=True)
    done = subprocess.run(list(argv), env=env, cwd=cwd)
    if done.returncode != 0:
        raise RecipeError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}")


def install_horovod(version: str = DEFAULT_VERSION, *, force: bool = False,
                    python: str = sys.executable, jobs: int | None = None) -> str:
    """Build and install Horovod ``version`` from its sdist against the installed torch.

    Skips the build when that version is installed and imports with MPI (unless ``force``).
    ``jobs`` bounds the compiler's parallelism (default: this machine's cores). Returns the
    ``check_build`` summary.
    """
    version = _check_version(version)
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    if not force and installed_version() == version:
        try:
            summary = check_build(python)
        except RecipeError as exc:
            print(f"horovod {version} is installed but broken, rebuilding: {exc}", flush=True)
        else:
            print(f"already installed, nothing to do: {summary}", flush=True)
            return summary
    if installed_version("torch") is None:
        raise RecipeError("torch is not installed: install it first (make install); Horovod's "
                          "PyTorch extension is compiled against the installed torch")
    for tool in ("cmake", "mpicxx"):
        if shutil.which(tool) is None:
            raise RecipeError(f"{tool} is not on PATH: install cmake and Open MPI's development "
                              f"files (apt-get install cmake libopenmpi-dev)")
    with tempfile.TemporaryDirectory(prefix="dlcomm-horovod-") as tmp:
        _run_step("download the sdist", [
            python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--dest", tmp, f"horovod=={version}"])
        archives = sorted(Path(tmp).glob(f"horovod-{version}.tar.gz"))
        if not archives:
            raise RecipeError(f"pip downloaded no horovod-{version}.tar.gz into {tmp}")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")
        source = Path(tmp) / f"horovod-{version}"
        changed = patch_cxx_standard(source / TORCH_CMAKELISTS)
        print(f"== patch {TORCH_CMAKELISTS}: C++ standard "
              f"{'raised to' if changed else 'already'} {CXX_STANDARD}", flush=True)
        env = dict(os.environ, **BUILD_ENV)
        env.setdefault("MAKEFLAGS", f"-j{jobs or os.cpu_count() or 1}")
        # No build isolation: compile against the torch installed here, never a fresh one.
        _run_step("build and install", [
            python, "-m", "pip", "install", "--no-build-isolation", "--no-cache-dir",
            str(source)], env=env)
    summary = check_build(python)
    print(f"== installed: {summary}", flush=True)
    return summary


# --------------------------------------------------------------------------- fusion benchmark

FRAMEWORKS = ("horovod", "dlcomm")
ASYNC, CONCAT = "async", "concatenated"


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def fusion_inputs(tensors: int, tensor_bytes: int, rank: int) -> list[Any]:
    """Rank ``rank``'s ``tensors`` float32 tensors of ``tensor_bytes`` each: small integers
    (``(i + t) mod 4 + rank mod 3``) so every sum is exact."""
    import torch  # noqa: PLC0415 - optional dependency

    _check_positive("tensors", tensors)
    if _check_positive("tensor_bytes", tensor_bytes) < 4:
        raise ValueError(f"tensor_bytes must hold one float32 (>= 4), got {tensor_bytes}")
    count = tensor_bytes // 4
    base = torch.arange(count, dtype=torch.int64)
    return [((base + t) % 4 + rank % 3).to(torch.float32) for t in range(tensors)]


def fusion_reference(tensors: int, tensor_bytes: int, ranks: int) -> list[Any]:
    """The sum over ``ranks`` ranks of ``fusion_inputs``, computed without communication."""
    _check_positive("ranks", ranks)
    total = fusion_inputs(tensors, tensor_bytes, 0)
    for r in range(1, ranks):
        for acc, t in zip(total, fusion_inputs(tensors, tensor_bytes, r)):
            acc += t
    return total


def _fusion_runners(hvd: Any, prefix: str, inputs: list[Any]) -> dict[str, Callable[[], list]]:
    """The two ways of all-reducing ``inputs`` through the Horovod-style module ``hvd``."""
    import torch  # noqa: PLC0415 - optional dependency

    names = [f"{prefix}.fusion.{i}" for i in range(len(inputs))]
    sizes = [t.numel() for t in inputs]

    def run_async() -> list:
        handles = [hvd.allreduce_async(t, name=n, op=hvd.Sum) for t, n in zip(inputs, names)]
        return [hvd.synchronize(h) for h in handles]

    def run_concat() -> list:
        flat = hvd.allreduce(torch.cat(inputs), name=f"{prefix}.fusion.concat", op=hvd.Sum)
        return list(torch.split(flat, sizes))

    return {ASYNC: run_async, CONCAT: run_concat}


def _time_slowest(comm: Any, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn`` took on the slowest rank, starting from a barrier; and its result."""
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    comm.Barrier()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed, op=MPI.MAX), result


def run_fusion(tensors: int = 200, tensor_bytes: int = 40_000, warmup: int = 3,
               iters: int = 20, frameworks: Sequence[str] = FRAMEWORKS) -> dict[str, Any]:
    """Time each framework's async and concatenated all-reduce of the same tensors.

    Every rank must call it, under MPI. Frameworks run one after the other (each initialised,
    measured, shut down), so their background threads never compete. Each result is checked
    against ``fusion_reference``. Returns {framework: {way: [seconds per iteration]}} plus
    the settings; times are the slowest rank's.
    """
    import torch  # noqa: PLC0415 - optional dependency

    _check_positive("warmup", warmup)
    _check_positive("iters", iters)
    if isinstance(frameworks, str) or not frameworks:
        raise ValueError(f"frameworks must be a non-empty list from {FRAMEWORKS}")
    unknown = [f for f in frameworks if f not in FRAMEWORKS]
    if unknown:
        raise ValueError(f"unknown frameworks {unknown}; known: {', '.join(FRAMEWORKS)}")
    from mpi4py import MPI  # MPI is initialised here, before Horovod, so Horovod never finalises

    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    inputs = fusion_inputs(tensors, tensor_bytes, rank)
    expected = fusion_reference(tensors, tensor_bytes, size)
    out: dict[str, Any] = {"tensors": tensors, "tensor_bytes": tensor_bytes, "ranks": size,
                           "warmup": warmup, "iters": iters, "times": {}}
    for framework in frameworks:
        hvd = importlib.import_module("horovod.torch" if framework == "horovod"
                                      else "dlcomm.torch")
        hvd.init()
        runners = _fusion_runners(hvd, framework, inputs)
        times: dict[str, list[float]] = {way: [] for way in runners}
        for i in range(warmup + iters):
            for way, fn in runners.items():
                seconds, result = _time_slowest(comm, fn)
                if i == 0 and not all(torch.equal(r, e) for r, e in zip(result, expected)):
                    raise RuntimeError(f"{framework} {way} all-reduce gave a wrong sum")
                if i >= warmup:
                    times[way].append(seconds)
        out["times"][framework] = times
        hvd.shutdown()
    comm.Free()
    return out


def format_fusion(result: dict[str, Any]) -> str:
    """A table of median milliseconds and bus bandwidth, and dlcomm's time over Horovod's."""
    n, total = result["ranks"], result["tensors"] * result["tensor_bytes"]
    lines = [f"fusion: {result['tensors']} x {result['tensor_bytes']} B float32 all-reduce "
             f"(sum), {n} ranks, median of {result['iters']} (slowest rank)",
             f"{'framework':>10} {'way':>13} {'ms':>9} {'busbw GB/s':>11}"]
    medians: dict[tuple[str, str], float] = {}
    for framework, ways in result["times"].items():
        for way, times in ways.items():
            med = statistics.median(times)
            medians[framework, way] = med
            busbw = total / med * 2 * (n - 1) / n / 1e9
            lines.append(f"{framework:>10} {way:>13} {med * 1e3:9.2f} {busbw:11.3f}")
    for way in (ASYNC, CONCAT):
        if ("dlcomm", way) in medians and ("horovod", way) in medians:
            lines.append(f"dlcomm time / horovod time, {way}: "
                         f"{medians['dlcomm', way] / medians['horovod', way]:.3f}x")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``install-horovod`` or ``fusion``."""
    parser = argparse.ArgumentParser(prog="python -m dlcomm.tools.bench.horovod_peer",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    inst = sub.add_parser("install-horovod", help="build Horovod from its sdist (patched)")
    inst.add_argument("--version", default=DEFAULT_VERSION)
    inst.add_argument("--force", action="store_true", help="rebuild even when installed")
    inst.add_argument("--jobs", type=int, default=None, help="parallel compiler jobs")
    fus = sub.add_parser("fusion", help="N async all-reduces vs one call, Horovod and dlcomm "
                                        "(run under dlcommrun -np N)")
    fus.add_argument("--tensors", type=int, default=200)
    fus.add_argument("--tensor-bytes", type=int, default=40_000)
    fus.add_argument("--warmup", type=int, default=3)
    fus.add_argument("--iters", type=int, default=20)
    fus.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                     help="comma-separated, run in this order")
    fus.add_argument("--json", default=None, help="rank 0 writes the raw times here")
    args = parser.parse_args(argv)
    try:
        if args.command == "install-horovod":
            install_horovod(args.version, force=args.force, jobs=args.jobs)
            return 0
        result = run_fusion(args.tensors, args.tensor_bytes, args.warmup, args.iters,
                            [f.strip() for f in args.frameworks.split(",") if f.strip()])
    except (RecipeError, TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from mpi4py import MPI  # noqa: PLC0415 - MPI start-up: importing mpi4py.MPI initialises MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(format_fusion(result), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
