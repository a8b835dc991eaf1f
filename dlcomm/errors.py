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
