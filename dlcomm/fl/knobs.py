"""The federated runner's knobs (``DLCOMM_FL_*``, see dlcomm/config.py): an argument of the
same name wins over the environment, which wins over the default (``config.knob_value``)."""
from __future__ import annotations

from dlcomm.config import knob_value

__all__ = ["knob_value"]
