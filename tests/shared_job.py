"""Several test cases in one multi-rank job: one start-up of torch or TensorFlow on every rank
instead of one per case.

The job runs when the first test of its rank count asks for it; its rank script runs the cases
in turn and writes, per case and rank, a JSON file whose ``error`` is None or the case's
traceback. Each test then reads only its own case and fails naming the case, the rank count,
the rank and the traceback; if the job itself failed, every case says so with its output.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest


class SharedJobs:
    """One job per rank count: ``start(np_)`` runs it (``run_mpi``) and returns its folder."""

    def __init__(self, cases_by_ranks: dict[int, list[str]],
                 start: Callable[[int], Path]) -> None:
        self.cases_by_ranks = cases_by_ranks
        self._start = start
        self._jobs: dict[int, Path | str] = {}

    def folder(self, np_: int, case: str) -> Path:
        """The folder of the job of ``np_`` ranks (started on first use) that ran ``case``."""
        assert case in self.cases_by_ranks[np_], (np_, case)
        if np_ not in self._jobs:
            try:
                self._jobs[np_] = self._start(np_)
            except pytest.fail.Exception as exc:  # the job itself failed: every case says so
                self._jobs[np_] = str(exc)
        job = self._jobs[np_]
        if isinstance(job, str):
            pytest.fail(f"{case} on {np_} ranks: the job of {self.cases_by_ranks[np_]} "
                        f"failed\n{job}")
        return job


def read_rank_results(folder: Path, np_: int, case: str,
                      file_name: Callable[[str, int], str]) -> list[dict]:
    """Every rank's JSON result of ``case`` (``folder / file_name(case, rank)``), in rank
    order; fails naming the case and rank when a file is missing or holds an ``error``."""
    found = []
    for rank in range(np_):
        path = folder / file_name(case, rank)
        assert path.exists(), f"{case} on {np_} ranks: rank {rank} wrote no result"
        result = json.loads(path.read_text())
        assert result.get("error") is None, \
            f"{case} on {np_} ranks, rank {rank}:\n{result['error']}"
        found.append(result)
    return found
