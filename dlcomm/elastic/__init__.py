"""Elastic training: jobs that survive lost workers and take in new ones (Horovod's
``hvd.elastic``), for jobs started by ``dlcommrun --min-np N --max-np M``."""
from dlcomm.elastic.run import reset, run
from dlcomm.elastic.state import ObjectState, State
from dlcomm.errors import HostsUpdatedInterrupt, PeerLostError

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "PeerLostError", "State", "reset", "run"]
