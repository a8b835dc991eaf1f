"""Per step of a dlcomm timeline (rank 0's Chrome trace): the step's length, forward and
backward, and each all-reduce of the mlp's tensors as (start after forward, duration) in ms.

``python tl_iters.py timeline.json``
"""
import json
import sys

SIZES = {"w2": 6291456, "b2": 4096, "w1": 18874368, "b1": 6144}

trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"] if isinstance(trace, dict) else trace
spans = sorted([e for e in events if e.get("ph") == "X"], key=lambda e: e["ts"])
starts = [e["ts"] for e in spans if e["name"] == "forward"]


def find(step: list, start: float, name: str, nbytes: int | None = None) -> tuple | None:
    for e in step:
        if e["name"] == name and (nbytes is None or e.get("args", {}).get("bytes") == nbytes):
            return round((e["ts"] - start) / 1e3), round(e["dur"] / 1e3)
    return None


for a, b in zip(starts, starts[1:]):
    step = [e for e in spans if a <= e["ts"] < b]
    parts = {"forward": find(step, a, "forward"), "backward": find(step, a, "backward"),
             "first all-reduce": find(step, a, "communicate"),
             **{k: find(step, a, "communicate", v) for k, v in SIZES.items()},
             "step": find(step, a, "step")}
    print(round((b - a) / 1e3), " ".join(f"{k} {v}" for k, v in parts.items()))
