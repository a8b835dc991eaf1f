"""Timeline writer (dlcomm.engine.timeline) and its reader/summary/plot (dlcomm.cli)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from mpi_run import run_mpi

from dlcomm.engine import timeline as tl_mod
from dlcomm.engine.timeline import PHASES, NullTimeline, Timeline, open_timeline
from dlcomm.tools.timeline.plot import plot_timeline
from dlcomm.tools.timeline.summary import Trace, format_summary, load_trace, summarize

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FakeClock:
    """A monotonic clock the test advances by hand (nanoseconds)."""

    def __init__(self, start_ns: int = 5_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def advance_us(self, us: int) -> None:
        self.now += us * 1000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(tl_mod, "_now_ns", fake)
    return fake


def write_known_timeline(path: Path, clock: FakeClock, rank: int = 0) -> dict:
    """Write phases with known durations; return the reference {(tensor, phase): [us...]}."""
    durations = {
        "grad.w": {"queued": 10, "negotiate": 30, "fuse": 5, "communicate": 400, "unpack": 7},
        "grad.b": {"queued": 2, "negotiate": 20, "communicate": 50},
        "grad.c": {"negotiate": 11, "compress": 13, "communicate": 900, "decompress": 17},
    }
    written: dict[tuple[str, str], list[int]] = {}
    tl = Timeline(str(path), rank)
    for step in range(3):
        tl.instant("cycle", {"step": step})
        for tensor, phases in durations.items():
            for phase, us in phases.items():
                tl.begin(tensor, phase, {"bytes": 4 * us})
                clock.advance_us(us * (step + 1))
                tl.end(tensor, phase)
                written.setdefault((tensor, phase), []).append(us * (step + 1))
                clock.advance_us(1)
    tl.close()
    return written


def test_file_is_chrome_trace_with_labelled_rows(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "tl.{rank}.json"
    written = write_known_timeline(path, clock, rank=3)
    real = tmp_path / "tl.3.json"
    events = json.loads(real.read_text())  # valid JSON after close()
    assert isinstance(events, list)
    rows = {e["tid"]: e["args"]["name"] for e in events
            if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(rows.values()) == {"(markers)", "grad.w", "grad.b", "grad.c"}
    assert len(rows) == 4  # one row per tensor plus the marker row
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] == 3 for e in events)
    assert len(spans) == sum(len(v) for v in written.values())
    for e in spans:
        assert e["args"]["bytes"] > 0
    got = {}
    for e in spans:
        got.setdefault((rows[e["tid"]], e["name"]), []).append(e["dur"])
    assert got == {k: [float(x) for x in v] for k, v in written.items()}
    assert [e["args"]["step"] for e in events if e["ph"] == "i"] == [0, 1, 2]


def test_summary_numbers_equal_what_was_written(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "tl.json"
    written = write_known_timeline(path, clock)
    summary = summarize(load_trace(path))
    by_phase: dict[str, list[int]] = {}
    for (_, phase), durs in written.items():
        by_phase.setdefault(phase, []).extend(durs)
    assert [p.phase for p in summary.phases] == [p for p in PHASES if p in by_phase]
    for stats in summary.phases:
        ref = by_phase[stats.phase]
        assert stats.count == len(ref)
        assert stats.total_ms == pytest.approx(sum(ref) / 1e3)
        assert stats.mean_ms == pytest.approx(sum(ref) / len(ref) / 1e3)
        assert stats.max_ms == pytest.approx(max(ref) / 1e3)
    comm = {t: sum(written[(t, "communicate")]) / 1e3 for t in ("grad.w", "grad.b", "grad.c")}
    assert [t.tensor for t in summary.tensors] == sorted(comm, key=comm.get, reverse=True)
    for t in summary.tensors:
        assert t.communicate_ms == pytest.approx(comm[t.tensor])
        assert t.communicate_count == 3
        total = sum(sum(d) for (name, _), d in written.items() if name == t.tensor) / 1e3
        assert t.total_ms == pytest.approx(total)
    assert summary.ranks == [0]
    text = format_summary(summary, top=2)
    assert "communicate" in text and "grad.c" in text and "grad.w" in text
    assert "grad.b" not in text  # only the top 2 tensors are listed
    assert f"{comm['grad.c']:.3f}" in text


def test_a_tensors_total_counts_nested_phases_once(tmp_path: Path, clock: FakeClock) -> None:
    # a compressed tensor's compress and decompress run inside its communicate
    tl = Timeline(str(tmp_path / "t.json"), 0)
    tl.begin("topk.w", "queued")
    clock.advance_us(100)
    tl.end("topk.w", "queued")
    with tl.phase("topk.w", "communicate"):
        with tl.phase("topk.w", "compress"):
            clock.advance_us(300)
        clock.advance_us(500)
        with tl.phase("topk.w", "decompress"):
            clock.advance_us(200)
    tl.close()
    summary = summarize(load_trace(tmp_path / "t.json"))
    (t,) = summary.tensors
    assert t.communicate_ms == pytest.approx(1.0)
    assert t.total_ms == pytest.approx(1.1)  # not 1.6: the nested 0.5 ms counted once
    assert {p.phase: p.total_ms for p in summary.phases}["compress"] == pytest.approx(0.3)


def test_unfinished_phase_is_closed_and_marked(tmp_path: Path, clock: FakeClock) -> None:
    tl = Timeline(str(tmp_path / "t.json"), 0)
    tl.begin("stuck", "negotiate")
    clock.advance_us(250)
    tl.close()
    tl.close()  # idempotent
    tl.begin("late", "queued")  # ignored after close, no error
    events = json.loads((tmp_path / "t.json").read_text())
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 1
    assert spans[0]["dur"] == 250.0 and spans[0]["args"]["unfinished"] is True
    summary = summarize(load_trace(tmp_path / "t.json"))
    assert summary.unfinished == 1


def test_nested_same_phase_pairs_last_begin_first(tmp_path: Path, clock: FakeClock) -> None:
    tl = Timeline(str(tmp_path / "t.json"), 0)
    tl.begin("x", "queued")
    clock.advance_us(10)
    tl.begin("x", "queued")
    clock.advance_us(5)
    tl.end("x", "queued")
    clock.advance_us(1)
    tl.end("x", "queued")
    tl.close()
    durs = [e["dur"] for e in json.loads((tmp_path / "t.json").read_text()) if e["ph"] == "X"]
    assert durs == [5.0, 16.0]


def test_end_without_begin_and_bad_arguments_raise(tmp_path: Path) -> None:
    with Timeline(str(tmp_path / "t.json"), 0) as tl:
        with pytest.raises(ValueError, match="without a matching begin"):
            tl.end("never", "communicate")
        with pytest.raises(TypeError, match="tensor_name"):
            tl.begin("", "queued")
        with pytest.raises(TypeError, match="phase"):
            tl.begin("x", None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="args"):
            tl.begin("x", "queued", args=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank"):
        Timeline(str(tmp_path / "u.json"), -1)


def test_invalid_path_gives_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "no_such_dir" / "tl.json"
    with pytest.raises(ValueError, match="cannot write the timeline") as info:
        open_timeline(str(bad), 0)
    assert str(bad) in str(info.value)
    with pytest.raises(ValueError, match="cannot read timeline"):
        load_trace(bad)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not json")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        load_trace(garbage)


def test_null_timeline_is_a_noop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for tl in (open_timeline(None, 0), open_timeline("", 2),
               open_timeline(str(tmp_path / "shared.json"), 1)):  # no {rank}: rank 0 only
        assert isinstance(tl, NullTimeline) and not tl.enabled
        tl.begin("x", "queued", {"a": 1})
        tl.end("x", "queued")
        tl.end("never-begun", "fuse")  # no bookkeeping, so no error either
        tl.instant("cycle")
        tl.close()
    assert list(tmp_path.iterdir()) == []
    assert isinstance(open_timeline(str(tmp_path / "shared.json"), 0), Timeline)
    with pytest.raises(TypeError):
        open_timeline(42, 0)  # type: ignore[arg-type]


def test_threads_marking_at_once_lose_no_events(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    tl = Timeline(str(path), 0)

    def work(i: int) -> None:
        for step in range(200):
            tl.begin(f"t{i}", "queued")
            tl.end(f"t{i}", "queued")
            tl.instant(f"m{i}", {"step": step})

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tl.close()
    events = json.loads(path.read_text())
    assert sum(e["ph"] == "X" for e in events) == 800
    assert sum(e["ph"] == "i" for e in events) == 800


def test_file_of_a_killed_process_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "crash.json"
    script = (
        "import os\n"
        "from dlcomm.engine import timeline as t\n"
        "t.FLUSH_EVERY_EVENTS = 4\n"
        f"tl = t.Timeline({str(path)!r}, 0)\n"
        "for i in range(10):\n"
        "    tl.begin('g', 'communicate'); tl.end('g', 'communicate')\n"
        "os._exit(0)\n"  # no close(), no atexit: like a crash
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    text = path.read_text()
    assert not text.rstrip().endswith("]")
    events = json.loads(text + "]")  # what Perfetto's tolerant loader does
    assert sum(e["ph"] == "X" for e in events) > 10 - 4  # at most one unflushed batch lost
    summary = summarize(load_trace(path))
    assert summary.phases[0].phase == "communicate"
    assert summary.phases[0].count == sum(e["ph"] == "X" for e in events)


def test_plot_writes_png(tmp_path: Path, clock: FakeClock) -> None:
    write_known_timeline(tmp_path / "tl.json", clock)
    out = plot_timeline(load_trace(tmp_path / "tl.json"), tmp_path / "tl.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="does not exist"):
        plot_timeline(load_trace(tmp_path / "tl.json"), tmp_path / "nope" / "x.png")
    with pytest.raises(ValueError, match="no phases"):
        plot_timeline(Trace(), tmp_path / "empty.png")


def test_two_ranks_write_one_file_each(tmp_path: Path) -> None:
    pattern = str(tmp_path / "tl.{rank}.json")
    run_mpi(2, f"""
        from mpi4py import MPI
        from dlcomm.engine.timeline import open_timeline
        rank = MPI.COMM_WORLD.Get_rank()
        tl = open_timeline({pattern!r}, rank)
        for i in range(rank + 1):
            tl.begin("grad", "communicate")
            MPI.COMM_WORLD.Barrier()
            tl.end("grad", "communicate")
        if rank == 0:
            MPI.COMM_WORLD.Barrier()
        tl.close()
    """, tmp_path, timeout=60)
    files = sorted(tmp_path.glob("tl.*.json"))
    assert [f.name for f in files] == ["tl.0.json", "tl.1.json"]
    summary = summarize(load_trace(files))
    assert summary.ranks == [0, 1]
    assert summary.phases[0].count == 3  # rank 0 once, rank 1 twice


def test_args_that_json_cannot_encode_are_converted(tmp_path: Path) -> None:
    import numpy as np

    with Timeline(str(tmp_path / "t.json"), 0) as tl:
        tl.begin("g", "compress", {"k": np.int64(7), "ratio": np.float32(0.5),
                                   "dtype": np.dtype("float32")})
        tl.end("g", "compress")
    (span,) = [e for e in json.loads((tmp_path / "t.json").read_text()) if e["ph"] == "X"]
    assert span["args"] == {"k": 7, "ratio": 0.5, "dtype": "float32"}


def test_timeline_range_marks_training_spans_next_to_communication(tmp_path: Path) -> None:
    pattern = str(tmp_path / "tl.{rank}.json")
    run_mpi(2, """
        import numpy as np
        import dlcomm
        dlcomm.init()
        for _ in range(2):
            with dlcomm.timeline_range("backward"):
                out = dlcomm.allreduce(np.ones(4, np.float32), name="grad")
        try:
            with dlcomm.timeline_range(""):
                pass
        except ValueError as exc:
            assert "non-empty" in str(exc)
        else:
            raise AssertionError("empty name accepted")
        dlcomm.shutdown()
    """, tmp_path, timeout=120, env={"DLCOMM_TIMELINE": pattern})
    trace = json.loads((tmp_path / "tl.0.json").read_text())
    rows = {e["tid"]: e["args"]["name"] for e in trace
            if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [(rows[e["tid"]], e["name"]) for e in trace if e.get("ph") == "X"]
    assert spans.count(("(training)", "backward")) == 2
    assert ("grad", "communicate") in spans
