"""Start a Python test script on N real MPI ranks from pytest, under a hard timeout.

Multi-rank tests write their per-rank body as a script and call ``run_mpi``; a hang
becomes a test failure that shows each rank's output instead of a stuck CI run.

Each rank's stdout and stderr go to files of their own (mpirun's ``--output-filename``),
never to one shared stream: several ranks printing at once interleave their writes in a
shared stream (``'nativenative True kernel used  True'``), so a test that searched it
would fail by chance. ``run_mpi`` returns the ranks' texts separately, in rank order, as
``rank_stdout`` and ``rank_stderr``; ``stdout``/``stderr`` hold only mpirun's own messages.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlcomm.launcher.mpirun_command import build_mpirun_command, mpirun_available

REPO = Path(__file__).resolve().parents[1]
_runs = itertools.count()


class MPIRun(subprocess.CompletedProcess):
    """A finished mpirun: exit code, mpirun's own output, and every rank's output."""

    def __init__(self, proc: subprocess.CompletedProcess, rank_stdout: list[str],
                 rank_stderr: list[str]) -> None:
        super().__init__(proc.args, proc.returncode, proc.stdout, proc.stderr)
        self.rank_stdout = rank_stdout
        self.rank_stderr = rank_stderr

    def count_per_rank(self, text: str) -> list[int]:
        """How often each rank printed ``text`` on stdout, in rank order."""
        return [out.count(text) for out in self.rank_stdout]

    def report(self) -> str:
        """Every rank's stdout and stderr, labelled, then mpirun's own (for failure messages)."""
        return format_outputs(self.rank_stdout, self.rank_stderr, self.stdout, self.stderr)


def format_outputs(rank_stdout: list[str], rank_stderr: list[str], stdout: str = "",
                   stderr: str = "") -> str:
    parts = []
    for r, (out, err) in enumerate(zip(rank_stdout, rank_stderr)):
        parts.append(f"--- rank {r} stdout:\n{out}--- rank {r} stderr:\n{err}")
    parts.append(f"--- mpirun stdout:\n{stdout}--- mpirun stderr:\n{stderr}")
    return "\n".join(parts)


def read_rank_outputs(directory: Path, np: int) -> tuple[list[str], list[str]]:
    """The stdout and stderr files mpirun's ``--output-filename DIR`` wrote for ranks 0..np-1
    (empty text for a rank that wrote nothing)."""
    def read(rank: int, stream: str) -> str:
        files = sorted(directory.glob(f"*/rank.{rank}/{stream}"))
        return "".join(f.read_text(errors="replace") for f in files)

    return [read(r, "stdout") for r in range(np)], [read(r, "stderr") for r in range(np)]


def run_mpi(
    np: int,
    script: str,
    tmp_path: Path,
    *,
    timeout: float = 120,
    env: dict | None = None,
    args: list[str] | None = None,
    expect_rc: int | None = 0,
) -> MPIRun:
    """Run ``script`` (Python source, dedented) on ``np`` ranks; fail the test on timeout.

    With ``expect_rc`` set (the default, 0) a different exit code fails the test and every
    rank's output is shown. Returns the finished run, with each rank's output apart.
    """
    if not mpirun_available():
        pytest.fail("mpirun not found: run `make install` (installs Open MPI)")
    path = tmp_path / f"rank_script_{abs(hash(script)) % 10**8}.py"
    path.write_text(textwrap.dedent(script))
    outputs = tmp_path / f"rank_outputs_{next(_runs)}"
    full_env = dict(os.environ)
    full_env.setdefault("DLCOMM_STALL_WARNING_SECONDS", "20")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "tests"), full_env.get("PYTHONPATH", "")]
    )
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    cmd = build_mpirun_command(np, [sys.executable, str(path), *(args or [])], env=full_env,
                               extra_args=["--output-filename", f"{outputs}:nocopy"])
    try:
        proc = subprocess.run(
            cmd, env=full_env, capture_output=True, text=True, timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"")
        err = (exc.stderr or b"")
        out = out.decode() if isinstance(out, bytes) else out
        err = err.decode() if isinstance(err, bytes) else err
        _kill_leftovers(path)
        rank_out, rank_err = read_rank_outputs(outputs, np)
        pytest.fail(f"{np}-rank job timed out after {timeout}s (a hang)\n"
                    + format_outputs(rank_out, rank_err, out, err))
    result = MPIRun(proc, *read_rank_outputs(outputs, np))
    if expect_rc is not None and proc.returncode != expect_rc:
        pytest.fail(f"{np}-rank job exited {proc.returncode}, expected {expect_rc}\n"
                    + result.report())
    return result


def _kill_leftovers(path: Path) -> None:
    """Kill ranks still running ``path`` after mpirun was killed by the timeout."""
    subprocess.run(["pkill", "-9", "-f", str(path)], check=False)
