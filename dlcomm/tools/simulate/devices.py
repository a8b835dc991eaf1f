"""Device speeds that turn a model description's FLOPs and bytes into seconds.

A device is an *effective* training speed (FLOP/s actually reached by a training step, not
the data-sheet peak) and memory bandwidth. The presets are assumptions chosen to match
commonly reported single-device training throughput for each card (docs/simulation.md
lists them); give your own with ``Device(...)`` or ``--device-flops``.
"""
from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Device:
    """Effective FLOP/s of a training step, memory bandwidth in bytes/s, and the fixed
    cost of one kernel launch (or, on a CPU, one array operation) in seconds."""

    name: str
    flops: float
    memory_bandwidth: float
    launch_s: float = 0.0

    def __post_init__(self) -> None:
        for field in ("flops", "memory_bandwidth"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Device.{field} must be a number > 0, got {value!r}")
        if not (isinstance(self.launch_s, (int, float)) and math.isfinite(self.launch_s)
                and self.launch_s >= 0):
            raise ValueError(f"Device.launch_s must be a number >= 0, got {self.launch_s!r}")

    def seconds_for(self, flops: float, memory_bytes: float = 0.0) -> float:
        """Time of ``flops`` floating-point operations plus ``memory_bytes`` of traffic."""
        return flops / self.flops + memory_bytes / self.memory_bandwidth


DEVICES: dict[str, Device] = {
    # ResNet-50 fp32 training at ~300 images/s (24.6 GFLOP per image with backward).
    "rtx2080ti": Device("rtx2080ti", 7.0e12, 500e9, 10e-6),
    # ~380 images/s fp32; with mixed precision (tensor cores) ~3x that.
    "v100": Device("v100", 9.0e12, 750e9, 10e-6),
    "v100-amp": Device("v100-amp", 27.0e12, 750e9, 10e-6),
    # ~180 images/s fp32.
    "p40": Device("p40", 4.4e12, 280e9, 10e-6),
    # One core of the development VM running torch with one thread (the emulated cluster).
    "cpu-core": Device("cpu-core", 3.0e10, 8e9, 5e-6),
}


def get_device(name: str) -> Device:
    """A preset of ``DEVICES`` by name (case-insensitive)."""
    key = name.strip().lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r}; presets: {', '.join(DEVICES)} (or give "
                         "--device-flops and --device-memory-bandwidth)")
    return DEVICES[key]
