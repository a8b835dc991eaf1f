"""The federated runner's knobs (``DLCOMM_FL_*``, see dlcomm/config.py): an argument of the
same name wins over the environment, which wins over the default."""
from __future__ import annotations

import os
from typing import Any

from dlcomm.config import KNOB_BY_NAME


def knob_value(name: str, argument: Any = None) -> Any:
    """The value of knob ``name``: ``argument`` unless None, else ``DLCOMM_<NAME>``, else the
    default; a bad value raises ValueError naming where it came from."""
    knob = KNOB_BY_NAME[name]
    if argument is not None:
        raw, source = argument, f"argument {name}="
    elif knob.env in os.environ:
        raw, source = os.environ[knob.env], f"environment variable {knob.env}"
    else:
        return knob.default
    if not isinstance(raw, str) and isinstance(raw, type(knob.default)):
        return raw
    try:
        return knob.parse(str(raw))
    except ValueError as exc:
        raise ValueError(f"bad value {raw!r} for {source}: {exc}") from None
