"""Import an optional framework for a test module: a skip with a reason on a developer's
machine, a hard failure in CI, where every adapter's tests must run for real.

CI is recognised by the ``CI`` environment variable (GitHub Actions, GitLab CI and most
others set ``CI=true``); ``CI`` unset, empty, ``0`` or ``false`` means "not CI".
Use it at the top of a test module, in place of ``pytest.importorskip``::

    from framework_required import require_framework
    tf = require_framework("tensorflow", install="make install-tensorflow")
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

_FALSE_VALUES = {"", "0", "false", "no", "off"}


def running_in_ci() -> bool:
    """True when the ``CI`` environment variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() not in _FALSE_VALUES


def require_framework(module: str, install: str | None = None) -> ModuleType:
    """Import ``module`` and return it; if it cannot be imported, fail the test module in CI
    (``CI`` set) and skip it elsewhere, with the import error and how to install it.

    Call at module level: the skip or failure then covers every test in the file.
    """
    if not isinstance(module, str) or not module:
        raise TypeError(f"module must be a non-empty str, got {module!r}")
    if install is not None and not isinstance(install, str):
        raise TypeError(f"install must be a str (a command) or None, got {install!r}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # ModuleNotFoundError and broken installs alike
        hint = f"; install it with `{install}`" if install else ""
        reason = f"{module} is not importable ({type(exc).__name__}: {exc}){hint}"
        if running_in_ci():
            pytest.fail(f"CI is set, so a missing framework is a failure: {reason}",
                        pytrace=False)
        pytest.skip(reason, allow_module_level=True)
        raise  # unreachable: pytest.skip raises
