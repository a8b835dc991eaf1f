"""``run_mpi`` keeps every rank's output apart: ranks that print at the same moment would
interleave their writes in one shared stream (issue 17's flaky float16 test read
'nativenative True kernel used  True'), so tests read each rank's own text instead."""
from __future__ import annotations

from mpi_run import run_mpi

CHATTY_SCRIPT = r'''
import os, sys
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
for i in range(300):  # many small writes at once on every rank, unbuffered
    sys.stdout.write(f"<{rank}:")
    sys.stdout.write(f"{i}>")
    sys.stderr.write(f"[{rank}]")
sys.stdout.write("\n")
'''


def test_each_rank_output_arrives_whole_and_apart(tmp_path) -> None:
    proc = run_mpi(4, CHATTY_SCRIPT, tmp_path, timeout=60)
    assert proc.rank_stdout == ["".join(f"<{r}:{i}>" for i in range(300)) + "\n"
                                for r in range(4)], proc.report()
    assert proc.rank_stderr == [f"[{r}]" * 300 for r in range(4)], proc.report()
    assert proc.count_per_rank("<0:") == [300, 0, 0, 0]
    assert "<1:" not in proc.stdout  # mpirun's own stream holds no rank's output
