"""Tests of the benchmark suite: parsing, bandwidth arithmetic, formatting, and tiny real runs.

No timing is asserted anywhere: only that the figures are computed as defined, that the
correctness column compares against a numpy reference (and can say FAIL), and that the
outputs (tables, JSON, report) are produced.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from mpi_run import format_outputs, run_mpi
from shared_job import read_rank_results

from dlcomm.cli import main as cli
from dlcomm.tools.bench import peers, report, table, units
from dlcomm.tools.bench.fusion import FusionOptions, format_fusion, markdown_fusion
from dlcomm.tools.bench.machine import cpu_model, format_machine, memory_gib, steal_seconds


# --- sizes -------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("8", 8), ("1K", 1024), ("1k", 1024), ("4M", 4 << 20), ("64M", 64 << 20),
    ("2G", 2 << 30), ("4MiB", 4 << 20), ("512KB", 512 << 10), (" 16 ", 16), (32, 32),
])
def test_parse_size_accepts_counts_and_suffixes(text: str, expected: int) -> None:
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "4X", "-1", "0", "1.5K", "K", "4 M B x"])
def test_parse_size_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        units.parse_size(text)


@pytest.mark.parametrize("value", [None, 1.5, True, [4]])
def test_parse_size_rejects_wrong_types(value: object) -> None:
    with pytest.raises(TypeError):
        units.parse_size(value)  # type: ignore[arg-type]


def test_parse_size_list() -> None:
    assert units.parse_size_list("4K,64M") == [4096, 64 << 20]
    with pytest.raises(ValueError, match="empty"):
        units.parse_size_list(",")
    with pytest.raises(ValueError):
        units.parse_size_list("4K,huge")


def test_size_range_multiplies_up_to_the_end() -> None:
    assert units.size_range(4096, 64 << 20, 4) == [4096 << (2 * i) for i in range(8)]
    assert units.size_range(8, 100, 2) == [8, 16, 32, 64]  # 128 > 100 is left out
    assert units.size_range(1024, 1024, 1) == [1024]


@pytest.mark.parametrize("begin,end,factor,message", [
    (0, 8, 2, "smallest"), (64, 8, 2, "smaller than"), (8, 64, 1, "factor"),
])
def test_size_range_rejects_bad_ranges(begin: int, end: int, factor: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        units.size_range(begin, end, factor)


def test_format_size() -> None:
    assert [units.format_size(n) for n in (8, 4096, 3 << 19, 64 << 20, 1 << 30)] == [
        "8B", "4KiB", "1.5MiB", "64MiB", "1GiB"]
    with pytest.raises(ValueError):
        units.format_size(-1)


# --- bandwidth arithmetic ------------------------------------------------------------------
def test_bus_factors_are_nccl_tests_definitions() -> None:
    assert units.bus_factor("allreduce", 4) == pytest.approx(1.5)
    assert units.bus_factor("allreduce", 2) == pytest.approx(1.0)
    for c in ("allgather", "reducescatter", "alltoall"):
        assert units.bus_factor(c, 4) == pytest.approx(0.75)
    assert units.bus_factor("broadcast", 8) == 1.0
    assert units.bus_factor("allreduce", 1) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        units.bus_factor("gossip", 4)
    with pytest.raises(ValueError, match="ranks"):
        units.bus_factor("allreduce", 0)


def test_algbw_and_busbw() -> None:
    assert units.algbw(10**9, 1.0) == pytest.approx(1.0)
    assert units.algbw(64 << 20, 0.5) == pytest.approx((64 << 20) / 0.5 / 1e9)
    assert units.busbw("allreduce", 10**9, 2.0, 4) == pytest.approx(0.5 * 1.5)
    assert units.busbw("allgather", 10**9, 1.0, 8) == pytest.approx(7 / 8)
    with pytest.raises(ValueError, match="positive"):
        units.algbw(100, 0.0)


# --- references and cases ------------------------------------------------------------------
def test_reduce_reference_equals_an_explicit_reduction() -> None:
    inputs = [peers.rank_input(10, np.dtype("float32"), r) for r in range(4)]
    np.testing.assert_array_equal(peers.reduce_reference(10, np.dtype("float32"), "sum", 4),
                                  np.sum(inputs, axis=0))
    np.testing.assert_array_equal(peers.reduce_reference(10, np.dtype("int32"), "max", 4),
                                  np.max(inputs, axis=0).astype(np.int32))
    np.testing.assert_array_equal(peers.reduce_reference(10, np.dtype("float64"), "product", 4),
                                  np.prod(inputs, axis=0))
    np.testing.assert_allclose(peers.reduce_reference(10, np.dtype("float32"), "average", 4),
                               np.mean(inputs, axis=0))


def test_element_count_rounds_to_whole_elements_and_rank_multiples() -> None:
    assert peers.element_count("allreduce", 4096, 4, 4) == 1024
    assert peers.element_count("allreduce", 2, 4, 4) == 1  # never zero
    assert peers.element_count("allgather", 40, 4, 4) == 8  # 10 elements -> 8
    assert peers.element_count("alltoall", 4, 4, 4) == 4  # at least one per rank


def test_results_match_is_exact_for_ints_and_tolerant_for_floats() -> None:
    a = np.arange(6, dtype=np.int32)
    assert peers.results_match(a.copy(), a)
    assert not peers.results_match(a + 1, a)
    assert not peers.results_match(a.astype(np.int64), a)  # dtype matters
    assert not peers.results_match(a[:5], a)  # shape matters
    f = np.linspace(1, 2, 5, dtype=np.float32)
    assert peers.results_match(f * (1 + 1e-7), f)
    assert not peers.results_match(f * 1.01, f)


@pytest.mark.parametrize("collective,op,dtype,message", [
    ("gossip", "sum", "float32", "unknown collective"),
    ("allreduce", "median", "float32", "unknown op"),
    ("allreduce", "sum", "complex64", "not benchmarked"),
    ("allreduce", "sum", "no-such-type", "unknown dtype"),
    ("allreduce", "average", "int32", "float dtype"),
    ("broadcast", "max", "float32", "allreduce and reducescatter only"),
])
def test_check_op_dtype_rejects(collective: str, op: str, dtype: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        peers.check_op_dtype(collective, op, dtype)


# --- timing ---------------------------------------------------------------------------------
class _FakeComm:
    """Barrier does nothing; Allreduce copies (one rank): enough to test the bookkeeping."""

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        pass

    def Allreduce(self, send: np.ndarray, recv: np.ndarray, op: object = None) -> None:  # noqa: N802
        recv[...] = send


def test_time_in_blocks_alternates_peers_and_enters_each_block() -> None:
    from dlcomm.tools.bench.timing import time_in_blocks

    calls: list[str] = []
    ops = [lambda: calls.append("a"), lambda: calls.append("b")]
    enter = [lambda: calls.append("enter a"), lambda: calls.append("enter b")]
    times = time_in_blocks(ops, _FakeComm(), warmup=1, iters=7, block=5, enter=enter)
    assert times.shape == (2, 7) and (times >= 0).all()
    expected = (["enter a"] + ["a"] * 6 + ["enter b"] + ["b"] * 6
                + ["enter a"] + ["a"] * 3 + ["enter b"] + ["b"] * 3)
    assert calls == expected
    with pytest.raises(ValueError, match="block"):
        time_in_blocks(ops, _FakeComm(), 0, 1, block=0)
    with pytest.raises(ValueError, match="enter"):
        time_in_blocks(ops, _FakeComm(), 0, 1, enter=[None])
    with pytest.raises(ValueError, match="-n"):
        time_in_blocks(ops, _FakeComm(), 0, 0)


# --- command line ----------------------------------------------------------------------
def test_cli_parses_a_collective_benchmark() -> None:
    args = cli.build_parser().parse_args(
        ["bench", "allreduce", "-b", "1K", "-e", "4M", "-f", "4", "-w", "1", "-n", "3",
         "-d", "float64", "--op", "max", "--json", "r.json", "--plot", "r.png"])
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (1024, 4 << 20, 4)
    assert (args.warmup, args.iters, args.dtype, args.op) == (1, 3, "float64", "max")
    assert (args.collective, args.json, args.plot) == ("allreduce", "r.json", "r.png")
    assert args.block == 5
    args = cli.build_parser().parse_args(["bench", "alltoall", "--sizes", "8,64M"])
    assert args.sizes == [8, 64 << 20] and args.collective == "alltoall"


@pytest.mark.parametrize("argv,message", [
    (["bench", "allreduce", "-b", "4X"], "suffix K, M or G"),
    (["bench", "allreduce", "-n", "0"], "must be >= 1"),
    (["bench", "allreduce", "-w", "many"], "whole number"),
    (["bench", "allreduce", "-d", "complex64"], "invalid choice"),
    (["bench", "fusion", "--tensor-bytes", "lots"], "suffix"),
    (["bench", "fusion", "--block", "0"], "must be >= 1"),
])
def test_cli_rejects_bad_arguments(argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_reports_an_inverted_range_before_starting_mpi(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "allreduce", "-b", "64M", "-e", "4K"]) == 1
    assert "smaller than" in capsys.readouterr().err


def test_train_is_registered_and_validates_its_arguments() -> None:
    with pytest.raises(SystemExit, match="--np must be >= 1"):
        cli.main(["bench", "train", "--np", "0"])



def test_corun_validates_and_times_alone_against_together(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "corun", "--copies", "0"])
    assert "must be >= 1" in capsys.readouterr().err
    out = tmp_path / "corun.json"
    assert cli.main(["bench", "corun", "--kernel", "matmul", "--size", "32", "--iters", "2",
                     "--rounds", "2", "--json", str(out)]) == 0
    table_text = capsys.readouterr().out
    assert "| median |" in table_text
    assert len(re.findall(r"\| \**\d+\.\d\dx\** \|", table_text)) == 3  # 2 rounds, median
    result = json.loads(out.read_text())
    assert result["copies"] == 2 and len(result["rounds"]) == 2
    for row in result["rounds"]:
        assert row["alone"]["wall_s"] > 0 and row["together"]["wall_s"] > 0


def test_exchange_bench_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for bad, message in ((["--tolerances", "0,0.5"], "in (0, 1)"),
                         (["--algorithms", "ring,fast"], "unknown all-reduce algorithm"),
                         (["--tolerances", "x"], "comma-separated numbers"),
                         (["--sizes", "10,0"], "sizes must be >= 1"),
                         (["-n", "1"], "must be >= 2")):
        with pytest.raises(SystemExit):
            cli.main(["bench", "exchange", *bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit, match="nothing to time"):
        cli.main(["bench", "exchange", "--algorithms", "", "--tolerances", ""])


def test_corun_cnn_kernel_runs_the_demo_shaped_network() -> None:
    pytest.importorskip("torch")
    from dlcomm.tools.bench.corun import measure

    rows = measure("cnn", copies=2, batch=4, size=1, iters=1, rounds=1)
    assert rows[0]["slowdown"] > 0 and rows[0]["alone"]["cpu_s"] > 0


# --- formatting --------------------------------------------------------------------------
def _peer(median: float, nbytes: int, check: str = "OK") -> dict:
    return {"median_s": median, "min_s": median, "max_s": median, "iters": 3,
            "algbw_GBps": units.algbw(nbytes, median),
            "busbw_GBps": units.busbw("allreduce", nbytes, median, 4), "check": check}


def _result() -> dict:
    rows = [
        {"bytes": 4096, "count": 1024, "dtype": "float32", "dlcomm": _peer(3e-4, 4096),
         "mpi4py": _peer(1e-4, 4096), "ratio": 3.0, "ratio_paired": 2.9},
        {"bytes": 64 << 20, "count": 16 << 20, "dtype": "float32",
         "dlcomm": _peer(0.105, 64 << 20, "FAIL"), "mpi4py": _peer(0.1, 64 << 20),
         "ratio": 1.05, "ratio_paired": 1.02},
        {"bytes": 8, "count": 4, "dtype": "float16", "dlcomm": _peer(2e-5, 8),
         "mpi4py": {"unavailable": "the MPI library has no float16 type"}, "ratio": None,
         "ratio_paired": None},
    ]
    return {"benchmark": "allreduce", "ranks": 4, "dtype": "float32", "op": "sum", "root": 0,
            "warmup": 1, "iters": 3, "timing": "median", "emulate": "4x1gbit", "rows": rows}


def test_text_table_shows_each_row_with_ratio_and_check() -> None:
    text = table.format_table(_result())
    lines = text.splitlines()
    assert "allreduce: 4 ranks, float32, op sum, emulated cluster 4x1gbit" in lines[0]
    assert len(lines) == 4 + 3
    assert "4KiB" in lines[4] and "300.0" in lines[4] and "100.0" in lines[4]
    assert lines[4].rstrip().endswith("3.00x   2.90x")
    assert "FAIL" in lines[5] and lines[5].rstrip().endswith("1.05x   1.02x")
    assert lines[6].count("n/a") == 6  # four raw cells and both ratios
    busbw = units.busbw("allreduce", 64 << 20, 0.105, 4)
    assert f"{busbw:.3f}" in lines[5]


def test_markdown_table() -> None:
    md = table.markdown_table(_result()).splitlines()
    assert md[0].startswith("| size |") and len(md) == 2 + 3
    assert md[2] == "| 4KiB | 300.0 | 0.020 | 100.0 | 0.061 | 3.00x | 2.90x | OK / OK |"
    assert md[3].endswith("| 1.05x | 1.02x | FAIL / OK |")
    assert "| n/a | n/a | n/a | n/a | OK |" in md[4]
    with pytest.raises(TypeError):
        table.markdown_table({"rows": []})


def test_json_round_trip(tmp_path: Path) -> None:
    path = table.write_json(_result(), tmp_path / "sub" / "r.json")
    assert table.read_json(path) == json.loads(json.dumps(_result()))
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="JSON object"):
        table.read_json(tmp_path / "list.json")


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from dlcomm.tools.bench.plot import plot_busbw

    out = plot_busbw([_result(), {**_result(), "emulate": ""}], tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TypeError):
        plot_busbw(_result(), tmp_path / "q.png")  # type: ignore[arg-type]


def test_fusion_formatting_and_options() -> None:
    fig = {"median_s": 0.04, "min_s": 0.03, "max_s": 0.05, "iters": 3, "check": "OK",
           "vs_concatenated": 1.1, "vs_concatenated_paired": 1.05}
    result = {"benchmark": "fusion", "ranks": 4, "tensors": 200, "tensor_bytes": 40000,
              "dtype": "float32", "warmup": 1, "iters": 3, "timing": "median",
              "peers": {"dlcomm async": fig, "mpi4py concatenated": fig}}
    assert "dlcomm async" in format_fusion(result) and "1.10x" in format_fusion(result)
    assert "| dlcomm async | 40.00 | 30.00 | 50.00 | 1.10x | 1.05x | OK |" \
        in markdown_fusion(result)
    with pytest.raises(ValueError, match="float32 or float64"):
        FusionOptions(dtype="int32").validate()
    with pytest.raises(ValueError, match="tensors"):
        FusionOptions(tensors=0).validate()


def test_machine_description_parsing() -> None:
    assert cpu_model("processor: 0\nmodel name\t: Test CPU @ 2GHz\n") == "Test CPU @ 2GHz"
    assert memory_gib("MemTotal:       24576000 kB\n") == pytest.approx(23.4, abs=0.1)
    assert memory_gib("nothing") is None
    line = format_machine({"cores": 2, "cpu_model": "X", "memory_gib": 24.0, "kernel": "6",
                           "mpi": "Open MPI 4.1.4", "mpi4py": "4.1.2", "numpy": "2",
                           "python": "3.11"})
    assert line.startswith("2 cores (X), 24.0 GiB memory") and "Open MPI 4.1.4" in line
    hz = os.sysconf("SC_CLK_TCK")
    stat = f"cpu  10 0 5 900 3 0 1 {3 * hz} 0 0\ncpu0 5 0 2 450 1 0 0 {hz} 0 0\n"
    assert steal_seconds(stat) == pytest.approx(3.0)  # the all-CPU line, not cpu0
    assert steal_seconds("cpu  10 0 5 900\n") is None  # an old kernel without steal
    assert steal_seconds("nothing") is None
    here = steal_seconds()
    assert here is None or here >= 0


# --- report plumbing -----------------------------------------------------------------------
def test_report_shows_commands_as_a_user_types_them(tmp_path: Path) -> None:
    ctx = report.ReportContext(np=4, output=tmp_path / "b.md", assets=tmp_path / "b",
                               workdir=tmp_path, python="/opt/py/bin/python3")
    argv = report.bench_argv(ctx, ["allreduce", "-n", "5"], tmp_path / "x.json")
    assert argv[:5] == ["/opt/py/bin/python3", "-m", "dlcomm.launcher.dlcommrun", "-np", "4"]
    job = report.Job(argv, 0, "", None, 1.0, None, None)
    assert job.command_text(ctx.python) == (
        "dlcommrun -np 4 dlcomm bench allreduce -n 5 --json x.json")
    emulated = report.bench_argv(ctx, ["fusion"], tmp_path / "f.json", emulate="4x1gbit")
    assert "--emulate" in emulated and "-np" not in emulated
    with pytest.raises(TypeError):
        report.bench_argv(ctx, "allreduce", tmp_path / "x.json")  # type: ignore[arg-type]


def test_report_renders_sections_summary_and_failures() -> None:
    sections = [report.Section("A", "body a", headlines=["figure one"]),
                report.Section("B", "body b", ok=False)]
    machine = {"cores": 2, "cpu_model": "X", "memory_gib": 1.0, "kernel": "6", "mpi": "M",
               "mpi4py": "4", "numpy": "2", "python": "3", "load_average": (1.0, 2.0, 3.0)}
    text = report.render(sections, machine, "2026-01-01", 90.0, "dlcomm bench report",
                         (4.0, 5.0, 6.0))
    assert text.startswith("# Benchmarks")
    assert "1.00 / 2.00 / 3.00 at the start, 4.00 / 5.00 / 6.00 at the end" in text
    assert "- figure one" in text and "- FAILED: B" in text
    assert text.index("## A") < text.index("## B")


def test_report_rejects_unknown_sections_and_lists_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown section"):
        report.main_report(tmp_path / "b.md", only="nope")
    assert report.main_report(tmp_path / "b.md", list_only=True) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in report.SECTIONS)
    assert not (tmp_path / "b.md").exists()


# --- tiny real runs --------------------------------------------------------------------------
# One 2-rank job runs every real-rank case below in turn, each with its stdout captured apart:
# one start-up of MPI and the package per rank instead of one per case. Each rank writes each
# case's stdout and exit code to a file of its own; every test reads its case's. The cases
# that fail on purpose come last, so that a failure cannot leave the others out of step.
_REAL_RUNS = """
import contextlib, io, json, sys
from mpi4py import MPI
from dlcomm.cli.main import main
import dlcomm.tools.bench.peers as peers
from dlcomm.tools.bench.roundtrip import measure

out = sys.argv[1]
comm = MPI.COMM_WORLD


def collectives():
    codes = {}
    for c in ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall"):
        codes[c] = main(["bench", c, "--sizes", "4K,64K", "-w", "0", "-n", "3", "--block", "2",
                         "--json", f"{out}/{c}.json"])
    codes["average"] = main(["bench", "allreduce", "--sizes", "1K", "-w", "0", "-n", "1",
                             "--op", "average", "-d", "float64", "--json", f"{out}/avg.json"])
    codes["fusion"] = main(["bench", "fusion", "--tensors", "5", "--tensor-bytes", "4K",
                            "-w", "0", "-n", "1", "--json", f"{out}/fusion.json"])
    # A wrong reference must turn the check column to FAIL and the exit code to 1.
    real = peers.reduce_reference
    peers.reduce_reference = lambda *a: real(*a) + 1
    try:
        codes["wrong"] = main(["bench", "allreduce", "--sizes", "4K", "-w", "0", "-n", "1",
                               "--json", f"{out}/wrong.json"])
    finally:
        peers.reduce_reference = real
    print("CODES " + json.dumps(codes), flush=True)
    return 0


def exchange(*argv):
    try:
        return main(["bench", "exchange", *argv])
    except RuntimeError as exc:
        print(f"rank {comm.rank} error: {exc}", flush=True)
        return 3


def failing_block():
    if comm.rank == 1:
        raise MemoryError("out of memory in the compute block")


def roundtrip_failure():
    try:
        measure(comm, failing_block, 64, 2, 1, pause=0.0, settle=0.01)
    except RuntimeError as exc:
        print(f"rank {comm.rank}: {exc}", flush=True)
    return 0


CASES = {
    "collectives": collectives,
    "roundtrip": lambda: main(["bench", "roundtrip", "--kernel", "matmul", "--size", "64",
                               "--bytes", "4000", "-n", "3", "--rounds", "2",
                               "--json", f"{out}/roundtrip.json"]),
    "exchange": lambda: exchange("--sizes", "64,5000,3000", "--algorithms", "native,ring",
                                 "--tolerances", "1e-9,0.2", "-n", "2", "-w", "1",
                                 "--blocks", "2", "--json", f"{out}/exchange.json"),
    "roundtrip_failure": roundtrip_failure,
    "exchange_monitor": lambda: exchange("--monitor-host", "7", "-n", "2"),
    # last: the engine's shutdown ends this script's use of it
    "roundtrip_engine": lambda: main(["bench", "roundtrip", "--through", "engine", "--kernel",
                                      "matmul", "--size", "64", "--bytes", "4000", "-n", "3",
                                      "--rounds", "1", "--json",
                                      f"{out}/roundtrip_engine.json"]),
}
for name, case in CASES.items():
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = case()
    with open(f"{out}/{name}_rank{comm.rank}.json", "w") as f:
        json.dump({"stdout": text.getvalue(), "exit": code}, f)
    comm.Barrier()
"""


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """The folder of the one 2-rank job of every real-rank case, and the finished job."""
    folder = tmp_path_factory.mktemp("bench_real_runs")
    proc = run_mpi(2, _REAL_RUNS, folder, timeout=300, args=[str(folder)])
    return folder, proc


def real_run_case(real_runs: tuple[Path, object], name: str) -> tuple[list[dict], str]:
    """Each rank's {"stdout", "exit"} of case ``name``, and a report for failure messages."""
    folder, proc = real_runs
    runs = read_rank_results(folder, 2, name, lambda c, r: f"{c}_rank{r}.json")
    return runs, format_outputs([run["stdout"] for run in runs], proc.rank_stderr)


def test_roundtrip_bench_times_idle_and_computing_ranks(real_runs) -> None:
    runs, report = real_run_case(real_runs, "roundtrip")
    assert [run["exit"] for run in runs] == [0, 0], report
    rows = json.loads((real_runs[0] / "roundtrip.json").read_text())
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        for state in ("idle", "busy"):
            assert 0 < r[state]["p10_ms"] <= r[state]["p50_ms"] <= r[state]["p90_ms"]
        assert r["ratio"] == pytest.approx(r["busy"]["p50_ms"] / r["idle"]["p50_ms"])
    table = runs[0]["stdout"]  # rank 0 prints the table
    assert "| median |" in table and "MPI_Allreduce of 4000 bytes, 2 ranks" in table, report


def test_roundtrip_bench_times_the_engines_allreduce_too(real_runs) -> None:
    runs, report = real_run_case(real_runs, "roundtrip_engine")
    assert [run["exit"] for run in runs] == [0, 0], report
    (row,) = json.loads((real_runs[0] / "roundtrip_engine.json").read_text())
    for state in ("idle", "busy"):
        assert 0 < row[state]["p10_ms"] <= row[state]["p50_ms"] <= row[state]["p90_ms"]
    assert "dlcomm.allreduce of 4000 bytes, 2 ranks" in runs[0]["stdout"], report


def test_roundtrip_bench_reports_a_failed_compute_block_on_every_rank(real_runs) -> None:
    runs, report = real_run_case(real_runs, "roundtrip_failure")
    for rank in (0, 1):
        assert (f"rank {rank}: the compute thread failed on rank 1: MemoryError"
                in runs[rank]["stdout"]), report


def test_exchange_bench_times_every_peer_on_real_ranks(real_runs) -> None:
    runs, report = real_run_case(real_runs, "exchange")
    assert [run["exit"] for run in runs] == [0, 0], report
    rows = json.loads((real_runs[0] / "exchange.json").read_text())
    assert [(r["peer"], r["block"]) for r in rows] == [
        (p, b) for b in (1, 2) for p in ("native all-reduce", "ring all-reduce",
                                         "exchange p=1e-09", "exchange p=0.2")]
    assert all(r["median_ms"] >= r["min_ms"] > 0 and "link" not in r for r in rows)
    assert "| exchange p=0.2 | median |" in runs[0]["stdout"], report


def test_exchange_bench_monitor_outside_the_emulator_fails_on_every_rank(real_runs) -> None:
    runs, report = real_run_case(real_runs, "exchange_monitor")
    assert all(run["exit"] != 0 for run in runs), report
    for rank in (0, 1):
        assert f"rank {rank} error: --monitor-host 7:" in runs[rank]["stdout"], report
        assert "dlcommrun --emulate" in runs[rank]["stdout"], report


def test_tiny_real_run_checks_results_and_writes_json(real_runs) -> None:
    runs, report = real_run_case(real_runs, "collectives")
    tmp_path = real_runs[0]
    payloads = [re.findall(r"CODES (\{[^{}]*\})", run["stdout"]) for run in runs]
    assert [len(p) for p in payloads] == [1, 1], report  # one line from each rank
    for (payload,) in payloads:  # both ranks got the same exit codes
        codes = json.loads(payload)
        assert codes == {"allreduce": 0, "allgather": 0, "reducescatter": 0, "broadcast": 0,
                         "alltoall": 0, "average": 0, "fusion": 0, "wrong": 1}
    for name in ("allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "avg"):
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["ranks"] == 2 and result["all_ok"] is True
        assert result["raw_peer_engine"] == "stopped"
        for row in result["rows"]:
            assert row["dlcomm"]["check"] == "OK" and row["mpi4py"]["check"] == "OK"
            assert row["ratio"] > 0 and row["ratio_paired"] > 0
            assert row["dlcomm"]["busbw_GBps"] == pytest.approx(units.busbw(
                result["benchmark"], row["bytes"], row["dlcomm"]["median_s"], 2))
    assert [r["bytes"] for r in json.loads((tmp_path / "allreduce.json").read_text())["rows"]] \
        == [4096, 65536]
    fusion = json.loads((tmp_path / "fusion.json").read_text())
    assert fusion["all_ok"] and all(p["check"] == "OK" for p in fusion["peers"].values())
    wrong = json.loads((tmp_path / "wrong.json").read_text())
    assert wrong["all_ok"] is False and wrong["rows"][0]["dlcomm"]["check"] == "FAIL"
    assert "FAIL" in runs[0]["stdout"] and "  OK" in runs[0]["stdout"], report


def test_roundtrip_bench_validates_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "roundtrip", "--bytes", "2"])
    assert "must be >= 4" in capsys.readouterr().err


def test_time_to_target_accuracy_counts_training_time_until_first_reached() -> None:
    from dlcomm.tools.bench.convergence import time_to_target, timed_table

    dense = {"compression": "none", "epoch_seconds": [10.0, 10.0, 10.0],
             "epoch_accuracy": [0.80, 0.91, 0.95], "step_seconds": 0.5}
    fast = {"compression": "acpsgd:rank=8", "epoch_seconds": [4.0, 4.0, 4.0],
            "epoch_accuracy": [0.85, 0.89, 0.92], "step_seconds": 0.2}
    never = {"compression": "signum", "epoch_seconds": [4.0], "epoch_accuracy": [0.1],
             "step_seconds": 0.2}
    assert time_to_target(dense, 0.9) == 20.0
    assert time_to_target(fast, 0.9) == 12.0
    assert time_to_target(never, 0.9) is None
    text = timed_table([dense, fast, never], 0.9)
    assert "| `acpsgd:rank=8` | 200 | 2.50x | 0.850 / 0.890 / 0.920 | 12.0 | 1.67x |" in text
    assert "| `signum` | 200 | 2.50x | 0.100 | not reached | - |" in text


def test_convergence_rejects_a_target_outside_zero_one() -> None:
    from dlcomm.tools.bench.convergence import main

    with pytest.raises(SystemExit):
        main(["--target", "1.5", "--specs", "none"])


def test_training_benchmarks_find_their_example_scripts() -> None:
    """The drivers start scripts of examples/ by path; a move of the tools must not lose them."""
    from dlcomm.tools.bench import convergence, train

    assert train.EXAMPLE.is_file(), train.EXAMPLE
    assert convergence.EXAMPLE.is_file(), convergence.EXAMPLE
