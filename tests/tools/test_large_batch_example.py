"""examples/large_batch.py on real ranks, tiny: a small-batch baseline and LARS/LAMB at a 8x
larger global batch split into gradient-accumulation passes, in bfloat16 with the LossScaler;
every run learns (held-out accuracy far above chance) and the summary names every run."""
from __future__ import annotations

import json

import pytest
from mpi_run import REPO, run_mpi

pytest.importorskip("torch")
pytest.importorskip("sklearn")

EXAMPLE = REPO / "examples" / "large_batch.py"


@pytest.mark.parametrize("np_", [3])  # 3: batches that do not split evenly over the ranks
def test_large_batch_example_runs_and_learns(np_, tmp_path):
    out = tmp_path / "summary.json"
    large = 48 * np_ * 2  # two accumulation passes of 48 per rank
    run_mpi(np_, EXAMPLE.read_text(), tmp_path, timeout=400,
            args=["--dataset", "digits", "--epochs", "4", "--warmup-epochs", "1",
                  "--small-batch", str(large // 8), "--large-batch", str(large),
                  "--max-micro-batch", "48", "--runs", "small:sgd,large:lars,large:lamb",
                  "--bf16", "--json", str(out)])
    summary = json.loads(out.read_text())
    assert summary["ranks"] == np_
    assert set(summary["accuracy"]) == {"small:sgd", "large:lars", "large:lamb"}
    for run, accuracy in summary["accuracy"].items():
        assert 0.5 < accuracy <= 1.0, (run, accuracy)  # ten classes: chance is 0.1
