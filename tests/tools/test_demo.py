"""The torch demo (`examples/torch_mnist.py`, what `make demo` runs) on real ranks, once per
feature it can switch on: it must learn the digits and end with one model.

One job per rank count runs the demo's ``main()`` once per feature, in turn (each run starts
and shuts dlcomm down itself, as the script does): one start-up of MPI, torch and
scikit-learn per rank count instead of one per feature. Each rank writes each run's stdout
and exit code to files of its own; every feature's test reads its run's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mpi_run import REPO, format_outputs, run_mpi

pytest.importorskip("torch")
pytest.importorskip("sklearn")

DEMO = REPO / "examples" / "torch_mnist.py"

DRIVER = r'''
import contextlib, importlib.util, io, json, os, sys

demo_path, cases, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])  # Open MPI's; MPI starts in the demo's init
spec = importlib.util.spec_from_file_location("torch_mnist_demo", demo_path)
demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo)  # not __main__: defines main() without running it
for i, argv in enumerate(cases):
    sys.argv = [demo_path, *argv]
    text, code = io.StringIO(), 0
    with contextlib.redirect_stdout(text):
        try:
            demo.main()
        except SystemExit as exc:  # the demo's own failure: parameters differ (every rank)
            code = exc.code
    with open(f"{out}/case{i}_rank{rank}.json", "w") as f:
        json.dump({"stdout": text.getvalue(), "exit": code}, f)
'''

FEATURES = [
    [],
    ["--schedule", "dear"],
    ["--schedule", "none", "--model", "mlp"],
    ["--compression", "fp16", "--width", "8"],
    ["--sync", "lbbsp", "--phase-times"],
    ["--loss-tolerance", "0.05"],
    ["--sync", "dssync:group_size=2"],  # on 4 ranks: on 2 it would be BSP
]


def ranks_for(extra: list[str]) -> int:
    return 4 if "dssync:group_size=2" in extra else 2


def demo_args(extra: list[str], ranks: int, out: Path) -> list[str]:
    lr = "0.05" if ranks == 2 else "0.02"  # lr x ranks: 0.05 x 4 diverges, with BSP too
    return ["--dataset", "digits", "--epochs", "3", "--lr", lr, "--no-progress",
            "--json", str(out), *extra]


@pytest.fixture(scope="module")
def job(request, tmp_path_factory):
    """One job per rank count running each of its features in turn; returns (ranks, folder,
    the features in the order they ran)."""
    ranks = request.param
    folder = tmp_path_factory.mktemp(f"demo{ranks}")
    features = [extra for extra in FEATURES if ranks_for(extra) == ranks]
    cases = [demo_args(extra, ranks, folder / f"result{i}.json")
             for i, extra in enumerate(features)]
    proc = run_mpi(ranks, DRIVER, folder, timeout=600,
                   args=[str(DEMO), json.dumps(cases), str(folder)])
    return ranks, folder, features, proc


@pytest.mark.parametrize("job,extra", [(ranks_for(extra), extra) for extra in FEATURES],
                         indirect=["job"], scope="module", ids=lambda value: f"{value}ranks"
                         if isinstance(value, int) else " ".join(value) or "default")
def test_demo_learns_with_each_feature(job, extra: list[str]) -> None:
    ranks, folder, features, proc = job
    i = features.index(extra)
    runs = [json.loads((folder / f"case{i}_rank{r}.json").read_text()) for r in range(ranks)]
    report = format_outputs([run["stdout"] for run in runs], proc.rank_stderr)
    assert [run["exit"] for run in runs] == [0] * ranks, report
    summary = runs[0]["stdout"]  # rank 0 prints the summary
    assert f"parameters identical on all {ranks} ranks: yes" in summary, report
    result = json.loads((folder / f"result{i}.json").read_text())
    assert len(result["epoch_accuracy"]) == len(result["epoch_seconds"]) == 3
    assert result["width"] == (8 if "--width" in extra else 16)
    assert result["steal_s"] is None or result["steal_s"] >= 0
    assert result["accuracy"] > 0.6, report  # chance is 0.1; dense reaches ~0.82
    if "--phase-times" in extra:  # one median per rank and phase
        phases = result["phase_ms"]
        assert [sorted(p) for p in phases] == [sorted(
            ["before", "before.cpu", "compute", "compute.cpu", "step", "step.cpu", "samples"])] * 2
        assert all(p["compute"] > 0 and p["compute.cpu"] > 0 for p in phases)
        assert "rank 1: median step of" in summary, report
