"""Reading the per-worker event logs of ``elastic_digits`` (one JSON object a line) and
judging a fault run by them: when the job recovered, and whether a committed step was lost."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any


def read_events(directory: str | Path) -> list[dict[str, Any]]:
    """Every worker's events, oldest first (a line being written is skipped)."""
    events = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return sorted(events, key=lambda e: e["time"])


def wait_for_commit(directory: str | Path, step: int, timeout_s: float,
                    poll_s: float = 0.05) -> list[dict[str, Any]]:
    """Wait until some worker committed ``step`` or later; the events so far. TimeoutError
    when none did within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = read_events(directory)
        if any(e["event"] == "commit" and e["step"] >= step for e in events):
            return events
        time.sleep(poll_s)
    raise TimeoutError(f"no worker committed step {step} within {timeout_s:g} s")


def running_workers(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The latest event of each worker whose latest round is the newest one (the workers
    training now), by worker id."""
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        latest[event["worker"]] = event
    done = {w for w, e in latest.items() if e["event"] == "done"}
    return {w: e for w, e in latest.items() if w not in done}


@dataclasses.dataclass(frozen=True)
class Recovery:
    """How a job came through one fault injected at ``fault_time`` (seconds since epoch)."""

    last_commit: int  # the newest step any worker had committed before the fault
    resumed_step: int | None  # the step training resumed from after re-forming
    recovery_s: float | None  # fault to the first step after re-forming
    ranks_after: int | None  # ranks of the round that resumed

    @property
    def committed_step_lost(self) -> bool:
        """True when training resumed before the newest commit (or never resumed)."""
        return self.resumed_step is None or self.resumed_step < self.last_commit


def judge(events: list[dict[str, Any]], fault_time: float) -> Recovery:
    """The ``Recovery`` of the first re-formation after ``fault_time``."""
    commits = [e["step"] for e in events if e["event"] == "commit" and e["time"] <= fault_time]
    after = [e for e in events if e["time"] > fault_time]
    start = next((e for e in after if e["event"] == "start"), None)
    first = next((e for e in after if e["event"] == "first_step"), None)
    return Recovery(
        last_commit=max(commits, default=0),
        resumed_step=None if start is None else start["step"],
        recovery_s=None if first is None else first["time"] - fault_time,
        ranks_after=None if start is None else start["size"],
    )
