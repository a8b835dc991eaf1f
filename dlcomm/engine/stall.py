"""Stall inspector: names the ranks that never submitted a tensor the others wait for."""
from __future__ import annotations

import logging

from dlcomm.engine.negotiation import Coordinator

log = logging.getLogger("dlcomm")

# A request the response cache would serve is announced in full after this long, so the
# coordinator's table (which knows who is missing) sees it.
_ANNOUNCE_AFTER = 1.0


class StallInspector:
    """Warns after ``warning_seconds``; asks for an abort after ``shutdown_seconds``."""

    def __init__(self, warning_seconds: float, shutdown_seconds: float, rank: int) -> None:
        self.warning_seconds = warning_seconds
        self.shutdown_seconds = shutdown_seconds
        self.rank = rank
        self._warned: set[str] = set()
        enabled = [s for s in (warning_seconds, shutdown_seconds) if s > 0]
        self._announce_after = min([_ANNOUNCE_AFTER, *[s / 2 for s in enabled]])

    def should_announce(self, age: float) -> bool:
        """True when a waiting request should leave the cache path for the full table."""
        return age > self._announce_after

    def check(self, coordinator: Coordinator, now: float) -> bool:
        """Log new stalls; return True when the job should abort (same table everywhere)."""
        if self.warning_seconds > 0:
            for name, missing, age in coordinator.stalled(now, self.warning_seconds):
                if name not in self._warned:
                    self._warned.add(name)
                    log.warning(
                        "dlcomm stall on rank %d: '%s' has waited %.0f s for ranks %s, which "
                        "have not submitted it (they may be behind, have diverged in control "
                        "flow, or died). Set DLCOMM_STALL_SHUTDOWN_SECONDS to abort instead.",
                        self.rank, name, age, missing)
        self._warned.intersection_update(coordinator.table)
        return self.shutdown_seconds > 0 and bool(
            coordinator.stalled(now, self.shutdown_seconds))

    @staticmethod
    def abort_message(coordinator: Coordinator) -> str:
        """The abort text; built from the replicated table, so equal on every rank."""
        parts = []
        for name, missing, _ in coordinator.stalled(float("inf"), 0.0):
            parts.append(f"'{name}' (missing ranks {missing})")
        listed = ", ".join(parts) if parts else "(no tensor recorded)"
        return (f"stalled beyond DLCOMM_STALL_SHUTDOWN_SECONDS; ranks stopped waiting for: "
                f"{listed}")
