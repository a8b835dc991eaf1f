"""``dlcommrun``: argument parsing, the mpirun command it builds, real jobs, --check-build,
--emulate wiring (with a fake emulate module) and signal forwarding."""
from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest
from mpi_run import REPO

from dlcomm.launcher import check_build as cb
from dlcomm.launcher import dlcommrun
from dlcomm.launcher.dlcommrun import UsageError, main, parse_args
from dlcomm.launcher.mpirun_command import MALLOC_TUNABLES, build_mpirun_command, last_flag_wins


def launcher_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_dlcommrun(args: list[str], timeout: float = 90) -> subprocess.CompletedProcess:
    """Run the real launcher in a child process (as the console script would)."""
    return subprocess.run(
        [sys.executable, "-m", "dlcomm.launcher.dlcommrun", *args],
        env=launcher_env(), capture_output=True, text=True, timeout=timeout, check=False,
    )


def dry_run(capsys: pytest.CaptureFixture[str], args: list[str]) -> list[str]:
    """The mpirun argv that ``dlcommrun --dry-run args`` prints."""
    assert main(["--dry-run", *args]) == 0
    return shlex.split(capsys.readouterr().out)


# --- parsing -----------------------------------------------------------------------------

def test_parse_own_options_and_command() -> None:
    opts = parse_args(["-np", "4", "-H", "a:2,b:2", "--hostfile", "hf", "-x", "FOO=1",
                       "-x", "BAR", "--verbose", "python", "train.py", "-x", "-np", "9"])
    assert opts.np == 4 and opts.hosts == "a:2,b:2" and opts.hostfile == "hf"
    assert opts.forward_env == ["FOO=1", "BAR"] and opts.verbose
    assert opts.command == ["python", "train.py", "-x", "-np", "9"]  # the command's own
    assert parse_args(["-n", "3", "x"]).np == 3
    assert parse_args(["--np=5", "x"]).np == 5
    assert parse_args(["--hosts=h:1", "-np", "1", "x"]).hosts == "h:1"
    opts = parse_args(["--emulate", "4x1gbit", "--slots-per-host", "2", "x"])
    assert opts.emulate == "4x1gbit" and opts.slots_per_host == 2


def test_unknown_options_pass_through_with_their_values() -> None:
    opts = parse_args(["-np", "2", "--mca", "btl", "self,tcp", "--map-by", "ppr:1:node",
                       "--tag-output", "--report-bindings", "python", "-c", "pass"])
    assert opts.mpirun_args == ["--mca", "btl", "self,tcp", "--map-by", "ppr:1:node",
                                "--tag-output", "--report-bindings"]
    assert opts.command == ["python", "-c", "pass"]
    opts = parse_args(["-np", "2", "--tag-output", "--", "--odd-program-name"])
    assert opts.mpirun_args == ["--tag-output"] and opts.command == ["--odd-program-name"]


@pytest.mark.parametrize("argv,message", [
    (["-np", "0", "x"], "positive integer"),
    (["-np", "-1", "x"], "positive integer"),
    (["-np", "two", "x"], "positive integer"),
    (["-np"], "needs a value"),
    (["-np", "2", "--mca", "btl"], "needs 2 value"),
    (["-np", "2", "-x", "", "x"], "NAME"),
    (["--slots-per-host", "0", "x"], "positive integer"),
])
def test_parse_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_args(argv)
    with pytest.raises(TypeError):
        parse_args("-np 2 x")  # type: ignore[arg-type]


# --- the command it builds ---------------------------------------------------------------

def test_dry_run_prints_the_mpirun_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DLCOMM_FUSION_THRESHOLD", "1024")
    argv = dry_run(capsys, ["-np", "2", "--mca", "btl", "self,tcp", "-x", "FOO=bar",
                            "python", "-c", "print('a b')"])
    expected = build_mpirun_command(
        2, ["python", "-c", "print('a b')"], env=dict(os.environ),
        extra_args=["--mca", "btl", "self,tcp"], forward_env=["FOO=bar"],
    )
    assert argv == expected
    assert argv[:3] == ["mpirun", "-np", "2"]
    assert argv[-3:] == ["python", "-c", "print('a b')"]  # quoted, one word each
    i = argv.index("--mca")
    assert argv[i:i + 3] == ["--mca", "btl", "self,tcp"]
    assert "DLCOMM_FUSION_THRESHOLD" in argv  # forwarded automatically
    assert argv[argv.index("FOO=bar") - 1] == "-x"


def test_user_forwarded_name_is_not_doubled(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", os.environ["PATH"])
    argv = dry_run(capsys, ["-np", "1", "-x", "PATH", "true"])
    assert argv.count("PATH") == 1


def test_root_and_oversubscribe_flags_only_when_needed() -> None:
    cmd = build_mpirun_command(2, ["x"], env={}, is_root=False, cores=4)
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    cmd = build_mpirun_command(8, ["x"], env={}, is_root=True, cores=4)
    assert "--allow-run-as-root" in cmd and "--oversubscribe" in cmd
    assert cmd[cmd.index("--bind-to") + 1] == "none"
    cmd = build_mpirun_command(8, ["x"], env={}, is_root=False, cores=4, hosts="a:4,b:4")
    assert "--oversubscribe" not in cmd
    cmd = build_mpirun_command(8, ["x"], env={}, is_root=False, cores=4,
                               extra_args=["--bind-to", "core"])
    assert cmd.count("--bind-to") == 1 and cmd[cmd.index("--bind-to") + 1] == "core"
    with pytest.raises(ValueError, match="forward_env"):
        build_mpirun_command(1, ["x"], env={}, forward_env=["=1"])


def test_a_users_mca_parameter_replaces_dlcomms_default() -> None:
    """mpirun refuses an MCA parameter listed twice; the user's (later) value wins."""
    cmd = build_mpirun_command(8, ["prog", "--mca", "a", "b"], env={}, is_root=False, cores=4,
                               extra_args=["--mca", "mpi_yield_when_idle", "0"])
    i = cmd.index("mpi_yield_when_idle")
    assert cmd.count("mpi_yield_when_idle") == 1 and cmd[i + 1] == "0"
    assert cmd[-4:] == ["prog", "--mca", "a", "b"]  # the program's own arguments untouched
    # The emulated cluster's flags arrive as extra_args too, before the user's.
    plan = ["--mca", "btl", "self,vader,tcp", "--mca", "mpi_yield_when_idle", "1",
            "--bind-to", "none"]
    cmd = build_mpirun_command(2, ["x"], env={}, is_root=False, cores=2, hosts="h0:1,h1:1",
                               extra_args=[*plan, "-mca", "mpi_yield_when_idle", "0",
                                           "-bind-to", "core"])
    assert cmd.count("mpi_yield_when_idle") == 1
    assert cmd[cmd.index("mpi_yield_when_idle") - 1:][:3] == ["-mca", "mpi_yield_when_idle",
                                                              "0"]
    assert "btl" in cmd and cmd.count("none") == 0 and "core" in cmd


def test_malloc_keeps_its_memory_unless_the_user_set_glibc_tunables() -> None:
    tuned = f"GLIBC_TUNABLES={MALLOC_TUNABLES}"
    for hosts in (None, "a:4,b:4"):  # every rank, on this machine or on real hosts
        cmd = build_mpirun_command(8, ["x"], env={}, is_root=False, cores=4, hosts=hosts)
        assert cmd[cmd.index(tuned) - 1] == "-x"
    # The user's own (an empty one keeps glibc's defaults) is forwarded instead.
    for env, forward in (({"GLIBC_TUNABLES": ""}, ()), ({}, ["GLIBC_TUNABLES=x"]),
                         ({"MALLOC_ARENA_MAX": "2"}, ())):
        cmd = build_mpirun_command(2, ["x"], env=env, is_root=False, cores=4,
                                   forward_env=forward)
        assert (tuned in cmd) == ("MALLOC_ARENA_MAX" in env)
        assert cmd.count("GLIBC_TUNABLES") + cmd.count("GLIBC_TUNABLES=x") == (
            0 if "MALLOC_ARENA_MAX" in env else 1)
        assert ("MALLOC_ARENA_MAX" in cmd) == ("MALLOC_ARENA_MAX" in env)


def test_last_flag_wins_keeps_everything_else_in_order() -> None:
    assert last_flag_wins(["-x", "A", "--mca", "p", "1", "-H", "h", "--mca", "q", "2",
                           "--mca", "p", "3"]) == ["-x", "A", "-H", "h", "--mca", "q", "2",
                                                   "--mca", "p", "3"]
    assert last_flag_wins(["--bind-to", "none", "--bind-to"]) == ["--bind-to", "none",
                                                                   "--bind-to"]
    assert last_flag_wins([]) == []


def test_thread_pools_sized_per_rank_unless_the_user_set_them() -> None:
    cmd = build_mpirun_command(4, ["x"], env={}, is_root=False, cores=2)
    assert {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"} <= set(cmd)
    cmd = build_mpirun_command(2, ["x"], env={}, is_root=False, cores=8)
    assert "OMP_NUM_THREADS=4" in cmd
    cmd = build_mpirun_command(2, ["x"], env={"OMP_NUM_THREADS": "3"}, is_root=False, cores=8)
    assert "OMP_NUM_THREADS" in cmd and "OMP_NUM_THREADS=4" not in cmd  # the user's, forwarded
    cmd = build_mpirun_command(2, ["x"], env={}, is_root=False, cores=8,
                               forward_env=["OPENBLAS_NUM_THREADS=2"])
    assert cmd.count("OPENBLAS_NUM_THREADS=2") == 1 and "OPENBLAS_NUM_THREADS=4" not in cmd
    # Real hosts: how many ranks share a machine is not known here, so nothing is set ...
    cmd = build_mpirun_command(8, ["x"], env={}, is_root=False, cores=4, hosts="a:4,b:4")
    assert not any(a.startswith("OMP_NUM_THREADS") for a in cmd)
    # ... but emulated hosts all share this machine.
    cmd = build_mpirun_command(4, ["x"], env={"DLCOMM_EMULATE": "4x1gbit"}, is_root=False,
                               cores=2, hosts="h0:1,h1:1,h2:1,h3:1")
    assert "OPENBLAS_NUM_THREADS=1" in cmd


# --- errors ------------------------------------------------------------------------------

def test_clear_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-np", "2"]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["python", "x.py"]) == 2
    assert "-np N" in capsys.readouterr().err
    assert main(["-np", "abc", "python"]) == 2
    assert "positive integer" in capsys.readouterr().err
    assert main(["--mpirun", "/nonexistent/mpirun", "-np", "1", "true"]) == 127
    assert "install Open MPI: make install" in capsys.readouterr().err


def test_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--check-build" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert "dlcomm" in capsys.readouterr().out


# --- real jobs ---------------------------------------------------------------------------

# Each rank writes its own file (named by its rank): the ranks' stdout shares one stream, where
# their writes may interleave.
_RANK_FILE = ("import os, sys; path = os.path.join(sys.argv[1], "
              "'rank' + os.environ['OMPI_COMM_WORLD_RANK']); ")


def test_two_rank_job_hello_forwarded_variable_and_exit_code(tmp_path: Path) -> None:
    """One 2-rank job checks three things that do not interfere: the ranks see an MPI world
    of 2, a variable given with -x reaches every rank, and the launcher exits with the job's
    code (each rank writes its file, then all meet at a barrier, then exit 3)."""
    code = _RANK_FILE + ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
                         "open(path, 'w').write(f'<hello {c.Get_rank()} of {c.Get_size()} "
                         "mark=%s>' % os.environ.get('DLCOMM_TEST_MARK')); "
                         "c.Barrier(); sys.exit(3)")
    proc = run_dlcommrun(["-np", "2", "-x", "DLCOMM_TEST_MARK=42", sys.executable, "-c", code,
                          str(tmp_path)])
    assert [(tmp_path / f"rank{r}").read_text() if (tmp_path / f"rank{r}").exists() else None
            for r in range(2)] == ["<hello 0 of 2 mark=42>", "<hello 1 of 2 mark=42>"], \
        proc.stderr
    assert proc.returncode == 3, proc.stderr


def test_sigint_is_forwarded_and_job_ends(tmp_path: Path) -> None:
    marker = f"dlcomm_sigint_test_{uuid.uuid4().hex}"
    code = _RANK_FILE + f"open(path, 'w').close(); import time; time.sleep(120)  # {marker}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlcomm.launcher.dlcommrun", "-np", "2",
         sys.executable, "-c", code, str(tmp_path)],
        env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        started = []
        while len(started) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            started = [r for r in range(2) if (tmp_path / f"rank{r}").exists()]
        assert started == [0, 1], f"ranks did not start: {started}"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        assert code != 0
        time.sleep(0.5)
        left = subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False)
        assert left.stdout.strip() == b"", "ranks still running after SIGINT"
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# --- --check-build -----------------------------------------------------------------------

def test_check_build_lists_frameworks_and_backends(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    assert main(["--check-build"]) == 0
    out = capsys.readouterr().out
    for name in ("PyTorch", "TensorFlow", "MXNet", "MPI", "NCCL", "mpirun"):
        assert name in out
    for name, module in (("PyTorch", "torch"), ("TensorFlow", "tensorflow"),
                         ("MXNet", "mxnet"), ("MPI", "mpi4py")):
        line = next(x for x in out.splitlines() if f"] {name} " in x)
        if importlib.util.find_spec(module) is None:
            assert "[ ]" in line and "not installed" in line
        elif name in ("PyTorch", "MPI"):
            assert "[X]" in line
    mpi_line = next(x for x in out.splitlines() if "] MPI " in x)
    assert "Open MPI" in mpi_line or "MPICH" in mpi_line or "[ ]" in mpi_line


def test_check_build_survives_broken_frameworks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cb, "_PROBES", (
        ("Frameworks", "Missing", "import a_framework_that_is_not_there"),
        ("Frameworks", "Crashing", "import os; os.abort()"),
        ("Frameworks", "Raising", "raise RuntimeError('bad build')"),
        ("Frameworks", "Fine", "detail = 'fine 1.0'"),
    ))
    items = {i.name: i for i in cb.check_build(mpirun="/nonexistent/mpirun")}
    assert not items["Missing"].available and "not installed" in items["Missing"].detail
    assert not items["Crashing"].available and "crashed" in items["Crashing"].detail
    assert not items["Raising"].available and "bad build" in items["Raising"].detail
    assert items["Fine"].available and items["Fine"].detail == "fine 1.0"
    assert not items["mpirun"].available and "Open MPI" in items["mpirun"].detail
    text = cb.format_check_build(list(items.values()), "9.9")
    assert "[X] Fine" in text and "[ ] Crashing" in text and text.startswith("dlcomm 9.9:")


# --- --emulate (fake emulate module) -----------------------------------------------------

class FakeEmulate(types.ModuleType):
    """Stands in for dlcomm.tools.emulation.cluster: records calls, builds no namespaces."""

    def __init__(self, prefix: list[str], hosts_arg: str = "dlc-h0:2,dlc-h1:2") -> None:
        super().__init__("dlcomm.tools.emulation.cluster")
        self.calls: list[tuple] = []
        self.prefix = prefix
        self.hosts = hosts_arg

    def teardown_all(self) -> None:
        self.calls.append(("teardown_all",))

    def parse_spec(self, text: str) -> str:
        if text == "bad":
            raise ValueError("bad spec 'bad': write HOSTSxRATE, e.g. 4x1gbit")
        self.calls.append(("parse_spec", text))
        return f"spec:{text}"

    @contextlib.contextmanager
    def emulated_cluster(self, spec: str, slots_per_host: int = 1, *,  # noqa: ANN201
                         pin_hosts: bool = False):
        self.calls.append(("enter", spec, slots_per_host, *(["pinned"] if pin_hosts else [])))
        try:
            yield types.SimpleNamespace(
                hosts_arg=self.hosts,
                mpirun_args=["--mca", "plm_rsh_agent", "/tmp/fake_rsh"],
                env={"DLCOMM_EMULATE": "2x1gbit"},
                mpirun_prefix=self.prefix,
            )
        finally:
            self.calls.append(("exit",))


@pytest.fixture
def fake_emulate(monkeypatch: pytest.MonkeyPatch) -> FakeEmulate:
    fake = FakeEmulate(prefix=["ip", "netns", "exec", "dlc-h0"])
    monkeypatch.setitem(sys.modules, "dlcomm.tools.emulation.cluster", fake)
    monkeypatch.delenv("DLCOMM_EMULATE", raising=False)
    return fake


def test_emulate_down_tears_down(fake_emulate: FakeEmulate) -> None:
    assert main(["--emulate", "down"]) == 0
    assert fake_emulate.calls == [("teardown_all",)]


def test_emulate_builds_the_command_inside_the_cluster(
    fake_emulate: FakeEmulate, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = dry_run(capsys, ["--emulate", "2x1gbit", "--slots-per-host", "2",
                            "--mca", "btl", "self,tcp", "python", "t.py"])
    assert fake_emulate.calls == [("parse_spec", "2x1gbit"), ("enter", "spec:2x1gbit", 2),
                                  ("exit",)]
    assert argv[:5] == ["ip", "netns", "exec", "dlc-h0", "mpirun"]
    assert argv[argv.index("-np") + 1] == "4"  # from the hosts' slots when -np is not given
    assert argv[argv.index("-H") + 1] == "dlc-h0:2,dlc-h1:2"
    assert "--oversubscribe" not in argv
    assert "DLCOMM_EMULATE" in argv  # the cluster's env is forwarded
    rsh, btl = argv.index("plm_rsh_agent"), argv.index("btl")
    assert rsh < btl < argv.index("t.py")  # cluster args first, then the user's


def test_pin_hosts_reaches_the_cluster_and_needs_emulate(
    fake_emulate: FakeEmulate, capsys: pytest.CaptureFixture[str]
) -> None:
    dry_run(capsys, ["--emulate", "2x1gbit", "--pin-hosts", "python", "t.py"])
    assert ("enter", "spec:2x1gbit", 1, "pinned") in fake_emulate.calls
    assert main(["-np", "2", "--pin-hosts", "python", "t.py"]) == 2
    assert "--pin-hosts needs --emulate" in capsys.readouterr().err


def test_emulate_errors(fake_emulate: FakeEmulate, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--emulate", "bad", "-np", "2", "x"]) == 2
    assert "bad spec" in capsys.readouterr().err
    assert main(["--emulate", "2x1gbit", "-H", "a:1", "-np", "2", "x"]) == 2
    assert "drop -H" in capsys.readouterr().err


def test_emulate_runs_the_job_with_prefix_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A prefix that only sets a variable, and hosts that are this machine: a real run.
    fake = FakeEmulate(prefix=["env", "DLCOMM_PREFIX_RAN=yes"], hosts_arg="localhost:2")
    monkeypatch.setitem(sys.modules, "dlcomm.tools.emulation.cluster", fake)
    monkeypatch.setenv("PYTHONPATH", launcher_env()["PYTHONPATH"])
    seen: list[list[str]] = []
    real_run = dlcommrun.run_forwarding_signals

    def spy(argv: list[str], env: dict[str, str]) -> int:
        seen.append(list(argv))
        assert env["DLCOMM_EMULATE"] == "2x1gbit"
        return real_run([a for a in argv if a not in ("--mca", "plm_rsh_agent",
                                                      "/tmp/fake_rsh")], env)

    monkeypatch.setattr(dlcommrun, "run_forwarding_signals", spy)
    code = ("import os, sys; sys.exit(0 if os.environ.get('DLCOMM_EMULATE') == '2x1gbit' "
            "and os.environ.get('DLCOMM_PREFIX_RAN') == 'yes' else 5)")
    assert main(["--emulate", "2x1gbit", sys.executable, "-c", code]) == 0
    assert seen and seen[0][:2] == ["env", "DLCOMM_PREFIX_RAN=yes"]
    assert fake.calls[-1] == ("exit",)


def test_variables_of_an_enclosing_mpi_job_are_dropped_user_settings_kept() -> None:
    from dlcomm.launcher.dlcommrun import without_enclosing_mpi_job

    env = {"PMIX_NAMESPACE": "x", "PMIX_RANK": "0", "OMPI_MCA_ess": "singleton",
           "OMPI_MCA_orte_launch": "1", "OMPI_APP_CTX_NUM_PROCS": "1",
           "ORTE_SCHIZO_DETECTION": "ORTE", "OMPI_MCA_btl": "self,tcp",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "PATH": "/bin"}
    assert without_enclosing_mpi_job(env) == {"OMPI_MCA_btl": "self,tcp",
                                              "OMPI_ALLOW_RUN_AS_ROOT": "1", "PATH": "/bin"}


def test_dlcommrun_from_a_process_that_initialised_mpi_starts_its_own_job(tmp_path) -> None:
    """A test or tool that called MPI_Init (a singleton) and then runs dlcommrun: the child
    inherits the singleton's PMIx variables, and mpirun used to exit 1 without a word
    (test_bench_kfac's tiny run failed so in the full suite, after in-process MPI tests)."""
    import subprocess
    import sys

    script = ("from mpi4py import MPI\n"
              "import subprocess, sys\n"
              "p = subprocess.run(['dlcommrun', '-np', '2', sys.executable, '-c', "
              "'print(\"rank up\")'], capture_output=True, text=True, timeout=120)\n"
              "print(p.returncode, p.stdout.count('rank up'))\n"
              "sys.stderr.write(p.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path)
    assert proc.stdout.split() == ["0", "2"], (proc.stdout, proc.stderr)
