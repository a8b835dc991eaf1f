"""Which backend moves an array: MPI for host (numpy) arrays, NCCL for CuPy device arrays."""
from __future__ import annotations

import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def nccl_available() -> bool:
    """True when CuPy and its NCCL bindings import and a GPU is visible."""
    try:
        import cupy  # noqa: PLC0415 - optional dependency (GPU data path)
        from cupy.cuda import nccl  # noqa: F401, PLC0415 - optional dependency
    except Exception:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@functools.lru_cache(maxsize=1)
def nccl_version() -> int:
    """NCCL's version code (e.g. 22105) when the NCCL data path is available, else 0."""
    if not nccl_available():
        return 0
    from cupy.cuda import nccl  # noqa: PLC0415 - optional dependency (GPU data path)

    try:
        return int(nccl.get_version())
    except Exception:
        return 0


def is_device_array(array: Any) -> bool:
    """True for arrays living on a GPU (CuPy, or anything exposing __cuda_array_interface__)."""
    return hasattr(array, "__cuda_array_interface__")


def select_backend(array: Any, setting: str) -> str:
    """Return 'mpi' or 'nccl' for ``array`` under DLCOMM_BACKEND=``setting``."""
    if setting not in ("auto", "mpi", "nccl"):
        raise ValueError(f"backend must be 'auto', 'mpi' or 'nccl', got {setting!r}")
    device = is_device_array(array)
    if setting == "nccl" or (setting == "auto" and device):
        if not device:
            raise ValueError("DLCOMM_BACKEND=nccl needs device (CuPy) arrays; got a host array")
        if not nccl_available():
            raise ValueError("a CuPy array needs the NCCL backend, but cupy.cuda.nccl or a GPU "
                             "is not available: pip install 'dlcomm[cupy]' on a GPU machine")
        return "nccl"
    if device:
        raise ValueError("DLCOMM_BACKEND=mpi takes host arrays; move the array to the host "
                         "or use backend 'auto'")
    return "mpi"
