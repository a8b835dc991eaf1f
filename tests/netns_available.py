"""Whether real emulated clusters (``dlcommrun --emulate``) can run here: root, iproute2 and
network namespaces. ``needs_netns`` skips a test with the reason where they cannot."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def namespaces_available() -> str | None:
    """None when real emulation can run here, else the reason to skip."""
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = "dlc-probe-test"
    added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, timeout=10)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    if added.returncode != 0:
        return f"`ip netns add` fails here: {added.stderr.decode().strip()}"
    return None


SKIP_REASON = namespaces_available()
needs_netns = pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))
