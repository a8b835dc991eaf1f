"""Horovod's build-introspection family (``mpi_built``, ``nccl_built``, ...): present in the
core and every adapter, callable before ``init()``, with Horovod's return types."""
import importlib

import pytest

import dlcomm
from dlcomm.comm.backend_select import nccl_available

FAMILY = {  # name -> type Horovod returns
    "mpi_built": bool, "mpi_enabled": bool, "gloo_built": bool, "gloo_enabled": bool,
    "nccl_built": int, "ddl_built": bool, "ccl_built": bool, "cuda_built": bool,
    "rocm_built": bool,
}
ADAPTERS = ["dlcomm", "dlcomm.torch", "dlcomm.tensorflow", "dlcomm.tensorflow.keras",
            "dlcomm.mxnet"]


def _module(name: str):
    framework = {"dlcomm.torch": "torch", "dlcomm.tensorflow": "tensorflow",
                 "dlcomm.tensorflow.keras": "tensorflow", "dlcomm.mxnet": "mxnet"}.get(name)
    if framework is not None:
        pytest.importorskip(framework)
    return importlib.import_module(name)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_adapter_has_the_family_with_horovods_types(adapter):
    module = _module(adapter)
    for name, kind in FAMILY.items():
        value = getattr(module, name)()
        assert type(value) is kind, (adapter, name, value)
        assert name in module.__all__, (adapter, name)
    if adapter in ("dlcomm", "dlcomm.torch", "dlcomm.tensorflow", "dlcomm.mxnet"):
        assert module.HorovodInternalError is dlcomm.DLCommError


def test_what_this_build_has():
    assert dlcomm.mpi_built() and dlcomm.mpi_enabled()
    assert not any(f() for f in (dlcomm.gloo_built, dlcomm.gloo_enabled, dlcomm.ddl_built,
                                 dlcomm.ccl_built, dlcomm.rocm_built))
    # nccl_built is NCCL's version code where the GPU data path exists, else 0
    assert (dlcomm.nccl_built() > 0) == nccl_available() == dlcomm.cuda_built()
    assert not dlcomm.is_initialized()  # none of them needed init()
