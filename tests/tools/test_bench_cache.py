"""``dlcomm bench cache`` on real ranks, tiny: every sample comes from the source once in the
first epoch and from the host's memory afterwards; the uncached epoch decodes again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import run_mpi

from dlcomm.cli import main as cli

pytest.importorskip("PIL")
pytest.importorskip("mlxtend")

SCRIPT = """
import sys
from dlcomm.cli import main as cli
sys.exit(cli.main(["bench", "cache", *sys.argv[1:]]))
"""


def test_cache_bench_reports_epochs_and_where_samples_came_from(tmp_path: Path) -> None:
    out = tmp_path / "cache.json"
    proc = run_mpi(3, SCRIPT, tmp_path, timeout=180,
                   args=["--samples", "31", "--image-size", "16", "--epochs", "2",
                         "--workdir", str(tmp_path), "--json", str(out)])
    result = json.loads(out.read_text())
    first, second, uncached = result["epochs"]
    assert [e["epoch"] for e in result["epochs"]] == ["1", "2", "uncached, files in page cache"]
    assert sum(r["misses"] for r in first["per_rank"]) == 31
    assert sum(r["memory_hits"] for r in second["per_rank"]) == 31
    assert sum(r["misses"] for r in second["per_rank"]) == 0
    assert all(e["seconds"] > 0 for e in (first, second, uncached))
    assert len(list((tmp_path / "dlcomm-bench-cache" / "png16").glob("*.png"))) == 31
    assert "| 2 |" in proc.rank_stdout[0] and "31 PNG images" in proc.rank_stdout[0]


def test_cache_bench_validates_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "cache", "--epochs", "1"])
    assert "must be >= 2" in capsys.readouterr().err
