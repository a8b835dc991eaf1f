"""Check the emulated cluster against its configured rate: TCP point-to-point and MPI busbw.

``python -m dlcomm.tools.emulation.check 4x1gbit --p2p-rates 1gbit,2gbit,5gbit`` measures
(a) one TCP stream between two emulated hosts, at the spec's rate and at each extra rate
(a fresh two-host cluster each), and (b) raw mpi4py Allreduce busbw on the spec's cluster,
launched exactly as ``dlcommrun --emulate`` launches (mpirun on host 0, Cluster arguments).
It prints a table with each figure as a fraction of the configured rate; ``--json`` also
writes the raw results. Needs root (see docs/emulated_cluster.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

from dlcomm.comm.machine import local_core_count
from dlcomm.launcher.mpirun_command import build_mpirun_command
from dlcomm.tools.emulation.cluster import Cluster, EmulationError, emulated_cluster, parse_spec
from dlcomm.tools.emulation.plan import EmulationSpec

PROBE_PORT = 45123
DEFAULT_SIZES = (1 << 20, 4 << 20, 16 << 20, 64 << 20)


def measure_p2p(cluster: Cluster, seconds: float = 3.0) -> dict:
    """One TCP stream from host 0 to host 1: ``seconds`` worth of bytes at the configured rate.

    The sender stops after twice ``seconds`` even if the link is slower than configured
    (the ceiling runs), so a run never takes much longer than intended.
    """
    if len(cluster.host_names) < 2:
        raise ValueError("point-to-point needs at least 2 emulated hosts")
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    rate = cluster.spec.rate_bits
    total = int(rate / 8 * seconds)
    send_timeout = seconds * 2
    recv_timeout = seconds * 4 + 10
    probe = [sys.executable, "-m", "dlcomm.tools.emulation.tcp_probe"]
    receiver = subprocess.Popen(
        [*cluster.exec_prefix(1), *probe, "recv", cluster.addresses[1], str(PROBE_PORT),
         str(total), str(recv_timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first_line = receiver.stdout.readline()
        if "listening" not in first_line:
            raise EmulationError(f"TCP probe receiver did not start: {receiver.stderr.read()}")
        sender = subprocess.run(
            [*cluster.exec_prefix(0), *probe, "send", cluster.addresses[1], str(PROBE_PORT),
             str(total), str(send_timeout)],
            capture_output=True, text=True, timeout=recv_timeout,
        )
        if sender.returncode != 0:
            raise EmulationError(f"TCP probe sender failed: {sender.stderr[-2000:]}")
        out, err = receiver.communicate(timeout=recv_timeout + 5)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    result = json.loads(out.strip().splitlines()[-1])
    result.update(rate_bits=rate, rate_text=cluster.spec.rate_text,
                  fraction_of_rate=result["bits_per_s"] / rate)
    return result


def measure_allreduce(
    cluster: Cluster, sizes: tuple[int, ...] = DEFAULT_SIZES, iters: int = 5, timeout: float = 300
) -> list[dict]:
    """Raw mpi4py Allreduce busbw on every slot of ``cluster``, launched as dlcommrun does."""
    np_ = cluster.spec.hosts * cluster.slots_per_host
    argv = [sys.executable, "-m", "dlcomm.tools.emulation.allreduce_probe",
            *map(str, sizes), "--iters", str(iters)]
    env = {**os.environ, **cluster.env}
    cmd = build_mpirun_command(np_, argv, hosts=cluster.hosts_arg, env=env,
                               extra_args=cluster.mpirun_args)
    proc = subprocess.run([*cluster.mpirun_prefix, *cmd], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise EmulationError(f"allreduce probe failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    header, results = rows[0], rows[1:]
    ideal = cluster.spec.rate_bits / 8
    for row in results:
        row.update(ranks=header["ranks"], hosts=len(header["hosts"]),
                   fraction_of_rate=row["busbw_bytes_per_s"] / ideal)
    return results


def _size_list(text: str) -> tuple[int, ...]:
    """Parse ``"1m,4m,64k,4096"`` (k/m/g are binary units) into byte counts."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    sizes = []
    for token in text.split(","):
        token = token.strip().lower()
        scale = units.get(token[-1:], 1)
        digits = token[:-1] if scale > 1 else token
        if not digits.isdigit() or int(digits) * scale < 4:
            raise ValueError(f"bad size {token!r} in {text!r}: write e.g. '1m,4m,16m,64m'")
        sizes.append(int(digits) * scale)
    return tuple(sizes)


def run_checks(spec: EmulationSpec, p2p_rates: list[str], sizes: tuple[int, ...],
               iters: int, seconds: float, slots_per_host: int = 1,
               wait_s: float = 0.0) -> dict:
    """All checks; returns the figures with the date and machine they were taken on."""
    report: dict = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {local_core_count()} cores, "
                   f"kernel {platform.release()}",
        "spec": f"{spec.hosts}x{spec.rate_text}", "slots_per_host": slots_per_host,
        "load_average_1min_before": round(os.getloadavg()[0], 2),
        "allreduce_algorithm": os.environ.get("OMPI_MCA_coll_tuned_allreduce_algorithm",
                                              "Open MPI default"),
        "p2p": [], "allreduce": [],
    }
    with emulated_cluster(spec, slots_per_host, wait_s=wait_s) as cluster:
        if spec.hosts >= 2:
            report["p2p"].append(measure_p2p(cluster, seconds))
        report["allreduce"] = measure_allreduce(cluster, sizes, iters)
    for rate in p2p_rates:
        with emulated_cluster(parse_spec(f"2x{rate}"), wait_s=wait_s) as cluster:
            report["p2p"].append(measure_p2p(cluster, seconds))
    return report


def format_report(report: dict) -> str:
    """Markdown tables of a ``run_checks`` report."""
    lines = [f"Emulator check, {report['spec']} ({report['slots_per_host']} slot(s) per host), "
             f"{report['date']}, {report['machine']}, load average "
             f"{report['load_average_1min_before']}, allreduce algorithm: "
             f"{report['allreduce_algorithm']}", "",
             "| p2p rate | measured Gb/s | fraction of rate |", "|---|---|---|"]
    for row in report["p2p"]:
        lines.append(f"| {row['rate_text']} | {row['bits_per_s'] / 1e9:.3f} | "
                     f"{row['fraction_of_rate']:.2f} |")
    lines += ["", "| allreduce bytes | ranks | time ms | algbw MB/s | busbw MB/s | "
              "busbw / rate | correct |", "|---|---|---|---|---|---|---|"]
    for row in report["allreduce"]:
        lines.append(
            f"| {row['bytes']} | {row['ranks']} | {row['seconds'] * 1e3:.1f} | "
            f"{row['algbw_bytes_per_s'] / 1e6:.1f} | {row['busbw_bytes_per_s'] / 1e6:.1f} | "
            f"{row['fraction_of_rate']:.2f} | {row['correct']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; exit status 1 with a message when the emulation fails."""
    parser = argparse.ArgumentParser(prog="python -m dlcomm.tools.emulation.check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="HOSTSxRATE, e.g. 4x1gbit")
    parser.add_argument("--p2p-rates", default="", help="extra rates for p2p, e.g. 2gbit,5gbit")
    parser.add_argument("--sizes", default="1m,4m,16m,64m", help="allreduce sizes (k/m/g)")
    parser.add_argument("--slots-per-host", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each p2p run")
    parser.add_argument("--wait-s", type=float, default=0.0,
                        help="wait this long for another emulated cluster to finish")
    parser.add_argument("--json", help="also write the raw results to this file")
    args = parser.parse_args(argv)
    try:
        spec = parse_spec(args.spec)
        rates = [r.strip() for r in args.p2p_rates.split(",") if r.strip()]
        for rate in rates:
            parse_spec(f"2x{rate}")
        report = run_checks(spec, rates, _size_list(args.sizes), args.iters, args.seconds,
                            args.slots_per_host, args.wait_s)
    except (ValueError, EmulationError) as exc:
        print(f"emulate_check: {exc}", file=sys.stderr)
        return 1
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
