"""dlcommrun's elastic options without launching anything: parsing and its errors, what
``--dry-run`` prints, the command lines an elastic job refuses, ``run_elastic``'s checks,
the host lists of ``-H`` and of a discovery script. Jobs that run are tested in tests/tools."""
from __future__ import annotations

from pathlib import Path

import pytest

from dlcomm.launcher import elastic_driver
from dlcomm.launcher.dlcommrun import EXIT_USAGE, UsageError, main, parse_args
from dlcomm.launcher.elastic_driver import (
    ElasticOptions,
    discover_hosts,
    parse_hosts,
    run_elastic,
)

ELASTIC = ["--min-np", "2", "--max-np", "4"]
COMMAND = ["python", "train.py", "--epochs", "3"]


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test here may start workers: a driver that would be built fails the test."""

    class NoDriver:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("the elastic driver was started")

    monkeypatch.setattr(elastic_driver, "ElasticDriver", NoDriver)


# --- parse_args ------------------------------------------------------------------------------

def test_parse_elastic_options() -> None:
    opts = parse_args([*ELASTIC, "--host-discovery-script", "x", "--elastic-timeout", "5",
                       "--join-timeout", "3", *COMMAND])
    assert (opts.min_np, opts.max_np, opts.discovery_script) == (2, 4, "x")
    assert (opts.elastic_timeout, opts.join_timeout) == (5.0, 3.0)
    assert opts.elastic and opts.np is None
    assert opts.command == COMMAND and opts.mpirun_args == []
    inline = parse_args(["--min-np=2", "--max-np=4", "--elastic-timeout=0.5", *COMMAND])
    assert (inline.min_np, inline.max_np, inline.elastic_timeout) == (2, 4, 0.5)


@pytest.mark.parametrize("argv", [
    ["--min-np", "1", "x"], ["--max-np", "3", "x"], ["--host-discovery-script", "d.sh", "x"],
])
def test_any_elastic_option_makes_an_elastic_job(argv: list[str]) -> None:
    assert parse_args(argv).elastic


def test_a_plain_job_is_not_elastic_and_keeps_the_defaults() -> None:
    opts = parse_args(["-np", "2", "x"])
    assert not opts.elastic
    assert (opts.min_np, opts.max_np, opts.discovery_script) == (None, None, None)
    assert (opts.elastic_timeout, opts.join_timeout) == (None, None)  # the driver defaults


@pytest.mark.parametrize("argv,option", [
    (["--min-np", "0", "x"], "--min-np"),
    (["--min-np", "-2", "x"], "--min-np"),
    (["--max-np", "two", "x"], "--max-np"),
    (["--max-np", "1.5", "x"], "--max-np"),
    (["--elastic-timeout", "-1", "x"], "--elastic-timeout"),
    (["--elastic-timeout", "0", "x"], "--elastic-timeout"),
    (["--elastic-timeout", "nan", "x"], "--elastic-timeout"),
    (["--join-timeout", "abc", "x"], "--join-timeout"),
    (["--join-timeout=-3", "x"], "--join-timeout"),
    (["--min-np"], "--min-np"),
    (["--min-np", "1", "--host-discovery-script"], "--host-discovery-script"),
])
def test_bad_elastic_values_name_their_option(argv: list[str], option: str) -> None:
    with pytest.raises(UsageError, match=option):
        parse_args(argv)


# --- main -----------------------------------------------------------------------------------

def test_dry_run_prints_the_elastic_job(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ELASTIC, "--elastic-timeout", "5", "--join-timeout", "3", "--dry-run",
                 *COMMAND]) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("elastic job:")]
    for part in ("min_np=2", "max_np=4", "np=4", "hosts=[('localhost', 4)]",
                 "join_timeout_s=3.0", "elastic_timeout_s=5.0", "discovery_script=None",
                 "command: python train.py --epochs 3"):
        assert part in line, (part, line)
    assert "mpirun" not in out


def test_dry_run_with_np_and_a_discovery_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-np", "3", *ELASTIC, "--host-discovery-script", "/bin/d.sh", "--dry-run",
                 *COMMAND]) == 0
    line = capsys.readouterr().out
    assert line.startswith("elastic job:")
    assert "np=3" in line and "hosts=[]" in line and "discovery_script='/bin/d.sh'" in line


@pytest.mark.parametrize("argv,words", [
    (["--min-np", "3", "--max-np", "2"], ["--min-np 3", "--max-np 2"]),
    (["-np", "5", *ELASTIC], ["-np 5", "--min-np 2", "--max-np 4"]),
    (["-np", "1", *ELASTIC], ["-np 1", "--min-np 2", "--max-np 4"]),
])
def test_inconsistent_rank_counts_are_refused(capsys: pytest.CaptureFixture[str],
                                              argv: list[str], words: list[str]) -> None:
    # Without --dry-run: run_elastic checks before it builds a driver (_no_driver).
    assert main([*argv, *COMMAND]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("dlcommrun: error:")
    for word in words:
        assert word in err, (word, err)


def test_run_elastic_checks_its_options() -> None:
    def options(**changes: object) -> ElasticOptions:
        fields = {"min_np": 2, "max_np": 4, "np": 4, "hosts": [("localhost", 4)], **changes}
        return ElasticOptions(**fields)  # type: ignore[arg-type]

    def run(opts: ElasticOptions) -> int:
        return run_elastic(opts, COMMAND, {}, lambda host: [])

    with pytest.raises(ValueError, match="--min-np 3 is larger than --max-np 2"):
        run(options(min_np=3, max_np=2, np=2))
    with pytest.raises(ValueError, match="-np 5 must lie between --min-np 2 and --max-np 4"):
        run(options(np=5))
    with pytest.raises(ValueError, match="-np 1 must lie between"):
        run(options(np=1))
    with pytest.raises(ValueError, match="needs hosts"):
        run(options(hosts=[]))
    with pytest.raises(AssertionError, match="driver was started"):  # valid: it would run
        run(options(hosts=[], discovery_script="d.sh"))


def test_remote_hosts_need_the_emulated_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ELASTIC, "-H", "otherhost:2", *COMMAND]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "'otherhost'" in err and "--emulate" in err
    # refused before --dry-run prints anything
    assert main([*ELASTIC, "-H", "localhost:2,otherhost:2", "--dry-run", *COMMAND]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and "'otherhost'" in captured.err


def test_elastic_jobs_do_not_take_mpirun_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ELASTIC, "--hostfile", "hosts.txt", "--dry-run", *COMMAND]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--hostfile" in err and "does not run under mpirun" in err
    assert main([*ELASTIC, "--mca", "btl", "self,tcp", "--dry-run", *COMMAND]) == EXIT_USAGE
    assert "--mca btl self,tcp" in capsys.readouterr().err


def test_elastic_job_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--min-np", "2", *COMMAND]) == EXIT_USAGE  # no --max-np, no -np
    assert "--max-np" in capsys.readouterr().err
    assert main([*ELASTIC, "-H", "a:0", *COMMAND]) == EXIT_USAGE  # bad host list
    assert "bad host entry 'a:0'" in capsys.readouterr().err
    assert main(ELASTIC) == EXIT_USAGE
    assert "no command given" in capsys.readouterr().err
    assert main([*ELASTIC, "--min-np", "0", *COMMAND]) == EXIT_USAGE
    assert "--min-np must be a positive integer" in capsys.readouterr().err


# --- host lists ------------------------------------------------------------------------------

def test_parse_hosts() -> None:
    assert parse_hosts("a:2,b\nc:1") == [("a", 2), ("b", 1), ("c", 1)]
    assert parse_hosts(" a:3 ,\n\n b ,") == [("a", 3), ("b", 1)]  # blanks are skipped
    assert parse_hosts("") == []
    assert parse_hosts("a:1,a:2") == [("a", 1), ("a", 2)]  # as written


@pytest.mark.parametrize("text", ["a:0", ":2", "a:x", "a:-1", "a:2:3", "b,a:0", "a:1.5"])
def test_parse_hosts_rejects_bad_entries(text: str) -> None:
    with pytest.raises(ValueError, match="bad host entry"):
        parse_hosts(text)


def _script(tmp_path: Path, body: str, name: str = "discover.sh") -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_discover_hosts_reads_the_scripts_output(tmp_path: Path) -> None:
    script = _script(tmp_path, "printf 'h1:2\\nh2:1\\n'")
    assert discover_hosts(script) == [("h1", 2), ("h2", 1)]
    assert discover_hosts(_script(tmp_path, "true", "empty.sh")) == []


def test_discover_hosts_gives_none_when_the_script_fails(tmp_path: Path) -> None:
    assert discover_hosts(_script(tmp_path, "echo h1:2; exit 1")) is None
    assert discover_hosts(str(tmp_path / "missing.sh")) is None
    assert discover_hosts(_script(tmp_path, "echo h1:zero", "bad.sh")) is None
    not_executable = tmp_path / "plain.sh"
    not_executable.write_text("#!/bin/sh\necho h1:2\n")
    assert discover_hosts(str(not_executable)) is None
    assert discover_hosts(_script(tmp_path, "exec sleep 30", "slow.sh"), timeout_s=0.3) is None
