"""The engine's idle back-off: a job with nothing to do runs few negotiation rounds."""
from mpi_run import run_mpi

IDLE_SCRIPT = r'''
import time
import numpy as np
import dlcomm as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
engine = hvd.basics.state().engine
assert hvd.allreduce(np.ones(4), name="before", op=hvd.Sum)[0] == n
time.sleep(0.3)  # let the back-off reach its cap
start = engine.rounds
time.sleep(1.0)
idle_rounds = engine.rounds - start
# Without the job-wide back-off an idle engine ran a round every 5 ms (164 a second here);
# with it, at most one per 50 ms. A slow machine only runs fewer.
assert idle_rounds <= 40, idle_rounds
# Work after the pause is served as before, on every rank and in a process set that leaves
# a rank idle (that rank joins the round within the back-off's 50 ms).
assert hvd.allreduce(np.ones(4), name="after", op=hvd.Sum)[0] == n
pair = hvd.add_process_set([0, 1])
time.sleep(0.3)
if r in (0, 1):
    assert hvd.allreduce(np.ones(2), name="pair", op=hvd.Sum, process_set=pair)[0] == 2
hvd.remove_process_set(pair)
print(f"OK {r} idle rounds per second {idle_rounds}", flush=True)
'''


def test_an_idle_job_backs_off_and_still_serves_work(tmp_path):
    proc = run_mpi(3, IDLE_SCRIPT, tmp_path, timeout=120)
    assert proc.count_per_rank("OK") == [1] * 3, proc.report()
