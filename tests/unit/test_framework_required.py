"""framework_required: a missing framework skips locally and fails under CI=true."""
import subprocess
import sys

import pytest
from framework_required import require_framework, running_in_ci
from mpi_run import REPO

MISSING = "dlcomm_no_such_framework_xyz"


@pytest.mark.parametrize("value,expected", [
    ("true", True), ("1", True), ("yes", True), ("", False), ("0", False), ("false", False),
    ("FALSE", False), (None, False),
])
def test_running_in_ci_reads_the_ci_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert running_in_ci() is expected


def test_present_module_is_returned(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_framework("json").dumps([1]) == "[1]"


def test_bad_arguments_raise_type_error():
    with pytest.raises(TypeError, match="module"):
        require_framework("")
    with pytest.raises(TypeError, match="install"):
        require_framework("json", install=3)


def _run_module_using_missing_framework(tmp_path, ci: str) -> subprocess.CompletedProcess:
    test_file = tmp_path / "test_uses_missing.py"
    test_file.write_text(
        "from framework_required import require_framework\n"
        f"fw = require_framework({MISSING!r}, install='make install-xyz')\n"
        "def test_never_runs():\n    assert False\n")
    env = {"CI": ci, "PYTHONPATH": str(REPO / "tests"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(test_file)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def test_missing_framework_skips_outside_ci(tmp_path):
    proc = _run_module_using_missing_framework(tmp_path, "")
    # 5 is pytest's "no tests collected": the only module was skipped as a whole
    assert proc.returncode in (0, 5), proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout
    assert "make install-xyz" in proc.stdout


def test_missing_framework_fails_in_ci(tmp_path):
    proc = _run_module_using_missing_framework(tmp_path, "true")
    assert proc.returncode != 0, proc.stdout
    assert "CI is set" in proc.stdout
    assert MISSING in proc.stdout
