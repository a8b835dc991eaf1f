"""Errors, never hangs: mismatches, stalls, a killed rank, shutdown, bad arguments."""
import subprocess
import sys

import pytest
from mpi_run import run_mpi

MISMATCH_SCRIPT = r'''
import numpy as np
import dlcomm as hvd

hvd.init()
r = hvd.rank()
cases = [
    ("shape", lambda: hvd.allreduce(np.zeros(3 + r, np.float32), name="bad.shape")),
    ("dtype", lambda: hvd.allreduce(np.zeros(3, np.float32 if r == 0 else np.float64),
                                    name="bad.dtype")),
    ("op", lambda: hvd.allreduce(np.zeros(3), name="bad.op", op=hvd.Sum if r else hvd.Max)),
    ("root", lambda: hvd.broadcast(np.zeros(3), root_rank=r, name="bad.root")),
    ("kind", lambda: (hvd.allreduce if r else hvd.allgather)(np.zeros(3), name="bad.kind")),
]
for field, call in cases:
    try:
        call()
    except hvd.DLCommError as exc:
        msg = str(exc)
        assert f"'bad.{field}'" in msg, msg
        assert "rank 0:" in msg and "rank 1:" in msg, msg
        print(f"ERR {field} {msg}", flush=True)
    else:
        raise AssertionError(f"no error for mismatched {field}")
# the job keeps working after errors
assert hvd.allreduce(np.ones(2), name="good", op=hvd.Sum)[0] == hvd.size()
print(f"OK {r}", flush=True)
'''

STALL_SCRIPT = r'''
import logging, time
import numpy as np
import dlcomm as hvd

logging.basicConfig(level=logging.WARNING)
hvd.init()
r = hvd.rank()
if r != 1:
    try:
        hvd.allreduce(np.ones(2), name="only.some.ranks")
    except hvd.StallError as exc:
        print(f"STALLERROR {r} {exc}", flush=True)
else:
    time.sleep(6)  # rank 1 never submits 'only.some.ranks'
    try:
        hvd.allreduce(np.ones(2), name="late")
    except hvd.DLCommError as exc:
        print(f"STALLERROR {r} {exc}", flush=True)
print(f"DONE {r}", flush=True)
'''

KILL_SCRIPT = r'''
import os, signal, time
import numpy as np
import dlcomm as hvd

hvd.init()
for step in range(10**6):
    if hvd.rank() == 1 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.ones(1000), name="loop")
'''

SHUTDOWN_SCRIPT = r'''
import numpy as np
import dlcomm as hvd

hvd.init()
if hvd.rank() == 0:
    hvd.shutdown()  # leaves early
    print("LEFT", flush=True)
else:
    try:
        hvd.allreduce(np.ones(3), name="never")
    except hvd.ShutdownError as exc:
        assert "rank(s) [0]" in str(exc), exc
        print(f"SHUTDOWNERROR {exc}", flush=True)
    try:
        hvd.allreduce(np.ones(3), name="after")
    except hvd.DLCommError as exc:
        print("STILLDOWN", flush=True)
'''


def test_mismatches_raise_on_every_rank_naming_each_value(tmp_path):
    proc = run_mpi(2, MISMATCH_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1, 1], proc.report()
    for field in ("shape", "dtype", "op", "root", "kind"):
        assert proc.count_per_rank(f"ERR {field}") == [1, 1], proc.report()
    for out in proc.rank_stdout:  # the same message on every rank
        assert "shape differs (rank 0: (3,), rank 1: (4,))" in out, proc.report()
        assert "dtype differs (rank 0: <f4, rank 1: <f8)" in out, proc.report()
        assert "kind differs (rank 0: allgather, rank 1: allreduce)\n" in out, proc.report()


def test_stall_warns_naming_missing_rank_then_aborts(tmp_path):
    proc = run_mpi(3, STALL_SCRIPT, tmp_path, timeout=120,
                   env={"DLCOMM_STALL_WARNING_SECONDS": "1",
                        "DLCOMM_STALL_SHUTDOWN_SECONDS": "3"})
    assert any("'only.some.ranks' has waited" in err and "for ranks [1]" in err
               for err in proc.rank_stderr), proc.report()
    assert proc.count_per_rank("STALLERROR") == [1, 1, 1], proc.report()
    assert any("'only.some.ranks' (missing ranks [1])" in out for out in proc.rank_stdout), \
        proc.report()
    assert proc.count_per_rank("DONE") == [1, 1, 1], proc.report()


def test_killed_rank_ends_the_job_with_an_error(tmp_path):
    proc = run_mpi(3, KILL_SCRIPT, tmp_path, timeout=90, expect_rc=None)
    assert proc.returncode != 0


def test_rank_that_shuts_down_releases_the_others(tmp_path):
    proc = run_mpi(3, SHUTDOWN_SCRIPT, tmp_path, timeout=90)
    assert proc.count_per_rank("SHUTDOWNERROR") == [0, 1, 1], proc.report()
    assert proc.count_per_rank("STILLDOWN") == [0, 1, 1], proc.report()


VALIDATION_SCRIPT = r'''
import numpy as np
import pytest
import dlcomm as hvd

with pytest.raises(hvd.ShutdownError, match="not initialized"):
    hvd.allreduce(np.ones(2))
hvd.init()
x = np.ones(3, np.float32)
checks = [
    (TypeError, "numpy.ndarray", lambda: hvd.allreduce([1.0, 2.0])),
    (TypeError, "unsupported dtype", lambda: hvd.allreduce(np.array(["a"]))),
    (TypeError, "unsupported dtype", lambda: hvd.allreduce(np.ones(2, bool))),
    (ValueError, "unknown reduce op", lambda: hvd.allreduce(x, op="median")),
    (ValueError, "Adasum", lambda: hvd.allreduce(x, op=hvd.Adasum)),
    (TypeError, "name must be a str", lambda: hvd.allreduce(x, name=3)),
    (ValueError, "must not be empty", lambda: hvd.allreduce(x, name="")),
    (TypeError, "prescale_factor", lambda: hvd.allreduce(x, prescale_factor="2")),
    (ValueError, "out of range", lambda: hvd.broadcast(x, root_rank=5)),
    (ValueError, "out of range", lambda: hvd.broadcast(x, root_rank=-1)),
    (TypeError, "root_rank must be an int", lambda: hvd.broadcast(x, root_rank=0.5)),
    (ValueError, "expected", lambda: hvd.allreduce(x, output=np.ones(4, np.float32))),
    (ValueError, "splits", lambda: hvd.alltoall(x, splits=[1, 1])),
    (ValueError, "0-d", lambda: hvd.allgather(np.float32(1.0))),
    (ValueError, "share one dtype", lambda: hvd.grouped_allreduce([x, np.ones(2)])),
    (TypeError, "list of numpy arrays", lambda: hvd.grouped_allreduce(x)),
    (TypeError, "handle", lambda: hvd.synchronize(42)),
    (ValueError, "outside", lambda: hvd.add_process_set([0, 7])),
    (ValueError, "distinct", lambda: hvd.add_process_set([0, 0])),
    (ValueError, "not registered", lambda: hvd.allreduce(x, process_set=hvd.ProcessSet([0]))),
    (TypeError, "unknown dlcomm setting", lambda: hvd.basics.load_config(fusion=1)),
]
for exc_type, text, call in checks:
    with pytest.raises(exc_type, match=text):
        call()
h = hvd.allreduce_async(x, name="dup")
with pytest.raises(ValueError, match="already in flight"):
    hvd.allreduce_async(x, name="dup")
hvd.synchronize(h)
hvd.shutdown()
print("OK")
'''


def test_bad_arguments_raise_before_anything_is_sent(tmp_path):
    script = tmp_path / "validate.py"
    script.write_text(VALIDATION_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("order", ["same", "reversed"])
def test_different_submission_orders_do_not_deadlock(order, tmp_path):
    script = r'''
import sys
import numpy as np
import dlcomm as hvd
hvd.init()
names = [f"t{i}" for i in range(30)]
if sys.argv[1] == "reversed" and hvd.rank() % 2:
    names = names[::-1]
hs = [hvd.allreduce_async(np.full(7, float(i[1:])), name=i, op=hvd.Sum) for i in names]
for i, h in zip(names, hs):
    assert (hvd.synchronize(h) == hvd.size() * float(i[1:])).all()
print("OK", flush=True)
'''
    proc = run_mpi(4, script, tmp_path, timeout=90, args=[order])
    assert proc.count_per_rank("OK") == [1] * 4, proc.report()
