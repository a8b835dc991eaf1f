"""Starting and stopping dlcomm's engine between benchmark blocks.

The raw mpi4py peer must not share its process with dlcomm's engine thread: an idle engine
still runs a small negotiation round every few milliseconds, and on the emulated TCP network
that slowed raw ``Allreduce`` by about 15%. A benchmark that started dlcomm itself stops it
for the raw peer's blocks and starts it again for dlcomm's; one run inside a program that
had already initialised dlcomm leaves the engine running (and says so in its results).
"""
from __future__ import annotations

import dlcomm


class EngineSwitch:
    """``start()`` / ``stop()`` dlcomm's engine, stopping only an engine this benchmark owns."""

    def __init__(self) -> None:
        self.owned = not dlcomm.is_initialized()
        dlcomm.init()

    @property
    def raw_peer_engine(self) -> str:
        """How the raw peer ran: ``stopped`` (no engine thread) or ``idle`` (engine running)."""
        return "stopped" if self.owned else "idle"

    def start(self) -> None:
        """Make sure dlcomm is initialised (collective: every rank calls it together)."""
        dlcomm.init()

    def stop(self) -> None:
        """Shut dlcomm down, if this benchmark started it (collective)."""
        if self.owned:
            dlcomm.shutdown()
