"""What the benchmarks ran on: cores, CPU model, memory, MPI and library versions, load,
hypervisor steal.

Every figure in docs/benchmarks.md is written next to this description, because a timing
means nothing without the machine (and, on a shared machine, its load) behind it. Nothing
here initialises MPI: versions come from ``mpirun --version`` and package metadata.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The first ``model name`` in /proc/cpuinfo (or ``platform.processor()``)."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    if match:
        return match.group(1).strip()
    return platform.processor() or "unknown"


def memory_gib(meminfo: str | None = None) -> float | None:
    """Total memory in GiB from /proc/meminfo, or None when unknown."""
    text = _read("/proc/meminfo") if meminfo is None else meminfo
    match = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.MULTILINE)
    return round(int(match.group(1)) / (1 << 20), 1) if match else None


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS does not say."""
    try:
        return tuple(round(v, 2) for v in os.getloadavg())  # type: ignore[return-value]
    except OSError:
        return None


def steal_seconds(stat: str | None = None) -> float | None:
    """CPU seconds the hypervisor ran other guests while this machine's CPUs wanted to run
    (the ``steal`` column of /proc/stat's ``cpu`` line, all CPUs summed), or None where the
    kernel does not say. Its growth over a run tells a noisy neighbour on the physical host
    from a slow code path (docs/heterogeneity.md reads it next to each run)."""
    text = _read("/proc/stat") if stat is None else stat
    match = re.search(r"^cpu\s+(.+)$", text, re.MULTILINE)
    if not match:
        return None
    fields = match.group(1).split()
    if len(fields) < 8:
        return None
    try:
        ticks = int(fields[7])
        hz = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return None
    return ticks / hz


def open_mpi_version(mpirun: str = "mpirun") -> str:
    """``Open MPI 4.1.4`` from ``mpirun --version``, or a note saying why it is unknown."""
    if shutil.which(mpirun) is None:
        return "mpirun not found"
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    match = re.search(r"\(Open MPI\)\s*([\w.]+)", out)
    if match:
        return f"Open MPI {match.group(1)}"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def package_version(name: str) -> str:
    """An installed package's version, or ``not installed``."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def describe_machine() -> dict[str, Any]:
    """The machine description stored with every benchmark result."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        usable = os.cpu_count()
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": memory_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "mpi": open_mpi_version(),
        "mpi4py": package_version("mpi4py"),
        "numpy": package_version("numpy"),
        "dlcomm": package_version("dlcomm"),
        "load_average": load_average(),
    }


def format_machine(machine: dict[str, Any]) -> str:
    """One line for a report: ``2 cores (Intel Xeon ...), 24.0 GiB memory, ..., Open MPI 4.1.4``.

    The load average is left out: a report gives it per run, where it changes.
    """
    if not isinstance(machine, dict):
        raise TypeError(f"machine must be a dict from describe_machine(), got "
                        f"{type(machine).__name__}")
    return (f"{machine.get('cores')} cores ({machine.get('cpu_model')}), "
            f"{machine.get('memory_gib')} GiB memory, Linux {machine.get('kernel')}, "
            f"{machine.get('mpi')}, mpi4py {machine.get('mpi4py')}, "
            f"numpy {machine.get('numpy')}, Python {machine.get('python')}")
