"""Distributed K-FAC without a framework: factor maths on numpy arrays, the placement of
inversions on ranks, and the layouts and process sets of its exchanges.

The torch front end is ``dlcomm.torch.kfac.KFACPreconditioner``; this package holds what
any front end shares (docs/kfac.md).
"""
from dlcomm.kfac.costs import (
    measure_inversion_seconds,
    model_cost,
    placement_work,
    preconditioning_flops,
)
from dlcomm.kfac.curvature import (
    NUMPY_LINALG,
    Linalg,
    damped_inverse,
    eigen_decomposition,
    eigen_scale,
    kl_clip_scale,
    precondition_eigen,
    precondition_inverse,
)
from dlcomm.kfac.exchange_plan import ExchangePlan, Segment, inverse_payload_size
from dlcomm.kfac.factors import (
    conv2d_input_factor,
    conv2d_output_factor,
    conv2d_patches,
    linear_input_factor,
    linear_output_factor,
    pack_upper,
    running_average,
    second_moment,
    unpack_upper,
    upper_size,
)
from dlcomm.kfac.placement import Placement, place_inversions
from dlcomm.kfac.strategy import DistributedStrategy, WorkerGrid, resolve_grad_workers

__all__ = [
    "NUMPY_LINALG", "DistributedStrategy", "ExchangePlan", "Linalg", "Placement", "Segment",
    "WorkerGrid",
    "conv2d_input_factor", "conv2d_output_factor", "conv2d_patches", "damped_inverse",
    "eigen_decomposition", "eigen_scale", "inverse_payload_size", "kl_clip_scale",
    "linear_input_factor", "linear_output_factor", "measure_inversion_seconds", "model_cost",
    "pack_upper", "place_inversions", "placement_work", "precondition_eigen",
    "precondition_inverse", "preconditioning_flops", "resolve_grad_workers",
    "running_average", "second_moment", "unpack_upper", "upper_size",
]
