"""Folders of measurements kept between jobs (cost models): where they are, and writing one
file so that a job reading it meanwhile sees the old file or the new one, never half.

Shared by the all-reduce cost model (``DLCOMM_ALLREDUCE_MODEL_CACHE``) and top-k's
hierarchy choice (``DLCOMM_COMPRESSION_COST_CACHE``): a setting names a folder, empty means
``~/.cache/dlcomm/<name>``, ``off`` means keep nothing.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

CACHE_OFF = "off"


def cache_directory(setting: str, name: str) -> Path | None:
    """The folder a cache ``setting`` names: None for ``off``, ``~/.cache/dlcomm/<name>``
    when empty, else the path (``~`` expanded)."""
    text = setting.strip()
    if text.lower() == CACHE_OFF:
        return None
    return Path(text).expanduser() if text else Path.home() / ".cache" / "dlcomm" / name


def write_json_atomic(path: Path, data: Any, indent: int | None = None) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename (atomic). A
    folder that cannot be written (read-only, full) leaves nothing behind: the next job
    measures again."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False,
                                         suffix=".tmp") as f:
            temporary = f.name
            json.dump(data, f, indent=indent)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)
