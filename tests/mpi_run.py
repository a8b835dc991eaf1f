"""Start a Python test script on N real MPI ranks from pytest, under a hard timeout.

Multi-rank tests write their per-rank body as a script and call ``run_mpi``; a hang
becomes a test failure that shows each rank's output instead of a stuck CI run.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlcomm.launcher.mpirun_command import build_mpirun_command, mpirun_available

REPO = Path(__file__).resolve().parents[1]


def run_mpi(
    np: int,
    script: str,
    tmp_path: Path,
    *,
    timeout: float = 120,
    env: dict | None = None,
    args: list[str] | None = None,
    expect_rc: int | None = 0,
) -> subprocess.CompletedProcess:
    """Run ``script`` (Python source, dedented) on ``np`` ranks; fail the test on timeout.

    With ``expect_rc`` set (the default, 0) a different exit code fails the test and the
    combined output is shown. Returns the completed process for further checks.
    """
    if not mpirun_available():
        pytest.fail("mpirun not found: run `make install` (installs Open MPI)")
    path = tmp_path / f"rank_script_{abs(hash(script)) % 10**8}.py"
    path.write_text(textwrap.dedent(script))
    full_env = dict(os.environ)
    full_env.setdefault("DLCOMM_STALL_WARNING_SECONDS", "20")
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "tests"), full_env.get("PYTHONPATH", "")]
    )
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    cmd = build_mpirun_command(np, [sys.executable, str(path), *(args or [])], env=full_env)
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
        pytest.fail(f"{np}-rank job timed out after {timeout}s (a hang)\n"
                    f"stdout:\n{out}\nstderr:\n{err}")
    if expect_rc is not None and proc.returncode != expect_rc:
        pytest.fail(
            f"{np}-rank job exited {proc.returncode}, expected {expect_rc}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def _kill_leftovers(path: Path) -> None:
    """Kill ranks still running ``path`` after mpirun was killed by the timeout."""
    subprocess.run(["pkill", "-9", "-f", str(path)], check=False)
