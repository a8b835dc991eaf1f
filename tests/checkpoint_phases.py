"""The resume-from-checkpoint tests' driver (imported by the multi-rank tests): a script run
in four phases on real ranks, each rank saving its final parameters per tag, then compared.

``full`` trains 8 steps uninterrupted and checkpoints after step 4 on its way (taking a
checkpoint must not change the run: a job that checkpoints goes on training); ``resume``
loads that checkpoint in a new job and trains 4 more; ``resume_plain`` does the same without
dlcomm's state. A resume must equal the full run bit for bit on every rank.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi_run import run_mpi

PHASES = ("full", "resume", "resume_plain")


def run_phases(ranks: int, script: str, tmp_path: Path, items: str, timeout: int,
               env: dict | None = None) -> dict:
    """Run ``script`` once per phase with args (phase, folder, items); every rank must print
    OK once. Returns each phase's finished job, for checks of its own output."""
    jobs = {}
    for phase in PHASES:
        proc = run_mpi(ranks, script, tmp_path, timeout=timeout, env=env,
                       args=[phase, str(tmp_path), items])
        assert proc.count_per_rank("OK") == [1] * ranks, proc.report()
        jobs[phase] = proc
    return jobs


def assert_resume_equals_full(tmp_path: Path, ranks: int, tag: str, what: str,
                              state_matters: bool | None) -> None:
    """``resume`` equals ``full`` on every rank; ``resume_plain`` differs from it when
    ``state_matters``, equals it when False, and is not checked when None."""
    for r in range(ranks):
        full = np.load(tmp_path / f"full_{tag}_{r}.npy")
        resumed = np.load(tmp_path / f"resume_{tag}_{r}.npy")
        np.testing.assert_array_equal(resumed, full, err_msg=f"{what} rank {r}")
        plain = np.load(tmp_path / f"resume_plain_{tag}_{r}.npy")
        if state_matters:
            assert not np.array_equal(plain, full), f"{what}: the state made no difference"
        elif state_matters is False:
            np.testing.assert_array_equal(plain, full, err_msg=f"{what} rank {r}")
