"""Cheap checks of the Horovod peer recipe and fusion benchmark (no Horovod build here).

The patch step runs on fake CMakeLists files; the fusion benchmark's inputs are checked
against a plain numpy sum, and one short 2-rank dlcomm-only run goes through run_mpi.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi_run import run_mpi

from dlcomm.tools.bench import horovod_peer
from dlcomm.tools.bench.horovod_peer import (
    RecipeError,
    fusion_inputs,
    fusion_reference,
    install_horovod,
    patch_cxx_standard,
)

# The lines around the one the recipe patches, as in Horovod 0.28.1's horovod/torch/.
SHIPPED = """\
parse_version(${Pytorch_VERSION} VERSION_DEC)
if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")
    set(CMAKE_CXX_STANDARD 14)
endif()
list(APPEND PYTORCH_SOURCES "x.cc")
"""


def test_patch_raises_14_to_17_and_touches_nothing_else(tmp_path):
    path = tmp_path / "CMakeLists.txt"
    path.write_text(SHIPPED)
    assert patch_cxx_standard(path) is True
    assert path.read_text() == SHIPPED.replace("CMAKE_CXX_STANDARD 14", "CMAKE_CXX_STANDARD 17")


def test_patch_is_idempotent(tmp_path):
    path = tmp_path / "CMakeLists.txt"
    path.write_text(SHIPPED)
    patch_cxx_standard(path)
    once = path.read_text()
    assert patch_cxx_standard(path) is False
    assert path.read_text() == once


def test_patch_leaves_a_higher_standard_alone(tmp_path):
    path = tmp_path / "CMakeLists.txt"
    text = "set( CMAKE_CXX_STANDARD  20 )\n"
    path.write_text(text)
    assert patch_cxx_standard(path) is False
    assert path.read_text() == text


def test_patch_raises_every_low_line(tmp_path):
    path = tmp_path / "CMakeLists.txt"
    path.write_text("set(CMAKE_CXX_STANDARD 11)\nset(CMAKE_CXX_STANDARD   14)\n")
    assert patch_cxx_standard(path)
    assert path.read_text() == "set(CMAKE_CXX_STANDARD 17)\nset(CMAKE_CXX_STANDARD 17)\n"


def test_patch_fails_clearly_when_the_line_is_gone(tmp_path):
    path = tmp_path / "CMakeLists.txt"
    path.write_text("project(horovod)\nset(CMAKE_CXX_FLAGS \"-O3\")\n")
    with pytest.raises(RecipeError, match="CMAKE_CXX_STANDARD"):
        patch_cxx_standard(path)


def test_patch_fails_clearly_when_the_file_is_missing(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        patch_cxx_standard(tmp_path / "nope" / "CMakeLists.txt")


@pytest.mark.parametrize("standard, error", [("17", TypeError), (True, TypeError),
                                             (3, ValueError)])
def test_patch_validates_standard(tmp_path, standard, error):
    with pytest.raises(error):
        patch_cxx_standard(tmp_path / "CMakeLists.txt", standard)


@pytest.mark.parametrize("version, error", [(28, TypeError), ("latest", ValueError),
                                            ("0.28.1; rm", ValueError)])
def test_install_validates_version_before_doing_anything(version, error, monkeypatch):
    monkeypatch.setattr(horovod_peer, "_run_step", lambda *a, **k: pytest.fail("ran a step"))
    with pytest.raises(error):
        install_horovod(version)


def test_install_skips_when_that_version_works(monkeypatch):
    monkeypatch.setattr(horovod_peer, "installed_version", lambda name="horovod": "0.28.1")
    monkeypatch.setattr(horovod_peer, "check_build", lambda python: "ok")
    monkeypatch.setattr(horovod_peer, "_run_step", lambda *a, **k: pytest.fail("rebuilt"))
    assert install_horovod("0.28.1") == "ok"


def test_fusion_reference_equals_a_numpy_sum():
    tensors, nbytes, ranks = 3, 40, 4
    expected = [sum(np.asarray([(i + t) % 4 + r % 3 for i in range(nbytes // 4)], np.float32)
                    for r in range(ranks)) for t in range(tensors)]
    got = fusion_reference(tensors, nbytes, ranks)
    assert len(got) == tensors
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g.numpy(), e)
    assert fusion_inputs(tensors, nbytes, 1)[0].numel() == nbytes // 4


@pytest.mark.parametrize("kwargs, error", [({"tensors": 0}, ValueError),
                                           ({"tensor_bytes": 2}, ValueError),
                                           ({"tensors": 1.5}, TypeError)])
def test_fusion_inputs_validate(kwargs, error):
    args = {"tensors": 2, "tensor_bytes": 40, "rank": 0, **kwargs}
    with pytest.raises(error):
        fusion_inputs(**args)


def test_format_fusion_ratio():
    result = {"tensors": 2, "tensor_bytes": 40, "ranks": 2, "iters": 1, "times": {
        "horovod": {"async": [0.002], "concatenated": [0.001]},
        "dlcomm": {"async": [0.001], "concatenated": [0.001]}}}
    text = horovod_peer.format_fusion(result)
    assert "dlcomm time / horovod time, async: 0.500x" in text
    assert "dlcomm time / horovod time, concatenated: 1.000x" in text


def test_fusion_runs_and_checks_on_two_ranks_dlcomm_only(tmp_path):
    proc = run_mpi(2, """
        from dlcomm.tools.bench.horovod_peer import main
        raise SystemExit(main(["fusion", "--frameworks", "dlcomm", "--tensors", "8",
                               "--tensor-bytes", "400", "--warmup", "1", "--iters", "2"]))
    """, tmp_path, timeout=120)
    table = proc.rank_stdout[0]  # rank 0 prints the times
    assert "dlcomm         async" in table, proc.report()
    assert "dlcomm  concatenated" in table, proc.report()


def test_fusion_rejects_unknown_framework():
    assert horovod_peer.main(["fusion", "--frameworks", "nccl"]) == 2
