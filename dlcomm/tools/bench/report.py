"""``dlcomm bench report``: run the benchmark suite and write docs/benchmarks.md.

Each section of the report is one small function ``section_x(ctx) -> Section`` listed in
``SECTIONS``: it starts its jobs with ``run_job`` (a ``dlcommrun`` subprocess running a
``dlcomm bench ...`` action, which writes JSON) and turns the JSON into Markdown. Adding a
section (say ``dlcomm bench train``) is one function and one line in ``SECTIONS``. Every
table carries the exact command, the date and the load; the machine is described once at
the top. A section that fails is reported as failed in the document (and the exit code
says so) without losing the others.
"""
from __future__ import annotations

import datetime
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlcomm.tools.bench import train
from dlcomm.tools.bench.fusion import ASYNC, RAW_CONCAT, RAW_SEPARATE, markdown_fusion
from dlcomm.tools.bench.machine import describe_machine, format_machine, load_average
from dlcomm.tools.bench.plot import plot_busbw
from dlcomm.tools.bench.table import format_ratio, format_us, markdown_table, read_json
from dlcomm.tools.bench.units import format_size
from dlcomm.tools.emulation.netns import EmulationError, require_privileges

EMULATED_SPEC = "4x1gbit"
MODULE_LAUNCHER = "dlcomm.launcher.dlcommrun"  # the dlcommrun console script
MODULE_CLI = "dlcomm.cli.main"  # the dlcomm console script
JOB_TIMEOUT_S = 600.0
EMULATION_BUSY_RETRIES = 40
EMULATION_BUSY_WAIT_S = 8.0  # others run emulated jobs too: catch a gap between them


@dataclass
class ReportContext:
    """Settings shared by every section."""

    np: int
    output: Path  # the Markdown file
    assets: Path  # folder for plots, next to the Markdown file
    workdir: Path  # scratch folder for JSON results
    quick: bool = False  # tiny sizes and counts: checks the plumbing only
    python: str = sys.executable


@dataclass
class Job:
    """One benchmark job the report ran."""

    argv: list[str]
    returncode: int
    output: str
    result: dict[str, Any] | None
    seconds: float
    load_before: tuple | None
    load_after: tuple | None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.result is not None

    def command_text(self, python: str) -> str:
        """The command as a reader would type it: the console scripts ``dlcommrun`` and
        ``dlcomm`` for the modules the report runs, and the JSON file without its
        temporary folder."""
        words = shlex.join(Path(a).name if a.endswith(".json") else a for a in self.argv)
        for module, script in ((MODULE_LAUNCHER, "dlcommrun"), (MODULE_CLI, "dlcomm")):
            words = words.replace(shlex.join([python, "-m", module]), script)
        return words


@dataclass
class Section:
    """A part of the report: Markdown body, whether it succeeded, and headline lines."""

    title: str
    body: str
    ok: bool = True
    headlines: list[str] = field(default_factory=list)


SectionFunction = Callable[[ReportContext], Section]


# --- running jobs ------------------------------------------------------------------------
def bench_argv(ctx: ReportContext, action_args: Sequence[str], json_path: Path,
               emulate: str | None = None, np: int | None = None) -> list[str]:
    """``dlcommrun [-np N | --emulate SPEC] python -m dlcomm.cli.main bench ARGS --json P``."""
    if isinstance(action_args, str):
        raise TypeError("action_args must be a list of strings, e.g. ['allreduce', '-n', '5']")
    launcher = [ctx.python, "-m", MODULE_LAUNCHER]
    placement = ["--emulate", emulate] if emulate else ["-np", str(np or ctx.np)]
    return [*launcher, *placement, ctx.python, "-m", MODULE_CLI, "bench",
            *action_args, "--json", str(json_path)]


def run_job(ctx: ReportContext, argv: Sequence[str], json_path: Path,
            timeout: float = JOB_TIMEOUT_S) -> Job:
    """Run one job (its own process group, killed on timeout); read its JSON if written."""
    json_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    before = load_average()
    start = time.monotonic()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # dlcommrun tears an emulation down on SIGTERM
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        output = (output or "") + f"\n(killed after {timeout:.0f} s)"
        code = 124
    seconds = time.monotonic() - start
    result = read_json(json_path) if json_path.exists() else None
    print(f"  [{seconds:6.1f} s, exit {code}] {shlex.join(argv)}", file=sys.stderr, flush=True)
    return Job(list(argv), code, output or "", result, seconds, before, load_average())


def _load_text(load: Sequence[float] | None) -> str:
    return "unknown" if not load else " / ".join(f"{v:.2f}" for v in load)


def job_preamble(ctx: ReportContext, job: Job) -> str:
    """Command, date, duration and load around a job, as Markdown."""
    date = (job.result or {}).get("date") or datetime.datetime.now().astimezone().isoformat(
        timespec="seconds")
    return (f"```\n{job.command_text(ctx.python)}\n```\n\n"
            f"Run {date}, took {job.seconds:.0f} s; load average (1/5/15 min) before "
            f"{_load_text(job.load_before)}, after {_load_text(job.load_after)}.\n\n")


def job_failure(ctx: ReportContext, job: Job) -> str:
    """Markdown for a job that failed: its command, exit code and the end of its output."""
    tail = "\n".join(job.output.strip().splitlines()[-25:])
    return (f"**Failed** (exit code {job.returncode}):\n\n```\n{job.command_text(ctx.python)}"
            f"\n```\n\n```\n{tail}\n```\n\n")


def _row_at(result: dict[str, Any], nbytes: int) -> dict[str, Any] | None:
    return next((r for r in result["rows"] if r["bytes"] == nbytes), None)


def _time_pair(row: dict[str, Any]) -> str:
    dl, raw = row["dlcomm"], row["mpi4py"]
    if "unavailable" in raw:
        return f"dlcomm {format_us(dl['median_s'])} us (no raw peer: {raw['unavailable']})"
    return (f"dlcomm {format_us(dl['median_s'])} us vs raw mpi4py "
            f"{format_us(raw['median_s'])} us ({format_ratio(row['ratio'])} the raw time, "
            f"paired {format_ratio(row.get('ratio_paired'))})")


# --- sections ----------------------------------------------------------------------------
def section_allreduce_shm(ctx: ReportContext) -> Section:
    """All-reduce bandwidth table on shared memory, dlcomm against raw mpi4py, and a plot."""
    title = f"All-reduce on shared memory ({ctx.np} ranks, one machine)"
    args = (["-b", "4K", "-e", "64K", "-f", "16", "-w", "1", "-n", "2"] if ctx.quick
            else ["-b", "4K", "-e", "64M", "-f", "4", "-w", "1", "-n", "10"])
    job = run_job(ctx, bench_argv(ctx, ["allreduce", *args], ctx.workdir / "ar_shm.json"),
                  ctx.workdir / "ar_shm.json")
    if not job.ok:
        return Section(title, job_failure(ctx, job), ok=False)
    plot = _plot(ctx, [job.result], "allreduce_shm.png",
                 f"all-reduce, {ctx.np} ranks, shared memory")
    largest = job.result["rows"][-1]
    headline = (f"All-reduce on shared memory, {format_size(largest['bytes'])}: "
                f"{_time_pair(largest)}; busbw {largest['dlcomm']['busbw_GBps']:.3f} GB/s.")
    return Section(title, job_preamble(ctx, job) + markdown_table(job.result) + plot,
                   headlines=[headline])


def section_latency(ctx: ReportContext) -> Section:
    """Issue 2's figures: one 4 KiB and one 64 MiB all-reduce, more iterations."""
    title = f"Single-tensor all-reduce: 4 KiB and 64 MiB ({ctx.np} ranks, shared memory)"
    args = (["--sizes", "4K,64K", "-w", "1", "-n", "2"] if ctx.quick
            else ["--sizes", "4K,64M", "-w", "1", "-n", "40", "--block", "10"])
    job = run_job(ctx, bench_argv(ctx, ["allreduce", *args], ctx.workdir / "latency.json"),
                  ctx.workdir / "latency.json")
    if not job.ok:
        return Section(title, job_failure(ctx, job), ok=False)
    headlines = [f"All-reduce {format_size(r['bytes'])} ({ctx.np} ranks, shared memory): "
                 f"{_time_pair(r)}." for r in job.result["rows"]]
    return Section(title, job_preamble(ctx, job) + markdown_table(job.result),
                   headlines=headlines)


def section_fusion(ctx: ReportContext) -> Section:
    """200 async tensors of 40 KB against one concatenated raw call and 200 separate ones."""
    title = f"Tensor fusion: many small async all-reduces ({ctx.np} ranks, shared memory)"
    args = (["--tensors", "20", "-w", "1", "-n", "2"] if ctx.quick
            else ["--tensors", "200", "--tensor-bytes", "40000", "-w", "1", "-n", "30",
                  "--block", "10"])
    job = run_job(ctx, bench_argv(ctx, ["fusion", *args], ctx.workdir / "fusion.json"),
                  ctx.workdir / "fusion.json")
    if not job.ok:
        return Section(title, job_failure(ctx, job), ok=False)
    r = job.result
    peers = r["peers"]
    headline = (f"{r['tensors']} async tensors of {r['tensor_bytes']} bytes: dlcomm "
                f"{peers[ASYNC]['median_s'] * 1e3:.1f} ms, one concatenated raw call "
                f"{peers[RAW_CONCAT]['median_s'] * 1e3:.1f} ms "
                f"({peers[ASYNC]['vs_concatenated']:.2f}x, paired "
                f"{peers[ASYNC]['vs_concatenated_paired']:.2f}x), {r['tensors']} separate "
                f"raw calls "
                f"{peers[RAW_SEPARATE]['median_s'] * 1e3:.1f} ms.")
    note = ("\n`dlcomm async` submits every tensor with `allreduce_async` and then calls "
            "`synchronize` on each; the engine negotiates and fuses them. `mpi4py "
            "concatenated` is one raw `Allreduce` of a buffer already holding all tensors "
            "back to back (the limit fusion can reach); `mpi4py separate` is one raw call per "
            "tensor (no fusion).\n")
    return Section(title, job_preamble(ctx, job) + markdown_fusion(r) + note,
                   headlines=[headline])


def section_collectives_shm(ctx: ReportContext) -> Section:
    """All-gather, reduce-scatter, broadcast and all-to-all on shared memory, short ranges."""
    title = f"Other collectives on shared memory ({ctx.np} ranks)"
    args = (["--sizes", "64K", "-w", "1", "-n", "2"] if ctx.quick
            else ["-b", "64K", "-e", "16M", "-f", "16", "-w", "1", "-n", "10"])
    parts, ok = [], True
    for collective in ("allgather", "reducescatter", "broadcast", "alltoall"):
        path = ctx.workdir / f"{collective}_shm.json"
        job = run_job(ctx, bench_argv(ctx, [collective, *args], path), path)
        parts.append(f"### {collective}\n\n")
        if job.ok:
            parts.append(job_preamble(ctx, job) + markdown_table(job.result) + "\n")
        else:
            ok = False
            parts.append(job_failure(ctx, job))
    note = ("Sizes follow nccl-tests: all-gather's is the gathered output, reduce-scatter's "
            "the input, all-to-all's each rank's send buffer.\n\n")
    return Section(title, note + "".join(parts), ok=ok)


def emulation_unavailable() -> str:
    """Why the emulated cluster cannot run here, or an empty string when it can."""
    try:
        require_privileges()
    except EmulationError as exc:
        return str(exc)
    return ""


def section_allreduce_emulated(ctx: ReportContext) -> Section:
    """All-reduce on the emulated 4-host, 1 Gbit/s cluster (skipped without root or ip)."""
    title = f"All-reduce on the emulated cluster `{EMULATED_SPEC}` (4 hosts, 1 Gbit/s links)"
    why_not = emulation_unavailable()
    if why_not:
        return Section(title, f"Skipped: {why_not}. See docs/emulated_cluster.md.\n")
    args = (["-b", "4K", "-e", "64K", "-f", "16", "-w", "1", "-n", "2"] if ctx.quick
            else ["-b", "4K", "-e", "64M", "-f", "4", "-w", "1", "-n", "6", "--block", "3"])
    path = ctx.workdir / "ar_emulated.json"
    argv = bench_argv(ctx, ["allreduce", *args], path, emulate=EMULATED_SPEC)
    for _ in range(EMULATION_BUSY_RETRIES):
        job = run_job(ctx, argv, path)
        if job.ok or "another emulated cluster is running" not in job.output:
            break
        time.sleep(EMULATION_BUSY_WAIT_S)  # someone else's emulation holds the lock
    if not job.ok:
        return Section(title, job_failure(ctx, job), ok=False)
    plot = _plot(ctx, [job.result], "allreduce_emulated.png",
                 f"all-reduce, emulated {EMULATED_SPEC}")
    largest = job.result["rows"][-1]
    rate_gbps = 1.0 / 8  # 1 Gbit/s in GB/s
    headline = (f"All-reduce on `{EMULATED_SPEC}`, {format_size(largest['bytes'])}: "
                f"{_time_pair(largest)}; busbw {largest['dlcomm']['busbw_GBps']:.3f} GB/s "
                f"(link: {rate_gbps:.3f} GB/s).")
    note = (f"Each host's link is shaped to 1 Gbit/s = {rate_gbps:.3f} GB/s in each direction, "
            "so a ring all-reduce's busbw cannot exceed that; latency is not emulated "
            "(docs/emulated_cluster.md).\n\n")
    return Section(title, note + job_preamble(ctx, job) + markdown_table(job.result) + plot,
                   headlines=[headline])


def section_train(ctx: ReportContext) -> Section:
    """Training throughput of the torch adapter against torch DDP (dense against DDP's
    all-reduce, fp16 and PowerSGD against its hooks), with scaling efficiency against one
    rank: on shared memory, and on the emulated cluster when it is available."""
    title = "Training throughput against torch DDP: dense, fp16 and PowerSGD"
    iters = 2 if ctx.quick else 5
    repeats = 1 if ctx.quick else 3
    settings = train.TrainSettings(model="mlp", iters=iters)
    parts = []
    # PowerSGD only pays where the network is slow: it runs on the emulated cluster only.
    runs = [("shared memory", None, ["none", "fp16"])]
    if not emulation_unavailable():
        runs.append((f"emulated `{EMULATED_SPEC}`", EMULATED_SPEC,
                     ["none", "fp16", "powersgd:rank=4"]))
    for where, emulate, configs in runs:
        load = os.getloadavg()
        try:
            rows = train.measure(ctx.np, configs, ["wfbp"],
                                 replace(settings, emulate=emulate), repeats)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            parts.append(f"### {where}\n\nFailed: {exc}\n")
            continue
        name = f"train_{'emulated' if emulate else 'shm'}.png"
        train.plot(rows, str(ctx.assets / name))
        cmd = (f"dlcomm bench train --np {ctx.np} --model mlp --configs "
               f"\"{';'.join(configs)}\" --iters {iters} --repeats {repeats}"
               + (f" --emulate {emulate}" if emulate else ""))
        parts.append(f"### {where}\n\n    {cmd}\n\nLoad average before: {load[0]:.1f}. "
                     f"Model `mlp` (6.3M parameters, 25 MB of gradients per step), batch 32 "
                     f"per rank, SGD with momentum 0.9. dlcomm / DDP speed: dlcomm's samples/s "
                     f"over torch DDP's (gloo; `fp16_compress_hook` for fp16, `powerSGD_hook` "
                     f"for PowerSGD), ratio of the "
                     f"medians (median of the per-round ratios). Scaling efficiency is N-rank "
                     f"samples/s over N times one rank's.\n\n{train.markdown_table(rows)}\n"
                     f"![{where}]({ctx.assets.name}/{name})\n")
    return Section(title, "\n".join(parts))


SECTIONS: dict[str, SectionFunction] = {
    "allreduce-shm": section_allreduce_shm,
    "latency": section_latency,
    "fusion": section_fusion,
    "collectives-shm": section_collectives_shm,
    "allreduce-emulated": section_allreduce_emulated,
    "train": section_train,
}


def _plot(ctx: ReportContext, results: list[dict[str, Any]], name: str, title: str) -> str:
    """Draw busbw against size into the assets folder; return the Markdown image link."""
    path = plot_busbw(results, ctx.assets / name, title)
    rel = os.path.relpath(path, ctx.output.parent)
    return f"\n![{title}]({rel})\n"


# --- the document ------------------------------------------------------------------------
INTRO = """\
How to read these tables (DESIGN.md, "Measuring"):

- Every figure is a ratio against a peer measured **in the same run**: the raw mpi4py call
  (`comm.Allreduce` and friends) on the same buffers. The peers alternate in blocks of
  iterations (`--block`, each block after its warm-up), so both see nearly the same load;
  dlcomm's engine is shut down during the raw peer's blocks, because even idle it runs a small
  negotiation round every few ms, which slowed raw `Allreduce` by about 15% on the emulated
  network.
- Time: each iteration starts after a barrier; an iteration's time is the slowest rank's; the
  table shows the **median** over iterations.
- algbw = bytes / time; busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather,
  reduce-scatter and all-to-all, x 1 for broadcast (nccl-tests' definitions). GB/s = 10^9 B/s.
- "dlcomm / mpi4py time" is the ratio of the medians; above 1 means dlcomm is slower. "paired
  ratio" is the median over i of dlcomm's i-th time over the raw call's i-th time (taken in
  neighbouring blocks): it pairs the peers under nearly the same load.
- "check" compares each peer's result with a numpy reference (OK / FAIL).
- Commands are shown with the console scripts `dlcommrun` and `dlcomm`; the report runs the
  same modules (`python -m dlcomm.launcher.dlcommrun`, `python -m dlcomm.cli.main`) with
  the interpreter that runs it.
- The machine is shared and has fewer cores than ranks: the load average is written with each
  run, and figures move by tens of percent between runs. Compare within a row, not across runs.
"""


def render(sections: list[Section], machine: dict[str, Any], started: str, seconds: float,
           command: str, load_end: Sequence[float] | None = None) -> str:
    """The whole Markdown document."""
    lines = ["# Benchmarks", "",
             f"Generated by `{command}` (what `make bench` runs) on {started}; "
             f"took {seconds / 60:.1f} min.", "",
             f"Machine: {format_machine(machine)}. Load average (1/5/15 min) "
             f"{_load_text(machine.get('load_average'))} at the start, "
             f"{_load_text(load_end)} at the end.", "", INTRO]
    headlines = [h for s in sections for h in s.headlines]
    failed = [s.title for s in sections if not s.ok]
    if headlines or failed:
        lines += ["## Summary", ""]
        lines += [f"- {h}" for h in headlines]
        lines += [f"- FAILED: {t}" for t in failed]
        lines.append("")
    for s in sections:
        lines += [f"## {s.title}", "", s.body.rstrip(), ""]
    return "\n".join(lines)


def main_report(output: str | Path, *, np: int = 4, only: str | None = None,
                quick: bool = False, list_only: bool = False) -> int:
    """Run the sections (all, or those named in ``only``) and write ``output``.

    Exit code 0 when every section succeeded (a skipped emulation counts as success), 1
    otherwise; the document is written either way.
    """
    if list_only:
        for name, fn in SECTIONS.items():
            print(f"{name:<20} {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    if isinstance(np, bool) or not isinstance(np, int) or np < 2:
        raise ValueError(f"np must be an int >= 2, got {np!r}")
    names = list(SECTIONS) if not only else [s.strip() for s in only.split(",") if s.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        raise ValueError(f"unknown section(s) {unknown}; known: {', '.join(SECTIONS)}")
    out = Path(output)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.monotonic()
    machine = describe_machine()
    with tempfile.TemporaryDirectory(prefix="dlcomm-bench-") as tmp:
        ctx = ReportContext(np=np, output=out, assets=out.parent / out.stem, workdir=Path(tmp),
                            quick=quick)
        sections = []
        for name in names:
            print(f"dlcomm bench report: section {name}", file=sys.stderr, flush=True)
            sections.append(SECTIONS[name](ctx))
    command = "dlcomm bench report --output " + str(output) + (" --quick" if quick else "")
    if only:
        command += f" --only {only}"
    text = render(sections, machine, started, time.monotonic() - t0, command, load_average())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(s.ok for s in sections) else 1
