"""The MXNet adapter's single-process parts: the numpy shim, the zero-copy NDArray bridge,
compression objects, and errors before ``init()``. Runs in the MXNet environment
(``make test-mxnet``); elsewhere it skips with the reason, and with ``CI`` set it fails."""
import types

from framework_required import require_framework

hvd = require_framework("dlcomm.mxnet", install="make install-mxnet")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dlcomm.mxnet import compat  # noqa: E402
from dlcomm.mxnet.ndarray_bridge import (  # noqa: E402
    check_ndarray,
    new_ndarray,
    numpy_view,
    write_back,
)

mx = compat.import_mxnet()


def test_numpy_bool_alias_is_restored_only_when_missing(monkeypatch):
    fake = types.ModuleType("numpy")
    monkeypatch.setattr(compat, "np", fake)
    assert compat.restore_numpy_bool_alias() is True
    assert fake.bool is bool
    assert compat.restore_numpy_bool_alias() is False  # already there: left alone


def test_numpy_2_gives_an_import_error_with_the_fix(monkeypatch):
    monkeypatch.setattr(compat, "numpy_major_minor", lambda: (2, 1))
    with pytest.raises(ImportError, match="make install-mxnet"):
        compat.import_mxnet()


def test_view_shares_the_ndarrays_memory():
    a = mx.nd.array([[1, 2, 3], [4, 5, 6]], dtype="float64")
    view = numpy_view(a)
    assert view.dtype == np.float64 and view.shape == (2, 3) and view.flags.writeable
    view += 10
    np.testing.assert_array_equal(a.asnumpy(), [[11, 12, 13], [14, 15, 16]])
    assert np.shares_memory(view, numpy_view(a))
    row = numpy_view(a[1])  # a slice of the first axis is a view in MXNet too
    row[:] = 0
    np.testing.assert_array_equal(a.asnumpy(), [[11, 12, 13], [0, 0, 0]])


def test_view_waits_for_pending_mxnet_work():
    a = mx.nd.ones((256, 256))
    b = mx.nd.dot(a, a) + 1  # queued on MXNet's engine
    np.testing.assert_array_equal(numpy_view(b), np.full((256, 256), 257.0, np.float32))


def test_write_back_and_new_ndarray_keep_dtype_shape_and_kind():
    a = mx.nd.zeros((2, 2), dtype="int32")
    write_back(a, np.arange(4).reshape(2, 2))
    np.testing.assert_array_equal(a.asnumpy(), [[0, 1], [2, 3]])
    assert a.dtype == np.int32
    out = new_ndarray(np.arange(3, dtype=np.float64), a)
    assert isinstance(out, mx.nd.NDArray) and out.dtype == np.float64
    scalar = new_ndarray(np.array(2.5), a)
    assert scalar.shape == () and scalar.asscalar() == 2.5
    assert isinstance(new_ndarray(np.ones(2), mx.np.ones(2)), mx.np.ndarray)


def test_bad_inputs_are_refused_with_the_fix():
    with pytest.raises(TypeError, match="mxnet NDArray"):
        check_ndarray(np.ones(2))
    with pytest.raises(ValueError, match="tostype"):
        check_ndarray(mx.nd.ones((2, 2)).tostype("row_sparse"))


def test_compression_objects():
    x = mx.nd.array([1.5, 2.25], dtype="float64")
    packed, ctx = hvd.Compression.fp16.compress(x)
    assert packed.dtype == np.float16
    assert hvd.Compression.fp16.decompress(packed, ctx).dtype == np.float64
    ints = mx.nd.array([1, 2], dtype="int32")
    assert hvd.Compression.fp16.compress(ints)[0] is ints
    assert hvd.Compression.lookup("none") is hvd.Compression.none
    assert hvd.Compression.lookup("fp16") is hvd.Compression.fp16
    assert hvd.Compression.lookup("topk:ratio=0.1").core_spec == "topk:ratio=0.1"
    assert hvd.Compression.powersgd.core_spec == "powersgd"
    with pytest.raises(AttributeError, match="available"):
        hvd.Compression.zip  # noqa: B018
    with pytest.raises(TypeError, match="spec must be a str"):
        hvd.Compression.lookup(3)


def test_calls_before_init_say_so():
    assert not hvd.is_initialized()
    with pytest.raises(hvd.ShutdownError, match="init"):
        hvd.allreduce(mx.nd.ones(2))
    net = mx.gluon.nn.Dense(2, in_units=2)
    net.initialize()
    with pytest.raises(hvd.ShutdownError, match="init"):
        hvd.DistributedTrainer(net.collect_params(), "sgd")
    with pytest.raises(hvd.ShutdownError, match="init"):
        hvd.DistributedOptimizer(mx.optimizer.SGD())
