"""The emulated cluster as data: its spec, names, addresses and the ip/tc commands that build it.

Everything here is a pure function of an ``EmulationSpec``, so the exact commands that
``dlcommrun --emulate`` runs can be unit-tested without root. ``emulate.py`` executes them.

Layout for ``N x RATE``: namespace ``dlc-br`` holds bridge ``dlc-br0``; namespace ``dlc-h<i>``
is emulated host ``i`` with interface ``dlc-eth0`` (address ``198.18.0.<i+1>/24``), joined to
the bridge by a veth whose bridge end is ``dlc-p<i>``. No end ever lives in the root
namespace, so nothing outside the emulation can reach or be reached by it. Each link is
shaped with tbf twice: on ``dlc-eth0`` (what the host sends) and on ``dlc-p<i>`` (what it
receives).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

NAME_PREFIX = "dlc-"
BRIDGE_NAMESPACE = "dlc-br"
BRIDGE_DEVICE = "dlc-br0"
HOST_INTERFACE = "dlc-eth0"
SUBNET = "198.18.0.0/24"
SUBNET_PREFIX = "198.18.0."
MAX_HOSTS = 250

# tbf sizing found on this machine (issue 4): smaller bursts or queues drop MPI traffic,
# because veth hands tbf 64 KiB GSO packets and MPI sends in bursts of several MiB.
MIN_BURST_BYTES = 128 * 1024
BURST_SECONDS = 0.001
MIN_LIMIT_BYTES = 4 * 1024 * 1024
LIMIT_SECONDS = 0.020

# tc's rate units (SI, bits per second); tc also accepts these spelled out as "bps" (bytes),
# which are deliberately not accepted here to keep one meaning for "1gbit".
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_SPEC_RE = re.compile(r"^\s*(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)
_SPEC_EXAMPLE = "write HOSTSxRATE with a tc rate unit, e.g. '4x1gbit', '2x500mbit' or '3x100mbit'"


@dataclass(frozen=True)
class EmulationSpec:
    """How many emulated hosts and the rate of each host's link (both directions)."""

    hosts: int
    rate_bits: int
    rate_text: str


def parse_spec(text: str) -> EmulationSpec:
    """Parse ``"4x1gbit"`` into ``EmulationSpec(hosts=4, rate_bits=10**9, rate_text="1gbit")``.

    Rates use tc's units (bit, kbit, mbit, gbit, tbit; SI, so 1gbit = 10**9 bit/s).
    Raises ValueError with an example on anything else.
    """
    if not isinstance(text, str):
        raise TypeError(f"emulation spec must be a string, got {type(text).__name__}")
    match = _SPEC_RE.match(text)
    if not match:
        raise ValueError(f"bad emulation spec {text!r}: {_SPEC_EXAMPLE}")
    hosts_text, number_text, unit = match.group(1), match.group(2), match.group(3).lower()
    if unit not in _RATE_UNITS:
        units = ", ".join(_RATE_UNITS)
        raise ValueError(f"bad rate unit {unit!r} in {text!r}: use one of {units}; {_SPEC_EXAMPLE}")
    hosts = int(hosts_text)
    if not 1 <= hosts <= MAX_HOSTS:
        raise ValueError(
            f"emulated hosts must be 1..{MAX_HOSTS}, got {hosts} in {text!r}; {_SPEC_EXAMPLE}"
        )
    rate_bits = round(float(number_text) * _RATE_UNITS[unit])
    if rate_bits < 8000:
        raise ValueError(f"rate in {text!r} is below 8kbit, too slow to shape; {_SPEC_EXAMPLE}")
    return EmulationSpec(hosts=hosts, rate_bits=rate_bits, rate_text=f"{number_text}{unit}")


def _check_spec(spec: EmulationSpec) -> None:
    if not isinstance(spec, EmulationSpec):
        raise TypeError(f"expected an EmulationSpec (see parse_spec), got {type(spec).__name__}")


def host_namespace(index: int) -> str:
    """Network namespace (and hostname) of emulated host ``index``."""
    return f"{NAME_PREFIX}h{index}"


def bridge_port(index: int) -> str:
    """Bridge-side veth of emulated host ``index`` (lives in ``dlc-br``)."""
    return f"{NAME_PREFIX}p{index}"


def host_address(index: int) -> str:
    """IPv4 address of emulated host ``index`` (benchmarking range, inside namespaces only)."""
    return f"{SUBNET_PREFIX}{index + 1}"


def host_names(spec: EmulationSpec) -> list[str]:
    """Hostnames of all emulated hosts, in rank-placement order."""
    _check_spec(spec)
    return [host_namespace(i) for i in range(spec.hosts)]


def tbf_sizes(rate_bits: int) -> tuple[int, int]:
    """(burst, limit) bytes for a tbf at ``rate_bits``: max(128 KiB, 1 ms), max(4 MiB, 20 ms)."""
    if not isinstance(rate_bits, int) or rate_bits <= 0:
        raise ValueError(f"rate_bits must be a positive integer, got {rate_bits!r}")
    rate_bytes = rate_bits / 8
    burst = max(MIN_BURST_BYTES, int(rate_bytes * BURST_SECONDS))
    limit = max(MIN_LIMIT_BYTES, int(rate_bytes * LIMIT_SECONDS))
    return burst, limit


def tbf_command(namespace: str, device: str, rate_bits: int) -> list[str]:
    """tc command that shapes ``device``'s egress in ``namespace`` to ``rate_bits``."""
    burst, limit = tbf_sizes(rate_bits)
    return [
        "tc", "-n", namespace, "qdisc", "replace", "dev", device, "root", "tbf",
        "rate", f"{rate_bits}bit", "burst", str(burst), "limit", str(limit),
    ]


def setup_commands(spec: EmulationSpec) -> list[list[str]]:
    """Every ip/tc command that builds the emulated cluster, in order."""
    _check_spec(spec)
    br = BRIDGE_NAMESPACE
    cmds: list[list[str]] = [
        ["ip", "netns", "add", br],
        ["ip", "-n", br, "link", "add", BRIDGE_DEVICE, "type", "bridge"],
        ["ip", "-n", br, "link", "set", BRIDGE_DEVICE, "up"],
    ]
    for i in range(spec.hosts):
        ns, port = host_namespace(i), bridge_port(i)
        cmds += [
            ["ip", "netns", "add", ns],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", br, "link", "add", port, "type", "veth",
             "peer", "name", HOST_INTERFACE, "netns", ns],
            ["ip", "-n", br, "link", "set", port, "master", BRIDGE_DEVICE],
            ["ip", "-n", br, "link", "set", port, "up"],
            ["ip", "-n", ns, "addr", "add", f"{host_address(i)}/24", "dev", HOST_INTERFACE],
            ["ip", "-n", ns, "link", "set", HOST_INTERFACE, "up"],
            tbf_command(ns, HOST_INTERFACE, spec.rate_bits),
            tbf_command(br, port, spec.rate_bits),
        ]
    return cmds


def teardown_commands(namespaces: list[str], root_links: list[str]) -> list[list[str]]:
    """Commands that delete the given ``dlc-`` namespaces and root-namespace links.

    Deleting a namespace destroys the veths in it (and so their peers); root links only
    exist if someone built an emulation by hand or a foreign tool left one behind.
    """
    for name in [*namespaces, *root_links]:
        if not isinstance(name, str) or not name.startswith(NAME_PREFIX):
            raise ValueError(f"refusing to delete {name!r}: only {NAME_PREFIX}* objects are ours")
    cmds = [["ip", "link", "del", link] for link in root_links]
    cmds += [["ip", "netns", "del", ns] for ns in namespaces]
    return cmds


def host_core_sets(hosts: int, cores: Sequence[int]) -> list[list[int]]:
    """Split ``cores`` (the CPUs this machine lets us use) into one consecutive set per
    emulated host, ``len(cores) // hosts`` each; cores left over stay unassigned (the
    kernel's networking can use them). ValueError when there are fewer cores than hosts:
    then hosts must share cores, which is the unpinned default."""
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise ValueError(f"hosts must be a positive int, got {hosts!r}")
    cpus = sorted({int(c) for c in cores})
    if len(cpus) < hosts:
        raise ValueError(f"pinning needs at least one core per emulated host: {hosts} hosts, "
                         f"{len(cpus)} cores ({cpus}); drop --pin-hosts to let hosts share "
                         "cores")
    per = len(cpus) // hosts
    return [cpus[i * per:(i + 1) * per] for i in range(hosts)]


def hosts_file_text(spec: EmulationSpec) -> str:
    """/etc/hosts content every emulated host sees (via ``/etc/netns/<ns>/hosts``)."""
    _check_spec(spec)
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{host_address(i)} {host_namespace(i)}" for i in range(spec.hosts)]
    return "\n".join(lines) + "\n"


def hosts_arg(spec: EmulationSpec, slots_per_host: int) -> str:
    """``mpirun -H`` value: every emulated host with its slot count."""
    _check_spec(spec)
    _check_slots(slots_per_host)
    return ",".join(f"{name}:{slots_per_host}" for name in host_names(spec))


def _check_slots(slots_per_host: int) -> None:
    slots = slots_per_host
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots_per_host must be a positive integer, got {slots_per_host!r}")


def mpirun_args(
    spec: EmulationSpec, slots_per_host: int, agent_path: str, cores: int
) -> list[str]:
    """Open MPI flags that place ranks on the emulated hosts and keep traffic on their links.

    The rsh agent enters each host's namespace; TCP data (btl) and the runtime's control
    channel (oob) are pinned to the emulated subnet; shared-memory and UCX transports that
    could bypass the emulated network between hosts are excluded (vader still serves ranks on
    the same emulated host). Ranks are not bound, because every emulated host sees the same
    cores and would bind its ranks to the same ones, and idle ranks yield so that two cores
    still have time for the kernel's networking.
    """
    _check_spec(spec)
    _check_slots(slots_per_host)
    if not agent_path:
        raise ValueError("agent_path must name the rsh agent script")
    args = [
        "--mca", "plm_rsh_agent", agent_path,
        "--mca", "plm_rsh_no_tree_spawn", "1",
        "--mca", "pml", "ob1",
        "--mca", "btl", "self,vader,tcp",
        "--mca", "btl_tcp_if_include", SUBNET,
        "--mca", "oob_tcp_if_include", SUBNET,
        "--mca", "mpi_yield_when_idle", "1",
        "--bind-to", "none",
    ]
    if slots_per_host > cores:
        args.append("--oversubscribe")
    return args
