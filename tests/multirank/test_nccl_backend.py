"""Backend selection and the NCCL unique-id exchange; the NCCL data path needs a GPU."""
import numpy as np
import pytest
from mpi_run import run_mpi

from dlcomm.comm.backend_select import is_device_array, nccl_available, select_backend


class FakeDeviceArray:
    """Looks like a CuPy array to the selector (exposes __cuda_array_interface__)."""

    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False),
                                "version": 3}
    dtype = np.dtype(np.float32)


def test_host_arrays_use_mpi():
    assert select_backend(np.ones(3), "auto") == "mpi"
    assert select_backend(np.ones(3), "mpi") == "mpi"
    assert not is_device_array(np.ones(3))


def test_host_array_with_backend_nccl_is_refused():
    with pytest.raises(ValueError, match="needs device"):
        select_backend(np.ones(3), "nccl")


def test_device_array_with_backend_mpi_is_refused():
    with pytest.raises(ValueError, match="takes host arrays"):
        select_backend(FakeDeviceArray(), "mpi")


@pytest.mark.skipif(nccl_available(), reason="checks the message when no GPU is present")
def test_device_array_without_gpu_gets_an_actionable_error():
    assert is_device_array(FakeDeviceArray())
    with pytest.raises(ValueError, match="NCCL backend"):
        select_backend(FakeDeviceArray(), "auto")


def test_bad_backend_name():
    with pytest.raises(ValueError, match="'auto', 'mpi' or 'nccl'"):
        select_backend(np.ones(1), "gloo")


ID_SCRIPT = r'''
from mpi4py import MPI
from dlcomm.comm.nccl_backend import exchange_unique_id
uid = exchange_unique_id(MPI.COMM_WORLD)
assert isinstance(uid, bytes) and len(uid) == 128
everyone = MPI.COMM_WORLD.allgather(uid)
assert all(u == everyone[0] for u in everyone), "ranks hold different NCCL ids"
print(f"OK {MPI.COMM_WORLD.rank}", flush=True)
'''


def test_unique_id_is_shared_over_mpi(tmp_path):
    pytest.importorskip("cupy.cuda.nccl", reason="cupy with NCCL is not installed")
    proc = run_mpi(3, ID_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1] * 3, proc.report()


DATA_SCRIPT = r'''
import cupy, numpy as np
import dlcomm
dlcomm.init()
r, n = dlcomm.rank(), dlcomm.size()
cupy.cuda.Device(dlcomm.local_rank()).use()
x = cupy.full(1000, float(r), dtype=cupy.float32)
assert float(dlcomm.allreduce(x, name="x", op=dlcomm.Sum)[0]) == sum(range(n))
g = dlcomm.allgather(cupy.full((r + 1,), r, dtype=cupy.int32), name="g")
assert g.shape == (n * (n + 1) // 2,)
print("OK", flush=True)
'''


@pytest.mark.skipif(not nccl_available(), reason="the NCCL data path needs a GPU (none here)")
def test_nccl_data_path(tmp_path):
    proc = run_mpi(2, DATA_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1] * 2, proc.report()
