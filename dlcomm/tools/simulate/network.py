"""The network model: alpha-beta-gamma cost parameters, hosts x slots, and a cost as a linear
form over the parameters.

Every collective's time is linear in the parameters (``Cost``): ``seconds = overhead *
c_overhead + alpha * c_alpha + ...``. The same forms predict times and, stacked, are the
design matrix calibration fits (``calibrate.py``), so prediction and fit can never disagree.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

# The fitted parameters, in the order of Cost's coefficients.
PARAM_NAMES = ("overhead", "alpha", "beta", "gamma", "alpha_local", "beta_local")

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_rate(text: str | float) -> float:
    """Bits per second from ``"1gbit"``, ``"100gbit"``, ``"500mbit"`` (tc's SI units, as
    ``dlcommrun --emulate`` takes them) or a plain number of bits per second."""
    if isinstance(text, bool):
        raise TypeError("rate must be a string like '10gbit' or a number of bit/s")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _RATE_RE.match(str(text))
        unit = m.group(2).lower() if m else ""
        if not m or (unit and unit not in _RATE_UNITS):
            raise ValueError(f"bad rate {text!r}: use a number with bit, kbit, mbit, gbit or "
                             "tbit, e.g. 10gbit")
        value = float(m.group(1)) * _RATE_UNITS[unit or "bit"]
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"rate must be > 0 bit/s, got {text!r}")
    return value


def _check_nonnegative(owner: str, values: Mapping[str, float]) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{owner}.{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{owner}.{name} must be finite and >= 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CostParams:
    """What a message costs, in seconds.

    ``overhead``: once per collective call (the engine's negotiation, a kernel launch);
    ``alpha``/``beta``: per message and per byte on the link between hosts (``beta`` =
    1 / bytes per second); ``gamma``: per byte reduced; ``alpha_local``/``beta_local``: per
    message and per byte between ranks of one host (shared memory, PCIe, NVLink).
    """

    overhead: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0
    alpha_local: float = 0.0
    beta_local: float = 0.0

    def __post_init__(self) -> None:
        _check_nonnegative("CostParams", self.to_dict())

    def to_dict(self) -> dict[str, float]:
        """The parameters by name (``PARAM_NAMES``)."""
        return {name: float(getattr(self, name)) for name in PARAM_NAMES}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostParams:
        """Parameters from a dict (calibration's JSON); unknown keys raise ValueError."""
        unknown = set(data) - set(PARAM_NAMES)
        if unknown:
            raise ValueError(f"unknown cost parameters {sorted(unknown)}; known: "
                             f"{list(PARAM_NAMES)}")
        return cls(**{k: float(v) for k, v in data.items()})

    @classmethod
    def from_rate(cls, rate: str | float, *, latency_s: float = 0.0,
                  local_rate: str | float | None = None, local_latency_s: float = 0.0,
                  reduce_rate: str | float | None = None, overhead_s: float = 0.0
                  ) -> CostParams:
        """Parameters from link rates (bit/s or ``"10gbit"``) and latencies (seconds).

        ``reduce_rate`` is the speed of the reduction arithmetic in bit/s of data reduced
        (None: free); ``local_rate`` the link between ranks of one host (None: free).
        """
        return cls(
            overhead=overhead_s, alpha=latency_s, beta=8.0 / parse_rate(rate),
            gamma=0.0 if reduce_rate is None else 8.0 / parse_rate(reduce_rate),
            alpha_local=local_latency_s,
            beta_local=0.0 if local_rate is None else 8.0 / parse_rate(local_rate))


@dataclasses.dataclass(frozen=True)
class Topology:
    """``hosts`` machines of ``slots_per_host`` workers each, ranks placed host by host
    (rank r on host r // slots_per_host), one network link per host.

    ``oversubscription`` >= 1 divides the bandwidth between hosts when the traffic of every
    host crosses the network core at once (a fat tree whose uplinks are shared): the
    per-byte cost of inter-host steps is multiplied by it.
    """

    hosts: int
    slots_per_host: int = 1
    oversubscription: float = 1.0

    def __post_init__(self) -> None:
        for name in ("hosts", "slots_per_host"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Topology.{name} must be an int >= 1, got {value!r}")
        o = self.oversubscription
        if isinstance(o, bool) or not isinstance(o, (int, float)) or not math.isfinite(o) \
                or o < 1:
            raise ValueError(f"Topology.oversubscription must be a number >= 1, got {o!r}")

    @property
    def workers(self) -> int:
        """Ranks in the job: hosts x slots per host."""
        return self.hosts * self.slots_per_host

    @classmethod
    def for_workers(cls, workers: int, slots_per_host: int = 1,
                    oversubscription: float = 1.0) -> Topology:
        """``workers`` ranks on hosts of ``slots_per_host`` slots (must divide evenly)."""
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        if isinstance(slots_per_host, bool) or not isinstance(slots_per_host, int) \
                or slots_per_host < 1:
            raise ValueError(f"slots_per_host must be an int >= 1, got {slots_per_host!r}")
        if workers % slots_per_host:
            raise ValueError(f"{workers} workers do not fill hosts of {slots_per_host} slots; "
                             "use a multiple of the slots per host")
        return cls(workers // slots_per_host, slots_per_host, oversubscription)


@dataclasses.dataclass(frozen=True)
class Network:
    """A cluster: its topology and what messages cost on it."""

    topology: Topology
    params: CostParams

    @property
    def workers(self) -> int:
        """Ranks in the job."""
        return self.topology.workers

    def with_topology(self, topology: Topology) -> Network:
        """The same link parameters on another topology (scaling studies)."""
        return Network(topology, self.params)

    def with_params(self, **changes: float) -> Network:
        """The same topology with some parameters replaced."""
        return Network(self.topology, dataclasses.replace(self.params, **changes))


@dataclasses.dataclass(frozen=True)
class Cost:
    """A time as a linear form over ``PARAM_NAMES`` (the coefficient of each parameter),
    and the bytes one host's network link carries in each direction (``link_bytes``, not a
    time; zero for traffic inside a host)."""

    overhead: float = 0.0
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0
    alpha_local: float = 0.0
    beta_local: float = 0.0
    link_bytes: float = 0.0

    def seconds(self, params: CostParams) -> float:
        """The time this cost takes with ``params``."""
        return float(sum(getattr(self, n) * getattr(params, n) for n in PARAM_NAMES))

    def coefficients(self) -> list[float]:
        """The coefficients in ``PARAM_NAMES`` order (a row of calibration's design matrix)."""
        return [float(getattr(self, n)) for n in PARAM_NAMES]

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                       for f in dataclasses.fields(self)})

    def times(self, factor: float) -> Cost:
        """This cost repeated ``factor`` times (coefficients and bytes scaled)."""
        return Cost(**{f.name: getattr(self, f.name) * factor
                       for f in dataclasses.fields(self)})


ZERO_COST = Cost()

# Networks of the seeds' clusters and of the emulated one; latencies are typical figures
# for the kind of link (assumptions, documented in docs/simulation.md), not measurements.
NETWORK_PRESETS: dict[str, dict[str, Any]] = {
    "1gbe": {"rate": "1gbit", "latency_s": 50e-6},
    "10gbe": {"rate": "10gbit", "latency_s": 30e-6},
    "25gbe": {"rate": "25gbit", "latency_s": 20e-6},
    "100gbib": {"rate": "100gbit", "latency_s": 5e-6},
    "56gbib": {"rate": "56gbit", "latency_s": 5e-6},
    # The emulated cluster: no latency is emulated, the kernel's TCP stack still has some.
    "emulated-1gbit": {"rate": "1gbit", "latency_s": 0.0},
}
# Between the GPUs of one server (PCIe 3.0 x16 class) unless a preset says otherwise.
DEFAULT_LOCAL_RATE = "80gbit"
DEFAULT_LOCAL_LATENCY_S = 5e-6


def preset_params(name: str, *, local_rate: str | float | None = DEFAULT_LOCAL_RATE,
                  local_latency_s: float = DEFAULT_LOCAL_LATENCY_S,
                  overhead_s: float = 0.0) -> CostParams:
    """``CostParams`` of a preset in ``NETWORK_PRESETS`` or of a bare rate (``"40gbit"``,
    zero latency)."""
    key = name.strip().lower()
    if key in NETWORK_PRESETS:
        spec = NETWORK_PRESETS[key]
        rate, latency = spec["rate"], float(spec["latency_s"])
    else:
        try:
            rate, latency = parse_rate(key), 0.0
        except ValueError:
            raise ValueError(f"unknown network {name!r}: use a preset "
                             f"({', '.join(NETWORK_PRESETS)}) or a rate like 40gbit") from None
    return CostParams.from_rate(rate, latency_s=latency, local_rate=local_rate,
                                local_latency_s=local_latency_s, overhead_s=overhead_s)
