"""Reports which frameworks and communication backends this dlcomm installation can use.

``dlcommrun --check-build`` prints the report, Horovod style, with ``[X]`` / ``[ ]`` marks.
Each probe imports its package in a child interpreter, so a missing or broken framework
(an ``ImportError``, or even a crash inside a native extension) shows up as an unmarked
line instead of taking the launcher down, and MPI is never initialised in the launcher.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass

PROBE_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class BuildItem:
    """One line of the report: ``section`` / ``name`` is ``available``, with a short detail."""

    section: str
    name: str
    available: bool
    detail: str


# Each probe prints one JSON line {"detail": ...} on success; any failure is reported as
# the last line of its error output. Probes must not initialise MPI or touch a GPU context
# beyond counting devices.
_PROBES: tuple[tuple[str, str, str], ...] = (
    ("Frameworks", "PyTorch", "import torch; detail = 'torch ' + torch.__version__"),
    (
        "Frameworks",
        "TensorFlow",
        "import tensorflow as tf; detail = 'tensorflow ' + tf.__version__",
    ),
    ("Frameworks", "MXNet", "import mxnet as mx; detail = 'mxnet ' + mx.__version__"),
    (
        "Backends",
        "MPI",
        (
            "import mpi4py\n"
            "mpi4py.rc.initialize = False\n"
            "mpi4py.rc.finalize = False\n"
            "from mpi4py import MPI\n"
            "lib = MPI.Get_library_version().strip().splitlines()[0].split(',')[0]\n"
            "detail = 'mpi4py ' + mpi4py.__version__ + ', ' + lib"
        ),
    ),
    (
        "Backends",
        "NCCL",
        (
            "import cupy\n"
            "from cupy.cuda import nccl\n"
            "v = nccl.get_version()\n"
            "gpus = cupy.cuda.runtime.getDeviceCount()\n"
            "detail = ('cupy ' + cupy.__version__ + ', NCCL ' + '%d.%d.%d' % "
            "(v // 10000, v % 10000 // 100, v % 100) + ', %d GPU(s)' % gpus)"
        ),
    ),
)

_PROBE_WRAPPER = """
import json
{body}
print(json.dumps({{"detail": detail}}))
"""


def _start_probe(body: str, python: str) -> subprocess.Popen | str:
    """Start one probe in a child interpreter; return the process, or why it could not start."""
    try:
        return subprocess.Popen(
            [python, "-c", _PROBE_WRAPPER.format(body=body)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    except OSError as exc:
        return f"cannot start {python}: {exc}"


def _finish_probe(proc: subprocess.Popen | str) -> tuple[bool, str]:
    """Wait for a probe; return (available, detail or the reason it is unavailable)."""
    if isinstance(proc, str):
        return False, proc
    try:
        stdout, stderr = proc.communicate(timeout=PROBE_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False, f"import did not finish within {PROBE_TIMEOUT_SECONDS:.0f}s"
    if proc.returncode == 0:
        for line in reversed(stdout.strip().splitlines()):
            try:
                return True, str(json.loads(line)["detail"])
            except (ValueError, KeyError, TypeError):
                continue
        return False, "probe printed no result"
    if proc.returncode < 0:
        return False, f"import crashed (signal {-proc.returncode})"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    reason = lines[-1].strip() if lines else f"exit code {proc.returncode}"
    if reason.startswith("ModuleNotFoundError"):
        reason = reason.replace("ModuleNotFoundError: ", "") + " (not installed)"
    return False, reason


def _mpirun_item(mpirun: str) -> BuildItem:
    """The launcher line: where ``mpirun`` is and which MPI it belongs to."""
    path = shutil.which(mpirun)
    if path is None:
        return BuildItem(
            "Launcher", "mpirun", False, "not found on PATH; install Open MPI: make install"
        )
    try:
        proc = subprocess.run(
            [path, "--version"], check=False, capture_output=True, text=True, timeout=30
        )
        first = (proc.stdout.strip().splitlines() or ["version unknown"])[0]
    except (OSError, subprocess.TimeoutExpired) as exc:
        first = f"version unknown ({exc})"
    return BuildItem("Launcher", "mpirun", True, f"{path}: {first}")


def check_build(python: str | None = None, mpirun: str = "mpirun") -> list[BuildItem]:
    """Probe frameworks, backends and the launcher; return one item per line of the report.

    ``python`` is the interpreter the ranks will run (default: this one).
    """
    if python is not None and not isinstance(python, str):
        raise TypeError(f"python must be a path to an interpreter, got {python!r}")
    if not isinstance(mpirun, str) or not mpirun:
        raise ValueError(f"mpirun must be an executable name or path, got {mpirun!r}")
    python = python or sys.executable
    # Probes run side by side: each one mostly waits on imports.
    started = [(section, name, _start_probe(body, python)) for section, name, body in _PROBES]
    items = []
    for section, name, proc in started:
        ok, detail = _finish_probe(proc)
        items.append(BuildItem(section, name, ok, detail))
    items.append(_mpirun_item(mpirun))
    return items


def format_check_build(items: list[BuildItem], version: str = "") -> str:
    """Render the items as the ``--check-build`` report (sections in first-seen order)."""
    if not isinstance(items, list) or not all(isinstance(i, BuildItem) for i in items):
        raise TypeError("items must be a list of BuildItem (from check_build())")
    header = f"dlcomm {version}:" if version else "dlcomm:"
    lines = [header]
    width = max((len(i.name) for i in items), default=0) + 2
    section = None
    for item in items:
        if item.section != section:
            section = item.section
            lines += ["", f"Available {section}:"]
        mark = "[X]" if item.available else "[ ]"
        lines.append(f"    {mark} {item.name:<{width}}{item.detail}")
    return "\n".join(lines) + "\n"
