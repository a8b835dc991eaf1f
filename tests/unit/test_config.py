"""Knobs: defaults, environment variables, arguments, and errors naming the source."""
import pytest
from mpi_run import REPO

from dlcomm.config import KNOBS, knobs_markdown, load_config, parse_bytes


def test_defaults():
    cfg = load_config(env={})
    assert cfg.fusion_threshold == 64 << 20
    assert cfg.cycle_time == 1.0
    assert cfg.stall_warning_seconds == 60.0
    assert cfg.stall_shutdown_seconds == 0.0


def test_environment_then_argument_wins():
    env = {"DLCOMM_FUSION_THRESHOLD": "32M", "DLCOMM_CYCLE_TIME": "2.5"}
    assert load_config(env=env).fusion_threshold == 32 << 20
    cfg = load_config(env=env, fusion_threshold="1k")
    assert cfg.fusion_threshold == 1024 and cfg.cycle_time == 2.5


@pytest.mark.parametrize("text,value", [("67108864", 64 << 20), ("64MiB", 64 << 20),
                                        ("512k", 512 << 10), ("1G", 1 << 30), ("0", 0)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


def test_bad_values_name_their_source():
    with pytest.raises(ValueError, match="DLCOMM_CYCLE_TIME"):
        load_config(env={"DLCOMM_CYCLE_TIME": "-1"})
    with pytest.raises(ValueError, match="fusion_threshold="):
        load_config(env={}, fusion_threshold="lots")
    with pytest.raises(ValueError, match="valid: auto, mpi, nccl"):
        load_config(env={"DLCOMM_BACKEND": "gloo"})
    with pytest.raises(TypeError, match="unknown dlcomm setting"):
        load_config(env={}, fusion_treshold=1)
    with pytest.raises(TypeError, match="DLCOMM_ALLREDUCE_ALGORITHM"):
        load_config(env={}, allreduce_algorithm="ring")


def test_every_knob_is_in_the_docs_table():
    table = knobs_markdown()
    for knob in KNOBS:
        assert f"`{knob.env}`" in table


def test_docs_knobs_md_holds_the_current_table():
    """docs/knobs.md is regenerated with `make knobs-doc` whenever a knob changes."""

    from dlcomm.config import with_knobs_table

    doc = (REPO / "docs" / "knobs.md").read_text()
    assert knobs_markdown() in doc, "docs/knobs.md is stale: run `make knobs-doc`"
    assert with_knobs_table(doc) == doc
    with pytest.raises(ValueError, match="no knob table"):
        with_knobs_table("# nothing here\n")


def test_importing_dlcomm_does_not_start_mpi():
    """A process that only launches jobs (dlcommrun) must not become an MPI process."""
    import subprocess
    import sys

    code = ("import sys, dlcomm, dlcomm.torch, dlcomm.launcher.dlcommrun; "
            "sys.exit(1 if 'mpi4py.MPI' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
