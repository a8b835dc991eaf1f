"""``dlcommrun --min-np N --max-np M``: an elastic job that survives lost workers and hosts.

MPI cannot lose a rank and go on, so an elastic job does not run under mpirun: the driver
starts one process per slot itself (on an emulated host through its ``dlc-nsrun``), serves
the rendezvous through which they form rounds (``rendezvous_server``), and watches them.
When a worker exits with an error, its slot is retired and the rest re-form without it;
a worker that does not rejoin within the join timeout is stopped; hosts that a discovery
script adds (or lists again after dropping them) get workers, up to ``--max-np``. The job
ends when its workers have finished, or fails when fewer than ``--min-np`` remain for
``--elastic-timeout`` seconds. Every event is logged to stderr with its time.
"""
from __future__ import annotations

import dataclasses
import itertools
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dlcomm.comm.rendezvous import RENDEZVOUS_ENV, WORKER_ENV
from dlcomm.launcher.rendezvous_server import Place, Rendezvous, RendezvousServer

DISCOVERY_PERIOD_S = 1.0
_POLL_S = 0.05
_ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@dataclasses.dataclass
class ElasticOptions:
    """The elastic part of a dlcommrun command line."""

    min_np: int
    max_np: int
    np: int
    hosts: list[tuple[str, int]]  # static hosts (-H or the emulated cluster)
    discovery_script: str | None = None
    join_timeout_s: float = 10.0
    elastic_timeout_s: float = 600.0


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``host1:2,host2`` (or discovery-script lines ``host:slots``) as (host, slots)."""
    hosts = []
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        name, colon, slots = item.partition(":")
        if not name or (colon and (not slots.isdigit() or int(slots) < 1)):
            raise ValueError(f"bad host entry {item!r}: expected HOST or HOST:SLOTS")
        hosts.append((name, int(slots) if slots else 1))
    return hosts


def discover_hosts(script: str, timeout_s: float = 10.0) -> list[tuple[str, int]] | None:
    """The hosts the discovery script prints now; None when it failed (keep the last)."""
    try:
        proc = subprocess.run([script], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        return parse_hosts(proc.stdout)
    except ValueError:
        return None


@dataclasses.dataclass
class _Worker:
    worker_id: str
    place: Place
    proc: subprocess.Popen


class ElasticDriver:
    """Starts, watches and re-forms the workers of one elastic job."""

    def __init__(self, opts: ElasticOptions, command: Sequence[str], env: Mapping[str, str],
                 exec_prefix: Callable[[str], list[str] | None],
                 log: Callable[[str], None] | None = None) -> None:
        self.opts, self.command, self.env = opts, list(command), dict(env)
        self.exec_prefix = exec_prefix
        self._started = time.monotonic()
        self._log = log or self._stderr
        self._ids = itertools.count()
        self.workers: dict[str, _Worker] = {}
        self.retired: set[tuple[str, int]] = set()  # slots whose worker failed
        self.finished = 0
        self.failures: list[str] = []
        self.hosts: list[tuple[str, int]] = list(opts.hosts)
        self.rendezvous = Rendezvous(opts.min_np, opts.join_timeout_s)

    def _stderr(self, message: str) -> None:
        print(f"dlcommrun elastic [{time.monotonic() - self._started:7.2f} s] {message}",
              file=sys.stderr, flush=True)

    def run(self) -> int:
        """Run the job to its end; the exit code (0 when the workers finished)."""
        with tempfile.TemporaryDirectory(prefix="dlcomm-elastic-") as tmp:
            path = str(Path(tmp) / "rendezvous.sock")
            server = RendezvousServer(path, self.rendezvous)
            self.env[RENDEZVOUS_ENV] = f"unix:{path}"
            try:
                return self._loop()
            finally:
                for worker in list(self.workers.values()):
                    self._stop(worker, "the job is ending")
                server.close()

    def _loop(self) -> int:
        next_discovery = 0.0
        short_since: float | None = None
        rounds_logged = 0
        while True:
            now = time.monotonic()
            if self.opts.discovery_script and now >= next_discovery:
                self._rediscover()
                next_discovery = now + DISCOVERY_PERIOD_S
            self._reap()
            if not self.workers and self.finished:
                self._log(f"job finished: {self.finished} worker(s) exited with 0"
                          + (f"; failures: {'; '.join(self.failures)}" if self.failures else ""))
                return 0
            self._fill_slots()
            for worker_id in self.rendezvous.take_cut_off():
                worker = self.workers.get(worker_id)
                if worker is not None:
                    self._retire(worker, "could not connect to the other ranks (its link "
                                 "is down or cut)")
            for worker_id in self.rendezvous.form_if_ready():
                worker = self.workers.get(worker_id)
                if worker is not None:
                    self._retire(worker, "did not rejoin within the join timeout "
                                 f"({self.opts.join_timeout_s:g} s)")
            if len(self.rendezvous.formed_at) > rounds_logged:
                rounds_logged = len(self.rendezvous.formed_at)
                self._log_round()
            if len(self.workers) < self.opts.min_np and not self.finished:
                short_since = short_since or now
                if now - short_since > self.opts.elastic_timeout_s:
                    self._log(f"only {len(self.workers)} worker(s) for "
                              f"{self.opts.elastic_timeout_s:g} s, fewer than --min-np "
                              f"{self.opts.min_np}: giving up")
                    return 1
                if not self.workers and not self.opts.discovery_script:
                    self._log("every worker failed and no host can be added: giving up")
                    return 1
            else:
                short_since = None
            time.sleep(_POLL_S)

    def _log_round(self) -> None:
        members = self.rendezvous.members
        places = [self.workers[w].place for w in members if w in self.workers]
        hosts = list(dict.fromkeys(p.host for p in places))  # in rank order, each once
        self._log(f"round {self.rendezvous.round_id} formed: {len(members)} rank(s) on "
                  f"{', '.join(hosts)}")

    # --- workers -----------------------------------------------------------------------------
    def _fill_slots(self) -> None:
        """Start a worker on every free, usable slot (the first round: up to -np); none
        once a worker finished (the job is ending)."""
        if self.finished:
            return
        limit = self.opts.max_np if self.rendezvous.round_id else self.opts.np
        used = {(w.place.host, w.place.slot) for w in self.workers.values()}
        for index, (host, slots) in enumerate(self.hosts):
            for slot in range(slots):
                if len(self.workers) >= limit:
                    return
                if (host, slot) in used or (host, slot) in self.retired:
                    continue
                self._start(Place(host, index, slot))

    def _start(self, place: Place) -> None:
        prefix = self.exec_prefix(place.host)
        if prefix is None:
            self._log(f"FAILURE: cannot start a worker on {place.host}: elastic jobs run on "
                      "this machine or its emulated cluster; its slot is retired")
            self.retired.add((place.host, place.slot))
            return
        worker_id = f"w{next(self._ids)}"
        env = {**self.env, **_ROOT_ENV,
               WORKER_ENV: f"{worker_id}:{place.host}:{place.slot}"}
        argv = [*prefix, *self.command]
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        self.workers[worker_id] = _Worker(worker_id, place, proc)
        self.rendezvous.add_worker(worker_id, place)
        self._log(f"started worker {worker_id} on {place.host} slot {place.slot} "
                  f"(pid {proc.pid}): {shlex.join(self.command)}")

    def _reap(self) -> None:
        for worker in list(self.workers.values()):
            code = worker.proc.poll()
            if code is None:
                continue
            del self.workers[worker.worker_id]
            if code == 0:
                self.finished += 1
                self.rendezvous.remove_worker(worker.worker_id, "finished", failed=False)
                continue
            how = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"code {code}"
            reason = (f"worker {worker.worker_id} on {worker.place.host} slot "
                      f"{worker.place.slot} exited with {how}")
            self.failures.append(reason)
            self._log(f"FAILURE: {reason}; its slot is retired")
            self.retired.add((worker.place.host, worker.place.slot))
            self.rendezvous.remove_worker(worker.worker_id, reason)

    def _retire(self, worker: _Worker, why: str) -> None:
        reason = f"worker {worker.worker_id} on {worker.place.host} slot {worker.place.slot} {why}"
        self.failures.append(reason)
        self._log(f"FAILURE: {reason}; stopping it and retiring its slot")
        self.retired.add((worker.place.host, worker.place.slot))
        self._stop(worker, reason)

    def _stop(self, worker: _Worker, reason: str) -> None:
        self.workers.pop(worker.worker_id, None)
        self.rendezvous.remove_worker(worker.worker_id, reason)
        if worker.proc.poll() is None:
            try:
                worker.proc.kill()
            except ProcessLookupError:
                pass
        try:
            worker.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def _rediscover(self) -> None:
        found = discover_hosts(self.opts.discovery_script or "")
        if found is None or found == self.hosts:
            return
        names = {h for h, _ in found}
        gone = [h for h, _ in self.hosts if h not in names]
        added = [h for h, _ in found if h not in {n for n, _ in self.hosts}]
        self._log(f"hosts now {','.join(f'{h}:{s}' for h, s in found)}"
                  + (f" (added {', '.join(added)})" if added else "")
                  + (f" (removed {', '.join(gone)})" if gone else ""))
        # A host listed again after it was dropped comes back with fresh slots.
        self.retired = {(h, s) for h, s in self.retired if h in names and h not in added}
        for worker in list(self.workers.values()):
            if worker.place.host in gone:
                self._stop(worker, f"host {worker.place.host} was removed by discovery")
        self.hosts = found


def run_elastic(opts: ElasticOptions, command: Sequence[str], env: Mapping[str, str],
                exec_prefix: Callable[[str], list[str] | None]) -> int:
    """Run an elastic job; its exit code. ``exec_prefix(host)``: the argv prefix that runs a
    command on ``host`` ([] here), None for a host the driver cannot reach."""
    check_elastic_options(opts)
    return ElasticDriver(opts, command, env, exec_prefix).run()


def check_elastic_options(opts: ElasticOptions) -> None:
    """ValueError naming the options when they cannot describe a job."""
    if opts.min_np > opts.max_np:
        raise ValueError(f"--min-np {opts.min_np} is larger than --max-np {opts.max_np}")
    if not opts.min_np <= opts.np <= opts.max_np:
        raise ValueError(f"-np {opts.np} must lie between --min-np {opts.min_np} and "
                         f"--max-np {opts.max_np}")
    if not opts.hosts and not opts.discovery_script:
        raise ValueError("an elastic job needs hosts: -H, --host-discovery-script or --emulate")
