"""Tests of the emulated cluster (``dlcommrun --emulate``): spec parsing, the ip/tc plan, the
rsh agent, teardown, and a tiny real 2-host run where root and network namespaces exist."""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from netns_available import needs_netns

from dlcomm.launcher.mpirun_command import build_mpirun_command, mpirun_available
from dlcomm.tools.emulation import netns as emulate_netns
from dlcomm.tools.emulation.agent import write_agent_scripts
from dlcomm.tools.emulation.cluster import (
    Cluster,
    EmulationError,
    EmulationSpec,
    emulated_cluster,
    parse_spec,
    teardown_all,
)
from dlcomm.tools.emulation.plan import (
    BRIDGE_NAMESPACE,
    HOST_INTERFACE,
    SUBNET,
    host_core_sets,
    hosts_arg,
    hosts_file_text,
    mpirun_args,
    setup_commands,
    tbf_sizes,
    teardown_commands,
)

# --------------------------------------------------------------------------- spec parsing


@pytest.mark.parametrize(
    "text, hosts, rate_bits, rate_text",
    [
        ("4x1gbit", 4, 10**9, "1gbit"),
        ("2x500mbit", 2, 500 * 10**6, "500mbit"),
        ("3x100mbit", 3, 100 * 10**6, "100mbit"),
        (" 1X2.5Gbit ", 1, 2_500_000_000, "2.5gbit"),
        ("8x64kbit", 8, 64_000, "64kbit"),
    ],
)
def test_parse_spec_accepts_tc_rates(text, hosts, rate_bits, rate_text):
    assert parse_spec(text) == EmulationSpec(hosts=hosts, rate_bits=rate_bits, rate_text=rate_text)


@pytest.mark.parametrize(
    "text",
    ["", "4", "x1gbit", "4x", "0x1gbit", "-1x1gbit", "4x1gb", "4x1gbps", "4x1 g bit",
     "4x0kbit", "251x1gbit", "4y1gbit", "4x1.gbit"],
)
def test_parse_spec_rejects_bad_text_with_an_example(text):
    with pytest.raises(ValueError) as info:
        parse_spec(text)
    assert "e.g. '4x1gbit'" in str(info.value)


def test_parse_spec_rejects_non_strings():
    with pytest.raises(TypeError):
        parse_spec(4)


# --------------------------------------------------------------------------- the ip/tc plan


def test_tbf_sizes_follow_the_measured_minimums():
    assert tbf_sizes(10**9) == (128 * 1024, 4 * 1024 * 1024)
    assert tbf_sizes(100 * 10**6) == (128 * 1024, 4 * 1024 * 1024)
    # Above the minimums: 1 ms of burst and 20 ms of queue at the rate.
    assert tbf_sizes(10 * 10**9) == (1_250_000, 25_000_000)
    with pytest.raises(ValueError):
        tbf_sizes(0)


def test_setup_shapes_every_link_in_both_directions():
    spec = parse_spec("3x1gbit")
    cmds = setup_commands(spec)
    shaped = [(c[2], c[6]) for c in cmds if c[0] == "tc"]
    expected = {(f"dlc-h{i}", HOST_INTERFACE) for i in range(3)}
    expected |= {(BRIDGE_NAMESPACE, f"dlc-p{i}") for i in range(3)}
    assert set(shaped) == expected and len(shaped) == 6
    for cmd in cmds:
        if cmd[0] == "tc":
            assert cmd[cmd.index("rate") + 1] == "1000000000bit"
            assert cmd[cmd.index("burst") + 1] == str(128 * 1024)
            assert cmd[cmd.index("limit") + 1] == str(4 * 1024 * 1024)
            assert "tbf" in cmd


def test_setup_never_touches_the_root_namespace():
    cmds = setup_commands(parse_spec("4x1gbit"))
    for cmd in cmds:
        if cmd[:3] == ["ip", "netns", "add"]:
            assert cmd[3].startswith("dlc-")
        else:
            # every other command names the namespace it acts in
            assert cmd[1] == "-n" and cmd[2].startswith("dlc-"), cmd
    veths = [c for c in cmds if "veth" in c]
    assert len(veths) == 4
    for i, cmd in enumerate(veths):
        assert cmd[2] == BRIDGE_NAMESPACE
        assert cmd[cmd.index("netns") + 1] == f"dlc-h{i}"


def test_setup_addresses_are_distinct_and_in_the_benchmarking_range():
    cmds = setup_commands(parse_spec("5x100mbit"))
    addrs = [c[c.index("add") + 1] for c in cmds if "addr" in c]
    nets = [ipaddress.ip_interface(a) for a in addrs]
    assert len({n.ip for n in nets}) == 5
    for net in nets:
        assert net.ip in ipaddress.ip_network("198.18.0.0/15")
        assert net.ip in ipaddress.ip_network(SUBNET)


def test_hosts_file_maps_every_host_to_its_address():
    text = hosts_file_text(parse_spec("3x1gbit"))
    mapping = {parts[1]: parts[0] for parts in map(str.split, text.splitlines())}
    assert mapping["dlc-h0"] == "198.18.0.1"
    assert mapping["dlc-h2"] == "198.18.0.3"
    assert mapping["localhost"] in ("127.0.0.1", "::1")


def test_hosts_arg_and_mpirun_args():
    spec = parse_spec("2x1gbit")
    assert hosts_arg(spec, 1) == "dlc-h0:1,dlc-h1:1"
    assert hosts_arg(spec, 3) == "dlc-h0:3,dlc-h1:3"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            hosts_arg(spec, bad)
    args = mpirun_args(spec, 1, "/tmp/agent", cores=2)
    pairs = {args[i + 1]: args[i + 2] for i, a in enumerate(args) if a == "--mca"}
    assert pairs["plm_rsh_agent"] == "/tmp/agent"
    assert pairs["btl_tcp_if_include"] == SUBNET
    assert pairs["oob_tcp_if_include"] == SUBNET
    assert pairs["mpi_yield_when_idle"] == "1"
    assert "tcp" in pairs["btl"].split(",")
    assert "--oversubscribe" not in args
    assert "--oversubscribe" in mpirun_args(spec, 3, "/tmp/agent", cores=2)


def test_plan_functions_reject_a_non_spec():
    with pytest.raises(TypeError):
        setup_commands("4x1gbit")


def test_teardown_commands_only_delete_dlc_objects():
    cmds = teardown_commands(["dlc-br", "dlc-h0"], ["dlc-p0"])
    assert cmds == [["ip", "link", "del", "dlc-p0"], ["ip", "netns", "del", "dlc-br"],
                    ["ip", "netns", "del", "dlc-h0"]]
    assert teardown_commands([], []) == []
    with pytest.raises(ValueError):
        teardown_commands(["myns"], [])
    with pytest.raises(ValueError):
        teardown_commands([], ["eth0"])


# --------------------------------------------------------------------------- agent scripts


def test_rsh_agent_drops_ssh_options_and_passes_the_command_string(tmp_path):
    nsrun, rsh = write_agent_scripts(tmp_path)
    # Replace the namespace runner with one that echoes what it was given.
    with open(nsrun, "w") as handle:
        handle.write('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    out = subprocess.run(
        [rsh, "-x", "-o", "StrictHostKeyChecking=no", "-p", "22", "root@dlc-h1",
         "orted", "-mca", "ess", "'env'"],
        capture_output=True, text=True, timeout=10, check=True,
    ).stdout.split("\n")
    assert out[:4] == ["[dlc-h1]", "[/bin/sh]", "[-c]", "[orted -mca ess 'env']"]


def test_nsrun_refuses_hosts_outside_the_emulation(tmp_path):
    nsrun, _ = write_agent_scripts(tmp_path)
    proc = subprocess.run([nsrun, "somehost", "true"], capture_output=True, text=True,
                          timeout=10)
    assert proc.returncode == 255 and "not an emulated host" in proc.stderr


def test_host_core_sets_give_each_host_its_own_cores():
    assert host_core_sets(2, [0, 1]) == [[0], [1]]
    assert host_core_sets(2, [3, 1, 2, 0, 4]) == [[0, 1], [2, 3]]  # core 4 left over
    assert host_core_sets(1, {5, 7}) == [[5, 7]]
    with pytest.raises(ValueError, match="at least one core per emulated host: 4 hosts, 2"):
        host_core_sets(4, [0, 1])
    with pytest.raises(ValueError, match="positive int"):
        host_core_sets(0, [0])


def test_nsrun_runs_each_host_on_its_cores_when_pinned(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_ip = bin_dir / "ip"  # echo what would run instead of entering a namespace
    fake_ip.write_text('#!/bin/sh\necho "$@"\n')
    fake_ip.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    pinned, _ = write_agent_scripts(tmp_path, [[0, 1], [2, 3]])
    for host, cpus in (("dlc-h0", "0,1"), ("dlc-h1", "2,3")):
        out = subprocess.run([pinned, host, "echo", "hi"], capture_output=True, text=True,
                             timeout=10, env=env, check=True).stdout
        assert f"{host} taskset -c {cpus} echo hi" in out, out
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    plain, _ = write_agent_scripts(plain_dir)
    out = subprocess.run([plain, "dlc-h1", "echo", "hi"], capture_output=True, text=True,
                         timeout=10, env=env, check=True).stdout
    assert "taskset" not in out and "dlc-h1 echo hi" in out


def test_agent_scripts_need_an_existing_folder(tmp_path):
    with pytest.raises(ValueError):
        write_agent_scripts(tmp_path / "missing")


# --------------------------------------------------------------------------- privileges


def test_not_root_gives_the_documented_error(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(EmulationError, match="needs root and iproute2"):
        teardown_all()
    with pytest.raises(EmulationError, match="run as root or with sudo"):
        with emulated_cluster(parse_spec("2x1gbit")):
            pass


def test_missing_tools_give_the_documented_error(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "tc" else "/bin/" + name)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(EmulationError, match="missing: tc"):
        teardown_all()


def test_emulated_cluster_validates_before_changing_anything(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(TypeError):
        with emulated_cluster("2x1gbit"):
            pass
    with pytest.raises(ValueError):
        with emulated_cluster(parse_spec("2x1gbit"), slots_per_host=0):
            pass


# --------------------------------------------------------------------------- real runs


# Real runs share the machine-wide names with other emulations (e.g. dlcommrun tests):
# wait for the lock instead of failing.
LOCK_WAIT_S = 60.0


def _dlc_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("dlc-")]


def _root_has_no_emulated_objects() -> bool:
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10)
    addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, timeout=10)
    return ": dlc-" not in links.stdout and " 198.18." not in addrs.stdout


@needs_netns
@pytest.mark.timeout(60)
def test_teardown_all_is_idempotent_and_removes_a_stale_setup():
    with emulate_netns.emulation_lock(LOCK_WAIT_S):
        subprocess.run(["ip", "netns", "add", "dlc-h7"], check=True, timeout=10)
        teardown_all()
        assert "dlc-h7" not in _dlc_namespaces()
        teardown_all()
        teardown_all()
        assert _dlc_namespaces() == []


RANK_SCRIPT = textwrap.dedent(
    """
    import json, socket, sys
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    data = np.arange(1000, dtype=np.float64) * (comm.rank + 1)
    out = np.empty_like(data)
    comm.Allreduce(data, out, op=MPI.SUM)
    names = comm.gather(socket.gethostname(), root=0)
    if comm.rank == 0:
        print(json.dumps({"size": comm.size, "hosts": names, "sum": out.tolist()}), flush=True)
    """
)


@needs_netns
@pytest.mark.timeout(120)
def test_two_emulated_hosts_run_an_allreduce_and_leave_nothing_behind(tmp_path):
    if not mpirun_available():
        pytest.skip("mpirun not found")
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    stale = subprocess.run(["ip", "netns", "add", "dlc-h9"], capture_output=True, timeout=10)
    with emulated_cluster(parse_spec("2x100mbit"), wait_s=LOCK_WAIT_S) as cluster:
        assert isinstance(cluster, Cluster)
        assert stale.returncode != 0 or "dlc-h9" not in _dlc_namespaces()
        assert sorted(_dlc_namespaces()) == ["dlc-br", "dlc-h0", "dlc-h1"]
        assert _root_has_no_emulated_objects()
        env = {**os.environ, **cluster.env}
        cmd = build_mpirun_command(2, [sys.executable, str(script)], hosts=cluster.hosts_arg,
                                   env=env, extra_args=cluster.mpirun_args)
        proc = subprocess.run([*cluster.mpirun_prefix, *cmd], env=env, capture_output=True,
                              text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["size"] == 2
    assert result["hosts"] == ["dlc-h0", "dlc-h1"]  # each rank on its own emulated host
    expected = np.arange(1000, dtype=np.float64) * 1 + np.arange(1000, dtype=np.float64) * 2
    np.testing.assert_array_equal(np.array(result["sum"]), expected)
    assert _dlc_namespaces() == []
    assert _root_has_no_emulated_objects()
    assert not list(emulate_netns.NETNS_ETC.glob("dlc-*"))


@needs_netns
@pytest.mark.timeout(60)
def test_pinned_hosts_run_on_their_own_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    with emulated_cluster(parse_spec("2x100mbit"), wait_s=LOCK_WAIT_S,
                          pin_hosts=True) as cluster:
        assert cluster.core_sets == host_core_sets(2, cores)
        for i, mine in enumerate(cluster.core_sets):
            out = subprocess.run(
                [*cluster.exec_prefix(i), sys.executable, "-c",
                 "import os, socket; print(socket.gethostname(), sorted(os.sched_getaffinity(0)))"],
                capture_output=True, text=True, timeout=30, check=True).stdout
            assert out.strip() == f"dlc-h{i} {mine}"
    with pytest.raises(EmulationError, match="at least one core per emulated host"):
        with emulated_cluster(parse_spec(f"{len(cores) + 1}x100mbit"), wait_s=LOCK_WAIT_S,
                              pin_hosts=True):
            pass


@needs_netns
@pytest.mark.timeout(60)
def test_an_exception_inside_the_block_still_tears_down():
    with pytest.raises(RuntimeError, match="boom"):
        with emulated_cluster(parse_spec("2x100mbit"), wait_s=LOCK_WAIT_S) as cluster:
            # a process left running on an emulated host must not keep it alive
            subprocess.Popen([*cluster.exec_prefix(1), "sleep", "30"])
            raise RuntimeError("boom")
    assert _dlc_namespaces() == []


@needs_netns
@pytest.mark.timeout(150)  # the holder may first wait up to 60 s for another emulation's lock
def test_sigterm_tears_down(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text(textwrap.dedent(
        """
        import subprocess
        from dlcomm.tools.emulation.cluster import emulated_cluster, parse_spec
        with emulated_cluster(parse_spec("2x100mbit"), wait_s=60) as cluster:
            print("up", flush=True)
            subprocess.run([*cluster.exec_prefix(1), "sleep", "30"], timeout=40)
        """
    ))
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        holder.terminate()
        assert holder.wait(timeout=30) != 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert _dlc_namespaces() == []


@needs_netns
@pytest.mark.timeout(60)
def test_a_second_emulation_is_refused_while_one_runs():
    with emulate_netns.emulation_lock(LOCK_WAIT_S):
        with pytest.raises(EmulationError, match="another emulated cluster is running"):
            with emulated_cluster(parse_spec("2x100mbit"), wait_s=0):
                pass


# --------------------------------------------------------------------------- check helpers


def test_tcp_probe_only_uses_emulated_addresses():
    from dlcomm.tools.emulation import tcp_probe as emulate_tcp_probe

    with pytest.raises(ValueError, match="outside 198.18.0.0/15"):
        emulate_tcp_probe.send("127.0.0.1", 45123, 10, 1.0)
    with pytest.raises(ValueError, match="outside 198.18.0.0/15"):
        emulate_tcp_probe.receive("0.0.0.0", 45123, 10, 1.0)
    assert emulate_tcp_probe.main(["bogus"]) == 2


def test_check_size_list_and_report_format():
    from dlcomm.tools.emulation.check import _size_list, format_report

    assert _size_list("1m, 4k,4096,1g") == (1 << 20, 4 << 10, 4096, 1 << 30)
    for bad in ("", "1x", "m", "2"):
        with pytest.raises(ValueError, match="1m,4m"):
            _size_list(bad)
    report = {
        "spec": "4x1gbit", "slots_per_host": 1, "date": "d", "machine": "m",
        "load_average_1min_before": 0.5, "allreduce_algorithm": "Open MPI default",
        "p2p": [{"rate_text": "1gbit", "bits_per_s": 0.95e9, "fraction_of_rate": 0.95}],
        "allreduce": [{"bytes": 1 << 20, "ranks": 4, "seconds": 0.02,
                       "algbw_bytes_per_s": 5e7, "busbw_bytes_per_s": 7.5e7,
                       "fraction_of_rate": 0.6, "correct": True}],
    }
    text = format_report(report)
    assert "| 1gbit | 0.950 | 0.95 |" in text
    assert "| 1048576 | 4 | 20.0 | 50.0 | 75.0 | 0.60 | True |" in text


@needs_netns
@pytest.mark.timeout(120)
def test_emulate_check_runs_end_to_end(tmp_path, capsys):
    if not mpirun_available():
        pytest.skip("mpirun not found")
    from dlcomm.tools.emulation import check as emulate_check

    out = tmp_path / "check.json"
    code = emulate_check.main(["2x100mbit", "--sizes", "4k,64k", "--iters", "1",
                               "--seconds", "0.3", "--wait-s", str(LOCK_WAIT_S),
                               "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert [row["bytes"] for row in report["allreduce"]] == [4096, 65536]
    assert all(row["correct"] and row["ranks"] == 2 for row in report["allreduce"])
    assert report["p2p"][0]["bytes"] > 0
    assert _dlc_namespaces() == []
