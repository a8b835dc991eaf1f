"""The measurement and emulation helpers behind the example scripts' flags, in one public place.

``examples/torch_mnist.py`` trains through ``dlcomm.torch`` alone; its ``--phase-times``,
``--straggler`` and steal report come from here: the emulated compute straggler that
``dlcommrun --heterogeneity compute=H:SPEED`` asks for (``ComputeSlowdown``, ``spread_over``),
per-phase step times (``StepPhases``) and the hypervisor steal of this machine
(``steal_seconds``). Importing this module imports torch.
"""
from dlcomm.tools.bench.machine import steal_seconds
from dlcomm.tools.bench.step_phases import StepPhases, format_phase_medians
from dlcomm.tools.emulation.compute_slowdown import ComputeSlowdown
from dlcomm.tools.emulation.torch_slowdown import spread_over

__all__ = ["ComputeSlowdown", "StepPhases", "format_phase_medians", "spread_over",
           "steal_seconds"]
