"""``dlcommrun``: start a dlcomm job on N ranks through Open MPI's ``mpirun``.

A thin wrapper: it adds only the flags this machine needs (root, oversubscription, the
environment the ranks must see; see ``build_mpirun_command``), passes any option it does not
know to ``mpirun`` untouched, and exits with ``mpirun``'s exit code. ``--emulate`` runs the
job on an emulated cluster with shaped links (the plugin ``EMULATION_PLUGIN`` names).
"""
from __future__ import annotations

import importlib
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version

from dlcomm.launcher.check_build import check_build, format_check_build
from dlcomm.launcher.elastic_driver import (
    ElasticOptions,
    check_elastic_options,
    parse_hosts,
    run_elastic,
)
from dlcomm.launcher.mpirun_command import build_mpirun_command, mpirun_available

USAGE = """\
usage: dlcommrun [-np N] [-H HOST:SLOTS,...] [--hostfile FILE] [-x NAME[=VALUE]]...
                 [--emulate SPEC [--slots-per-host N] [--pin-hosts]] [--dry-run] [--verbose]
                 [--min-np N --max-np M [--host-discovery-script PATH]]
                 [MPIRUN OPTIONS...] [--] COMMAND [ARGS...]
       dlcommrun --check-build
       dlcommrun --emulate down

Run COMMAND on N ranks with Open MPI's mpirun.

options:
  -np N, -n N           number of ranks (required)
  -H, --hosts LIST      hosts and slots, e.g. host1:2,host2:2 (default: this machine)
  --hostfile FILE       Open MPI hostfile
  -x NAME[=VALUE]       forward an environment variable to every rank (repeatable); PATH,
                        LD_LIBRARY_PATH, DLCOMM_*, NCCL_*, CUDA_*, OMP_*, PYTHON* ... are
                        forwarded automatically
  --emulate SPEC        run on an emulated cluster, e.g. 4x1gbit (4 hosts, 1 Gbit/s links);
                        '--emulate down' removes a leftover emulation and exits
  --slots-per-host N    ranks per emulated host (default 1)
  --pin-hosts           with --emulate: give each emulated host its own cores (cores / hosts
                        each), as separate machines have; needs a core per host
  --heterogeneity SPEC  with --emulate: slow hosts and congest links, e.g.
                        cpu=1:0.5,congest=*:100mbit,seed=1, or slow only the compute of
                        host 1's ranks: compute=1:0.5 (docs/heterogeneity.md)
  --min-np N, --max-np M
                        elastic job (docs/fault_tolerance.md): start -np workers (default
                        --max-np), go on while at least N remain, grow to M when hosts are
                        added; the script uses dlcomm.<framework>.elastic. Runs on this
                        machine or its emulated cluster, without mpirun
  --host-discovery-script PATH
                        elastic: a program printing the usable hosts, one HOST:SLOTS a line
                        (run every second)
  --elastic-timeout S   elastic: give up after S seconds with fewer than --min-np workers
                        (default 600)
  --join-timeout S      elastic: stop a worker that has not rejoined S seconds after the
                        first survivor did (default 10)
  --mpirun PATH         the mpirun to use (default: mpirun on PATH)
  --dry-run             print the mpirun command and exit
  --check-build         print the frameworks and backends dlcomm can use and exit
  --verbose             print the mpirun command before running it
  --version             print dlcomm's version and exit
  -h, --help            show this help and exit

Any other option goes to mpirun unchanged (e.g. --mca btl self,tcp). The first argument
that is not an option, or everything after '--', is the command. The exit code is the job's.
"""

# Options of Open MPI 4.x mpirun that take values, so that pass-through keeps a value with
# its option instead of mistaking it for the command. Any other unknown option is passed
# as a flag; write it last or before '--' if it takes a value that is not listed here.
MPIRUN_OPTION_ARITY: dict[str, int] = {
    **{f"{dash}{name}": 2 for dash in ("-", "--") for name in ("mca", "gmca", "omca")},
    **{
        f"{dash}{name}": 1
        for dash in ("-", "--")
        for name in (
            "map-by", "rank-by", "bind-to", "npernode", "npersocket", "ppr", "cpus-per-proc",
            "cpus-per-rank", "cpu-set", "cpu-list", "slot-list", "rankfile", "wdir", "wd",
            "path", "prefix", "preload-files", "output-filename", "stdin", "timeout", "tune",
            "am", "app", "launch-agent", "report-uri", "report-pid", "ompi-server",
            "server-wait-time", "personality", "mindist", "max-vm-size", "default-hostfile",
            "debugger", "output-proctable", "set-cwd-to-session-dir", "xterm", "N",
        )
    },
    "-c": 1,
}

_NP_OPTIONS = ("-np", "-n", "--np")
_HOST_OPTIONS = ("-H", "--hosts", "--host", "-host")
_HOSTFILE_OPTIONS = ("--hostfile", "-hostfile", "--machinefile", "-machinefile")
_VALUE_OPTIONS = (
    *_NP_OPTIONS, *_HOST_OPTIONS, *_HOSTFILE_OPTIONS,
    "-x", "--emulate", "--slots-per-host", "--mpirun", "--heterogeneity",
    "--min-np", "--max-np", "--host-discovery-script", "--elastic-timeout", "--join-timeout",
)
_FLAG_OPTIONS = ("--dry-run", "--check-build", "--verbose", "--version", "--pin-hosts", "-h",
                 "--help")

EXIT_USAGE = 2
EXIT_NO_MPIRUN = 127

# The module that runs ``--emulate`` jobs: ``run_emulated(opts, env, launch, error) -> int``.
# Named, not imported: emulation is a tool (dlcomm.tools) that depends on the launcher.
EMULATION_PLUGIN = "dlcomm.tools.emulation.launch"


class UsageError(ValueError):
    """The command line is wrong; the message says how to fix it."""


@dataclass
class LaunchOptions:
    """A parsed dlcommrun command line."""

    np: int | None = None
    hosts: str | None = None
    hostfile: str | None = None
    forward_env: list[str] = field(default_factory=list)
    mpirun_args: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    emulate: str | None = None
    heterogeneity: str | None = None
    slots_per_host: int = 1
    pin_hosts: bool = False
    mpirun: str = "mpirun"
    dry_run: bool = False
    check_build: bool = False
    verbose: bool = False
    show_version: bool = False
    show_help: bool = False
    min_np: int | None = None
    max_np: int | None = None
    discovery_script: str | None = None
    elastic_timeout: float | None = None
    join_timeout: float | None = None

    @property
    def elastic(self) -> bool:
        """True for an elastic job (any of the elastic options given)."""
        return any(v is not None for v in (self.min_np, self.max_np, self.discovery_script,
                                           self.elastic_timeout, self.join_timeout))


def _positive_int(option: str, text: str) -> int:
    """``text`` as a positive int, or a UsageError naming ``option``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(text).strip().startswith("+"):
        raise UsageError(f"{option} must be a positive integer, got {text!r}")
    return value


def _positive_seconds(option: str, text: str) -> float:
    """``text`` as a positive number of seconds, or a UsageError naming ``option``."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise UsageError(f"{option} must be a positive number of seconds, got {text!r}")
    return value


def _apply_value(opts: LaunchOptions, option: str, value: str) -> None:
    """Store the value of one of dlcommrun's own options."""
    if option in _NP_OPTIONS:
        opts.np = _positive_int("-np", value)
    elif option in _HOST_OPTIONS:
        if not value:
            raise UsageError("-H needs a host list, e.g. -H host1:2,host2:2")
        opts.hosts = value
    elif option in _HOSTFILE_OPTIONS:
        opts.hostfile = value
    elif option == "-x":
        if not value or not value.split("=", 1)[0] or value.startswith("-"):
            raise UsageError(f"-x needs NAME or NAME=VALUE, got {value!r}")
        opts.forward_env.append(value)
    elif option == "--emulate":
        opts.emulate = value
    elif option == "--heterogeneity":
        opts.heterogeneity = value
    elif option == "--slots-per-host":
        opts.slots_per_host = _positive_int("--slots-per-host", value)
    elif option == "--mpirun":
        opts.mpirun = value
    elif option == "--min-np":
        opts.min_np = _positive_int("--min-np", value)
    elif option == "--max-np":
        opts.max_np = _positive_int("--max-np", value)
    elif option == "--host-discovery-script":
        opts.discovery_script = value
    elif option in ("--elastic-timeout", "--join-timeout"):
        seconds = _positive_seconds(option, value)
        if option == "--elastic-timeout":
            opts.elastic_timeout = seconds
        else:
            opts.join_timeout = seconds


def _apply_flag(opts: LaunchOptions, option: str) -> None:
    """Set one of dlcommrun's own flags."""
    if option == "--dry-run":
        opts.dry_run = True
    elif option == "--check-build":
        opts.check_build = True
    elif option == "--verbose":
        opts.verbose = True
    elif option == "--version":
        opts.show_version = True
    elif option == "--pin-hosts":
        opts.pin_hosts = True
    else:
        opts.show_help = True


def parse_args(argv: Sequence[str]) -> LaunchOptions:
    """Parse dlcommrun's command line (without the program name).

    Raises UsageError for a missing option value, a non-positive ``-np``, or no command
    when one is needed.
    """
    if isinstance(argv, str) or not all(isinstance(a, str) for a in argv):
        raise TypeError("argv must be a list of strings (the command line split into words)")
    opts = LaunchOptions()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            opts.command = args[i + 1:]
            break
        if not arg.startswith("-") or arg == "-":
            opts.command = args[i:]
            break
        name, has_inline, inline = arg.partition("=")
        if name in _VALUE_OPTIONS and (has_inline and name.startswith("--") or not has_inline):
            if has_inline:
                value = inline
                i += 1
            elif i + 1 < len(args):
                value = args[i + 1]
                i += 2
            else:
                raise UsageError(f"{name} needs a value")
            _apply_value(opts, name, value)
            continue
        if arg in _FLAG_OPTIONS:
            _apply_flag(opts, arg)
            i += 1
            continue
        arity = 0 if has_inline else MPIRUN_OPTION_ARITY.get(arg, 0)
        if i + arity >= len(args):
            raise UsageError(f"mpirun option {arg} needs {arity} value(s)")
        opts.mpirun_args += args[i:i + 1 + arity]
        i += 1 + arity
    return opts


def _exit_code(returncode: int) -> int:
    """A process's return code as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def run_forwarding_signals(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """Run ``argv`` (a list, no shell), forward SIGINT/SIGTERM to it, return its exit code.

    A Ctrl-C typed at the terminal already reaches ``mpirun`` (it shares our process group),
    so only signals sent to this process alone (``kill``, a batch scheduler) are forwarded;
    forwarding a terminal Ctrl-C as well would make mpirun see it twice and abort harder.
    """
    if isinstance(argv, str) or not argv:
        raise ValueError("argv must be a non-empty list of strings")
    forwarded = (signal.SIGINT, signal.SIGTERM)
    can_wait_info = hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")
    early: list[int] = []

    def _remember(signum: int, _frame: object) -> None:
        early.append(signum)

    previous = {sig: signal.signal(sig, _remember) for sig in forwarded}
    try:
        proc = subprocess.Popen(list(argv), env=dict(env))
        if can_wait_info:
            signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
        try:
            for signum in early:  # arrived between installing handlers and blocking
                _send(proc, signum)
            if can_wait_info:
                _wait_forwarding(proc, forwarded)
            else:  # pragma: no cover - platforms without sigtimedwait
                while proc.poll() is None:
                    for signum in early:
                        _send(proc, signum)
                    early.clear()
                    try:
                        proc.wait(timeout=0.2)
                    except subprocess.TimeoutExpired:
                        pass
            return _exit_code(proc.wait())
        finally:
            if can_wait_info:
                while signal.sigtimedwait(forwarded, 0) is not None:
                    pass  # drop signals that arrived as the job ended
                signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _send(proc: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to ``proc`` if it is still running."""
    if proc.poll() is None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass


def _wait_forwarding(proc: subprocess.Popen, forwarded: tuple[int, ...]) -> None:
    """Wait for ``proc`` while SIGINT/SIGTERM are blocked, forwarding those sent to us."""
    from_terminal = getattr(os, "SI_KERNEL", 0x80)  # si_code of tty-generated signals
    while proc.poll() is None:
        info = signal.sigtimedwait(forwarded, 0.1)
        if info is not None and info.si_code != from_terminal:
            _send(proc, info.si_signo)


def _dlcomm_version() -> str:
    """The installed dlcomm version, or 'unknown' when run from an uninstalled tree."""
    try:
        return version("dlcomm")
    except Exception:  # noqa: BLE001 - any metadata problem just means "unknown"
        return "unknown"


def _error(message: str, code: int) -> int:
    """Print ``message`` as a dlcommrun error and return ``code``."""
    print(f"dlcommrun: error: {message}", file=sys.stderr)
    return code


# What Open MPI puts in the environment of a process it started, or of a Python that called
# MPI_Init as a singleton; a new mpirun that inherits them joins that job instead of starting
# its own and exits 1 without a word. User settings (other OMPI_MCA_* variables) are kept.
_ENCLOSING_JOB_PREFIXES = ("PMIX_", "ORTE_", "PRTE_", "OMPI_APP_CTX_", "OMPI_COMM_WORLD_",
                           "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_UNIVERSE_SIZE",
                           "OMPI_FILE_LOCATION", "OMPI_MCA_ess", "OMPI_MCA_orte_",
                           "OMPI_MCA_pmix", "OMPI_MCA_initial_wdir")


def without_enclosing_mpi_job(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of an MPI job this process runs inside, so the
    mpirun dlcommrun starts is a job of its own (a test or tool that initialised MPI and
    then runs ``dlcommrun`` in a subprocess)."""
    return {k: v for k, v in environ.items() if not k.startswith(_ENCLOSING_JOB_PREFIXES)}


def _launch(
    opts: LaunchOptions,
    env: dict[str, str],
    *,
    hosts: str | None,
    extra_args: list[str],
    prefix: Sequence[str] = (),
) -> int:
    """Build the mpirun argv and print it (--dry-run / --verbose) or run it; an elastic job
    goes to the elastic driver instead."""
    if opts.elastic:
        return _launch_elastic(opts, env, hosts=hosts, prefix=prefix)
    if opts.np is None:
        return _error("give the number of ranks with -np N", EXIT_USAGE)
    argv = build_mpirun_command(
        opts.np,
        opts.command,
        hosts=hosts,
        hostfile=opts.hostfile,
        env=env,
        extra_args=extra_args,
        mpirun=opts.mpirun,
        forward_env=opts.forward_env,
    )
    argv = [*prefix, *argv]
    if opts.dry_run:
        print(shlex.join(argv))
        return 0
    if not prefix and not mpirun_available(opts.mpirun):
        return _error(
            f"{opts.mpirun!r} not found on PATH; install Open MPI: make install", EXIT_NO_MPIRUN
        )
    if opts.verbose:
        print(f"dlcommrun: {shlex.join(argv)}", file=sys.stderr, flush=True)
    code = run_forwarding_signals(argv, env)
    if opts.verbose:
        print(f"dlcommrun: job exited with code {code}", file=sys.stderr)
    return code


def _launch_elastic(opts: LaunchOptions, env: dict[str, str], *, hosts: str | None,
                    prefix: Sequence[str]) -> int:
    """Run an elastic job on this machine (``-H localhost:N``, the default) or on the
    emulated cluster (``prefix`` is its ``dlc-nsrun``)."""
    if opts.hostfile or opts.mpirun_args:
        return _error("an elastic job does not run under mpirun: drop --hostfile and mpirun "
                      f"options ({shlex.join(opts.mpirun_args) or '--hostfile'})", EXIT_USAGE)
    max_np = opts.max_np or opts.np
    min_np = opts.min_np or 1
    if max_np is None:
        return _error("an elastic job needs --max-np M (or -np N)", EXIT_USAGE)
    emulated = [prefix[0]] if prefix else []
    if hosts is None and not opts.discovery_script:
        hosts = f"localhost:{max_np}"
    host_list = parse_hosts(hosts) if hosts else []
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    for name, _ in host_list:
        if name not in local and not emulated:
            return _error(f"elastic jobs run on this machine or its emulated cluster "
                          f"(--emulate); {name!r} is neither", EXIT_USAGE)

    def exec_prefix(host: str) -> list[str] | None:
        if host in local:
            return []
        return [*emulated, host] if emulated and host.startswith("dlc-h") else None

    elastic = ElasticOptions(min_np=min_np, max_np=max_np, np=opts.np or max_np,
                             hosts=host_list, discovery_script=opts.discovery_script,
                             join_timeout_s=opts.join_timeout or 10.0,
                             elastic_timeout_s=opts.elastic_timeout or 600.0)
    check_elastic_options(elastic)
    if opts.dry_run:
        print(f"elastic job: {elastic}; command: {shlex.join(opts.command)}")
        return 0
    return run_elastic(elastic, opts.command, env, exec_prefix)


def _run_emulated(opts: LaunchOptions, env: dict[str, str]) -> int:
    """Hand ``--emulate`` to the emulation plugin, found by name (``EMULATION_PLUGIN``): it
    builds the emulated cluster and calls back ``_launch`` with the cluster's hosts, mpirun
    arguments and command prefix. The launcher never imports the tools that emulate."""
    try:
        plugin = importlib.import_module(EMULATION_PLUGIN)
    except ModuleNotFoundError as exc:
        if not EMULATION_PLUGIN.startswith(str(exc.name)):
            raise  # the plugin exists but one of its imports is missing
        return _error(f"--emulate needs {EMULATION_PLUGIN}, which is not installed", EXIT_USAGE)
    return plugin.run_emulated(opts, env, _launch, _error)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (the job's when it ran)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        opts = parse_args(argv)
    except UsageError as exc:
        return _error(f"{exc}\n(see dlcommrun --help)", EXIT_USAGE)
    if opts.show_help:
        print(USAGE, end="")
        return 0
    if opts.show_version:
        print(f"dlcommrun (dlcomm) {_dlcomm_version()}")
        return 0
    if opts.check_build:
        print(format_check_build(check_build(mpirun=opts.mpirun), _dlcomm_version()), end="")
        return 0
    if opts.emulate == "down":
        return _run_emulated(opts, dict(os.environ))
    if opts.heterogeneity and opts.emulate is None:
        return _error("--heterogeneity needs --emulate (it slows emulated hosts and links)",
                      EXIT_USAGE)
    if opts.pin_hosts and opts.emulate is None:
        return _error("--pin-hosts needs --emulate (it gives each emulated host its cores)",
                      EXIT_USAGE)
    if not opts.command:
        return _error(
            "no command given: dlcommrun -np N COMMAND [ARGS...], "
            "e.g. dlcommrun -np 2 python train.py",
            EXIT_USAGE,
        )
    env = without_enclosing_mpi_job(os.environ)
    try:
        if opts.emulate is not None:
            return _run_emulated(opts, env)
        return _launch(opts, env, hosts=opts.hosts, extra_args=opts.mpirun_args)
    except ValueError as exc:
        return _error(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _error("interrupted", 128 + signal.SIGINT)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
