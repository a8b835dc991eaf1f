"""torch's LAPACK for K-FAC's decompositions: ``dlcomm.kfac.curvature.Linalg`` routines that
take and return numpy arrays but run ``torch.linalg`` on the same memory (CPU, no copy).

torch builds link MKL, whose symmetric eigensolver is several times faster than the
OpenBLAS one numpy wheels carry at the sizes of K-FAC's factors; the maths around it stays
``dlcomm.kfac``'s.
"""
from __future__ import annotations

import numpy as np
import torch

from dlcomm.kfac.curvature import Linalg


def _eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    values, vectors = torch.linalg.eigh(torch.from_numpy(np.ascontiguousarray(a)))
    return values.numpy(), vectors.numpy()


def _inv(a: np.ndarray) -> np.ndarray:
    return torch.linalg.inv(torch.from_numpy(np.ascontiguousarray(a))).numpy()


TORCH_LINALG = Linalg(_eigh, _inv)
