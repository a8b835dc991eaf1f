"""Exceptions raised by dlcomm. Every failure a user can act on is a ``DLCommError``."""


class DLCommError(RuntimeError):
    """A collective failed: ranks disagree, a rank died or stalled, or dlcomm was shut down."""


class MismatchError(DLCommError):
    """Ranks submitted the same tensor name with different shape, dtype, op or root, or built
    a sync algorithm (DS-Sync, LB-BSP, DLCP) with different settings."""


class StallError(DLCommError):
    """Some ranks never submitted a tensor within DLCOMM_STALL_SHUTDOWN_SECONDS."""


class ShutdownError(DLCommError):
    """dlcomm is not initialised, or was shut down while the request was pending."""


# Horovod's name for a failed collective (``hvd.HorovodInternalError``): the same meaning.
HorovodInternalError = DLCommError


class PeerLostError(DLCommError):
    """A peer rank died or became unreachable during a collective. Under elastic training
    (``dlcomm.<framework>.elastic.run``) the survivors recover from it: they roll back to the
    last committed state and continue on the ranks that remain."""


class HostsUpdatedInterrupt(RuntimeError):
    """The elastic driver added or removed hosts: every rank stops at the same commit and
    re-forms the job. ``skip_sync`` is True when no rank was lost (the committed state is
    still identical everywhere), as in Horovod."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("the elastic driver changed the set of hosts")
        self.skip_sync = skip_sync
