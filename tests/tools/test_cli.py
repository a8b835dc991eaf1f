"""The ``dlcomm`` command: subcommand registry, --version, timeline summary and plot."""
from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from dlcomm.cli import main as cli
from dlcomm.engine.timeline import Timeline


def make_timeline(path: Path) -> None:
    """A small real timeline: two tensors, communicate and fuse phases."""
    with Timeline(str(path), 0) as tl:
        for name in ("grad.a", "grad.b"):
            for phase in ("fuse", "communicate"):
                tl.begin(name, phase)
                tl.end(name, phase)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("dlcomm ")


def test_bench_is_registered_and_missing_module_is_a_placeholder(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.SUBCOMMANDS["bench"] == "dlcomm.tools.bench.command"
    monkeypatch.setitem(cli.SUBCOMMANDS, "later", "dlcomm.cli.not_written_yet")
    assert cli.main(["later", "--any", "args"]) == cli.EXIT_NOT_AVAILABLE
    assert "not yet available" in capsys.readouterr().err


def test_a_module_with_a_broken_import_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = types.ModuleType("dlcomm.cli.broken_for_test")

    def register(_subparsers: object) -> None:
        import a_dependency_that_is_missing  # noqa: F401

    broken.register = register
    monkeypatch.setitem(sys.modules, "dlcomm.cli.broken_for_test", broken)
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", "dlcomm.cli.broken_for_test")
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_missing"):
        cli.build_parser()


def test_registered_module_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("dlcomm.cli.fake_for_test")

    def register(subparsers) -> None:  # noqa: ANN001
        p = subparsers.add_parser("fake")
        p.add_argument("--n", type=int, default=0)
        p.set_defaults(func=lambda args: 40 + args.n)

    fake.register = register
    monkeypatch.setitem(sys.modules, "dlcomm.cli.fake_for_test", fake)
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", "dlcomm.cli.fake_for_test")
    assert cli.main(["fake", "--n", "2"]) == 42


def test_timeline_summary_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tl.json"
    make_timeline(path)
    assert cli.main(["timeline", "summary", str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "phase" in out and "fuse" in out and "communicate" in out
    assert "top 1 of 2 tensors" in out
    png = tmp_path / "tl.png"
    assert cli.main(["timeline", "plot", str(path), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timeline_errors_are_messages_not_tracebacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["timeline", "summary", str(tmp_path / "missing.json")]) == 1
    err = capsys.readouterr().err
    assert "cannot read timeline" in err and "missing.json" in err
    with pytest.raises(SystemExit) as info:  # argparse: -o is required
        cli.main(["timeline", "plot", str(tmp_path / "x.json")])
    assert info.value.code == 2


def test_console_script_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dlcomm.cli.main", "--help"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0
    assert "timeline" in proc.stdout and "bench" in proc.stdout
