"""``dlcomm simulate``: time per iteration of dlcomm's methods on 8 to 1024 workers, from an
alpha-beta-gamma network model calibrated on the emulated cluster (docs/simulation.md).

One concern per module: ``network`` (parameters, topology, costs as linear forms),
``collectives`` (each algorithm's cost), ``workload`` / ``model_zoo`` / ``devices`` /
``profile_torch`` (torch only) / ``timeline_profile`` (what a worker computes), ``compressors``
and ``methods`` (what dlcomm sends), ``messages`` and ``engine`` (the event arithmetic of an
iteration), ``sync_methods`` and ``traces`` (DS-Sync, LB-BSP, DLCP), ``predict``,
``calibrate``, ``validate``, ``campaign`` (the measurements), ``seeds``, ``plots``, ``cli``.
Importing this package loads neither torch nor matplotlib.
"""
from __future__ import annotations

from dlcomm.tools.simulate.devices import DEVICES, Device, get_device
from dlcomm.tools.simulate.methods import Method
from dlcomm.tools.simulate.model_zoo import MODELS, describe, workload_from_description
from dlcomm.tools.simulate.network import CostParams, Network, Topology, preset_params
from dlcomm.tools.simulate.predict import Prediction, predict
from dlcomm.tools.simulate.traces import CongestionTrace, StragglerTrace
from dlcomm.tools.simulate.workload import Layer, Tensor, Workload

__all__ = [
    "DEVICES", "MODELS", "CongestionTrace", "CostParams", "Device", "Layer", "Method",
    "Network", "Prediction", "StragglerTrace", "Tensor", "Topology", "Workload", "describe",
    "get_device", "predict", "preset_params", "workload_from_description",
]
