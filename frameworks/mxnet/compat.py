"""Importing MXNet 1.9.1 (the last release; the project is retired) on today's numpy.

MXNet 1.9.1 reads ``numpy.bool``, an alias numpy removed in 1.24 and brought back with a
different meaning in 2.0; with numpy 2 its C extension and other removed names break it too.
This module puts the alias back (numpy 1.24-1.26 only) before MXNet is imported, and turns
every other failure into an ``ImportError`` that says which environment to use. Every module
of ``dlcomm.mxnet`` imports MXNet through ``import_mxnet()``.
"""
from __future__ import annotations

import warnings
from types import ModuleType

import numpy as np

MXNET_VERSION = "1.9.1"
INSTALL_HINT = ("MXNet 1.9.1 needs numpy < 2: run `make install-mxnet` (a separate "
                "environment, .venv-mxnet, with numpy 1.23.5 and mxnet 1.9.1) and use its python")


def numpy_major_minor() -> tuple[int, int]:
    """numpy's (major, minor) version, e.g. (1, 26)."""
    major, minor = np.__version__.split(".")[:2]
    return int(major), int(minor)


def restore_numpy_bool_alias() -> bool:
    """Define ``numpy.bool`` as the builtin ``bool`` (as numpy < 1.24 did) when it is missing.

    Returns True when the alias was added. numpy 2 defines ``numpy.bool`` itself (as
    ``numpy.bool_``), and it is left alone.
    """
    if "bool" in np.__dict__:
        return False
    np.bool = bool  # type: ignore[attr-defined]
    return True


def import_mxnet() -> ModuleType:
    """Import and return ``mxnet``, shimming numpy first; ``ImportError`` with a fix otherwise."""
    if numpy_major_minor() >= (2, 0):
        raise ImportError(f"dlcomm.mxnet: numpy {np.__version__} is installed; {INSTALL_HINT}")
    restore_numpy_bool_alias()
    try:
        with warnings.catch_warnings():
            # mxnet.numpy.utils reads numpy.bool (numpy warns about its future meaning), and
            # MXNet uses distutils and numpy names removed long ago: noise, not actionable.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)  # distutils, numpy.financial
            import mxnet  # noqa: PLC0415 - optional dependency (its own venv)
    except ImportError as exc:
        raise ImportError(f"dlcomm.mxnet needs mxnet=={MXNET_VERSION} ({exc}); "
                          f"{INSTALL_HINT}") from exc
    return mxnet
