"""pack_state/unpack_state: a compressor's state through flat named arrays (the Keras and
MXNet checkpoint formats) comes back exactly, and a compressor loaded from it continues as
the original."""
from __future__ import annotations

import numpy as np
import pytest

from dlcomm.compression import get_compressor
from dlcomm.compression.state_io import pack_state, state_keys, unpack_state


def test_nested_state_round_trips_exactly():
    state = {"a": [np.arange(5, dtype=np.float32), (1, 2.5, None)], 3: {"x": np.uint16(7)},
             ("k", 1): True, "inf": float("inf"), "f": 0.1 + 0.2, "s": "topk:ratio=0.1"}
    packed = pack_state(state, "st")
    assert sorted(state_keys([*packed, "other", "st2"], "st")) == sorted(packed)
    back = unpack_state({k: np.array(v) for k, v in packed.items()}, "st")
    assert back.keys() == state.keys()
    np.testing.assert_array_equal(back["a"][0], state["a"][0])
    assert back["a"][0].dtype == np.float32 and back["a"][1] == (1, 2.5, None)
    assert back[3]["x"] == 7 and back[3]["x"].dtype == np.uint16
    assert back[("k", 1)] is True and back["inf"] == float("inf") and back["f"] == 0.1 + 0.2
    assert back["s"] == "topk:ratio=0.1"


def test_a_compressor_loaded_from_packed_state_continues_as_the_original():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((6, 7)).astype(np.float32) for _ in range(6)]
    for spec in ("topk:ratio=0.2", "powersgd:rank=2", "randomk:ratio=0.2,ef=1"):
        original = get_compressor(spec)
        for g in grads[:3]:
            original.compress(g, "w")
        resumed = get_compressor(spec)
        resumed.load_state_dict(unpack_state(pack_state(original.state_dict())))
        for g in grads[3:]:
            a, _ = original.compress(g, "w")
            b, _ = resumed.compress(g, "w")
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y, err_msg=spec)


def test_what_cannot_be_carried_is_refused():
    with pytest.raises(TypeError, match="set"):
        pack_state({"x": {1, 2}})
    with pytest.raises(ValueError, match="key"):
        pack_state({}, "")
