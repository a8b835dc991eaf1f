"""LB-BSP's BatchBalancer in checkpoints (issue 27): a balancer loaded from another's
``state_dict`` (through JSON, so only plain values are in it) re-sizes the batches exactly as
the original from then on, with either predictor; other settings are refused."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dlcomm.heterogeneity.lbbsp import BatchBalancer

SPEEDS = [[10.0, 20.0, 31.0], [11.0, 19.0, 30.0], [9.5, 22.0, 28.0], [10.5, 18.0, 33.0],
          [12.0, 20.5, 29.0], [8.0, 21.0, 30.5], [10.0, 23.0, 27.0], [11.5, 19.5, 31.5],
          [9.0, 20.0, 30.0], [10.2, 21.7, 29.4], [10.8, 18.9, 32.1], [9.7, 20.3, 30.8]]


def _balancer(predictor: str) -> BatchBalancer:
    return BatchBalancer(96, 3, 1, min_batch=4, max_batch=60, predictor=predictor, interval=4)


@pytest.mark.parametrize("predictor", ["ema", "narx-ridge"])
def test_a_loaded_balancer_continues_as_the_original(predictor):
    if predictor.startswith("narx"):
        pytest.importorskip("sklearn")
    original = _balancer(predictor)
    for s in SPEEDS[:7]:
        original.update_from_speeds(s)
    original.update(original.local_batch, 0.25)  # an interval begun: samples, seconds
    state = json.loads(json.dumps(original.state_dict()))
    resumed = _balancer(predictor)
    resumed.load_state_dict(state)
    fresh = _balancer(predictor)
    assert resumed.state_dict() == original.state_dict()
    differs = False
    for s in SPEEDS[7:]:
        expected = original.update_from_speeds(s)
        assert resumed.update_from_speeds(s) == expected
        differs |= fresh.update_from_speeds(s) != expected
    assert differs, "the state made no difference"


def test_other_settings_or_bad_sizes_are_refused():
    state = _balancer("ema").state_dict()
    with pytest.raises(ValueError, match="global_batch 96 there, 48 here"):
        BatchBalancer(48, 3, 1, min_batch=4, max_batch=40, interval=4).load_state_dict(state)
    with pytest.raises(ValueError, match="predictor"):
        _balancer("narx-ridge").load_state_dict(state)
    with pytest.raises(ValueError, match="do not split"):
        _balancer("ema").load_state_dict({**state, "batch_sizes": [30, 30, 30]})
    with pytest.raises(TypeError, match="dict"):
        _balancer("ema").load_state_dict([1, 2])
    assert np.isfinite(state["samples"])


def test_a_checkpoint_of_another_sync_mode_is_refused_and_a_missing_one_warns():
    pytest.importorskip("torch")
    from dlcomm.torch.compression_state import SYNC_STATE_KEY, pop_sync_state

    saved = {"state": {}, SYNC_STATE_KEY: {"mode": "dssync", "step": 3}}
    rest, sync = pop_sync_state(saved, "dssync", "DS-Sync", "restarts")
    assert sync == {"mode": "dssync", "step": 3} and SYNC_STATE_KEY not in rest
    assert SYNC_STATE_KEY in saved  # the caller's checkpoint is left as it was
    with pytest.raises(ValueError, match="sync mode 'dssync'.*sync='lbbsp'"):
        pop_sync_state(saved, "lbbsp", "LB-BSP", "restarts")
    with pytest.warns(UserWarning, match="no LB-BSP state.*restarts"):
        assert pop_sync_state({"state": {}}, "lbbsp", "LB-BSP", "restarts")[1] is None
    with pytest.raises(TypeError, match="must be a dict"):
        pop_sync_state([1], "lbbsp", "LB-BSP", "restarts")
