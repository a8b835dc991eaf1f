"""Split fine-tuning across real MPI ranks (dlcomm.torch.split): with compression off, the
split model's losses, outputs and trained parameters equal the unsplit model's trained in one
process (one, two and three edges and the cloud, whose averaging equals training on every
edge's batch at once); with lossy codecs (and their per-sample memories) they equal one process
that applies the same codecs to the same micro-batches; bytes on the link are what the
protocol says."""
from __future__ import annotations

import json

import numpy as np
from framework_required import require_framework
from mpi_run import run_mpi

from dlcomm.split import SampleMemory, get_codec

torch = require_framework("torch")
from split_toy import ToyClassifier, toy_batch  # noqa: E402 - needs torch

from dlcomm.torch.split import cut_module, micro_batches  # noqa: E402 - needs torch

LR = 0.5
STEPS = 3
EVAL_SEED = 999

SCRIPT = r"""
import json, sys
import numpy as np
import torch
import dlcomm.torch as hvd
from dlcomm.torch.split import SplitModel
from split_toy import ToyClassifier, toy_batch

hvd.init()
for n, cfg in enumerate(json.loads(sys.argv[1])):
    out_dir = f"{sys.argv[2]}/cfg{n}"
    torch.manual_seed(0)
    model = ToyClassifier()
    split = SplitModel(model, cfg["split_point"], loss_fn=torch.nn.CrossEntropyLoss(),
                       split_links=cfg["links"], split_micro_batches=cfg["micro"],
                       split_labels=cfg["labels"],
                       split_activation_codec=cfg.get("activation_codec", "none"),
                       split_gradient_codec=cfg.get("gradient_codec", "none"))
    opt = torch.optim.SGD(split.parameters(), lr=cfg["lr"])
    record = {"cut": split.cut.describe()}
    if split.is_cloud:
        record["steps"] = split.serve(opt)
    else:
        e = split.roles.edge_index
        if len(split.roles.edges) > 1:
            opt = hvd.DistributedOptimizer(opt, named_parameters=split.named_parameters(),
                                           process_set=split.edge_process_set)
        losses = []
        for step in range(cfg["steps"]):
            # lossy configurations see two batches in turn, so per-sample memories are reused
            visit = step % 2 if "activation_codec" in cfg else step
            b = cfg["batches"][e]
            x, mask, y = toy_batch(100 * visit + e, b)
            ids = np.arange(visit * b, visit * b + b)
            opt.zero_grad()
            if cfg["labels"] == "cloud":
                loss = split(x, mask, labels=y, sample_ids=ids)
            else:
                loss = torch.nn.functional.cross_entropy(split(x, mask, sample_ids=ids), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        record["losses"] = losses
        if "activation_codec" not in cfg:
            x, mask, _ = toy_batch(cfg["eval_seed"] + e, 5)
            with torch.no_grad():
                record["eval"] = split(x, mask).tolist()
    np.savez(f"{out_dir}/params{hvd.rank()}.npz",
             **{k: v.detach().numpy() for k, v in split.part.state_dict().items()})
    split.close()
    record["bytes_sent"] = split.bytes_sent
    record["sent_by_kind"] = dict(split.link.sent_by_kind)
    record["received_by_kind"] = dict(split.link.received_by_kind)
    with open(f"{out_dir}/rank{hvd.rank()}.json", "w") as f:
        json.dump(record, f)
"""


def reference(batches: list[int]) -> tuple[dict, list[float], list[list]]:
    """The unsplit model trained in one process: each step the loss is the mean over edges of
    each edge's mean loss (what data-parallel edges and the averaging cloud compute)."""
    torch.manual_seed(0)
    model = ToyClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        per_edge = [torch.nn.functional.cross_entropy(model(x, m), y) for x, m, y in
                    (toy_batch(100 * step + e, b) for e, b in enumerate(batches))]
        loss = torch.stack(per_edge).mean()
        loss.backward()
        opt.step()
        losses.append([float(v.detach()) for v in per_edge])
    with torch.no_grad():
        evals = [model(*toy_batch(EVAL_SEED + e, 5)[:2]).tolist() for e in range(len(batches))]
    return {k: v.numpy() for k, v in model.state_dict().items()}, losses, evals


class CodecPair:
    """One direction of the link in one process: the sender's codec and the receiver's
    (separate objects, as on two ranks, so per-sample memories are kept on both sides)."""

    def __init__(self, spec: str) -> None:
        self.send, self.recv = get_codec(spec), get_codec(spec)

    def __call__(self, array: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if isinstance(self.send, SampleMemory):
            return self.recv.decode(self.send.encode(array, ids), ids)
        return self.recv.decode(self.send.encode(array))


class Crossing(torch.autograd.Function):
    """An activation crossing the split in one process: forward through the activation codec
    pair, backward through the gradient codec pair."""

    @staticmethod
    def forward(ctx, x, forward_pair, backward_pair, ids):
        ctx.backward_pair, ctx.ids = backward_pair, ids
        return torch.from_numpy(forward_pair(x.detach().numpy().astype(np.float32), ids))

    @staticmethod
    def backward(ctx, g):
        return torch.from_numpy(ctx.backward_pair(g.numpy(), ctx.ids)), None, None, None


def reference_compressed(cfg: dict) -> tuple[dict, list[list[float]]]:
    """The split model in one process: the cut's two parts, per edge and micro-batch, with the
    codecs applied where the activations cross (a codec pair per edge and activation, as the
    ranks keep them), each edge's loss back-propagated alone, gradients averaged over edges."""
    torch.manual_seed(0)
    model = ToyClassifier()
    cut = cut_module(model, cfg["split_point"], cfg["links"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    pairs: dict[tuple[int, int], tuple[CodecPair, CodecPair]] = {}
    losses = []
    edges = len(cfg["batches"])
    for step in range(STEPS):
        opt.zero_grad()
        per_edge = []
        for e, b in enumerate(cfg["batches"]):
            visit = step % 2
            x, mask, y = toy_batch(100 * visit + e, b)
            ids = np.arange(visit * b, visit * b + b)
            outs, loss = [], 0.0
            for lo, hi in micro_batches(b, cfg["micro"]):
                values = list(cut.edge(x[lo:hi], mask[lo:hi]))
                index = 0
                for i, kind in enumerate(cut.kinds):
                    if kind == "activation":
                        key = (e, index)
                        if key not in pairs:
                            pairs[key] = (CodecPair(cfg["activation_codec"]),
                                          CodecPair(cfg["gradient_codec"]))
                        values[i] = Crossing.apply(values[i], *pairs[key], ids[lo:hi])
                        index += 1
                out = cut.cloud(*values)
                outs.append(out)
                if cfg["labels"] == "cloud":
                    loss = loss + torch.nn.functional.cross_entropy(out, y[lo:hi]) * (
                        (hi - lo) / b)
            if cfg["labels"] == "edge":
                loss = torch.nn.functional.cross_entropy(torch.cat(outs), y)
            loss.backward()
            per_edge.append(float(loss.detach()))
        for p in model.parameters():
            if p.grad is not None:
                p.grad /= edges
        opt.step()
        losses.append(per_edge)
    return {k: v.numpy() for k, v in model.state_dict().items()}, losses


def run_split(tmp_path, cfgs: list[dict]) -> list[list[dict]]:
    """Run every configuration (same number of edges) in one job; per configuration, the
    records of every rank."""
    np_ = len(cfgs[0]["batches"]) + 1
    cfgs = [{**cfg, "lr": LR, "steps": STEPS, "eval_seed": EVAL_SEED} for cfg in cfgs]
    for n in range(len(cfgs)):
        (tmp_path / f"cfg{n}").mkdir()
    run_mpi(np_, SCRIPT, tmp_path, timeout=400, args=[json.dumps(cfgs), str(tmp_path)])
    return [[json.loads((tmp_path / f"cfg{n}" / f"rank{r}.json").read_text())
             for r in range(np_)] for n in range(len(cfgs))]


def check_equal_to_reference(folder, cfg: dict, records: list[dict]) -> None:
    if "activation_codec" in cfg:
        (params, losses), evals = reference_compressed(cfg), None
        lossless, _ = reference_compressed({**cfg, "activation_codec": "none",
                                            "gradient_codec": "none"})
        # the codecs changed the training: equality below is not that of lossless runs
        assert max(np.abs(params[k] - lossless[k]).max() for k in params) > 1e-3
    else:
        params, losses, evals = reference(cfg["batches"])
    got: dict[str, np.ndarray] = {}
    for r in range(len(records)):
        with np.load(folder / f"params{r}.npz") as f:
            for k in f.files:
                if r >= 2 and k in got:  # a second edge holds a copy of the same part
                    assert np.allclose(f[k], got[k], atol=1e-6), k
                got[k] = f[k]
    assert sorted(got) == sorted(params)
    for k in params:
        assert np.allclose(got[k], params[k], atol=2e-5), (k, np.abs(got[k] - params[k]).max())
    for e in range(len(cfg["batches"])):
        rec = records[1 + e]
        assert np.allclose(rec["losses"], [step[e] for step in losses], atol=1e-5)
        if evals is not None:
            assert np.allclose(rec["eval"], evals[e], atol=2e-5)
    assert records[0]["steps"] == STEPS


def check_byte_accounting(records: list[dict]) -> None:
    """Every rank's transport count is what its protocol sent; the cloud received what the
    edges sent, kind by kind, and the edges what the cloud sent."""
    for rec in records:
        assert rec["bytes_sent"] == sum(rec["sent_by_kind"].values()) > 0
    edges = records[1:]
    for kind, n in records[0]["received_by_kind"].items():
        assert n == sum(r["sent_by_kind"].get(kind, 0) for r in edges)
    assert sum(r["received_by_kind"].get("GRADIENT", 0) for r in edges) == \
        records[0]["sent_by_kind"].get("GRADIENT", 0)


ONE_EDGE = [
    # between blocks: one activation and the mask cross
    {"split_point": "blocks.0", "links": "keep", "micro": 1, "labels": "cloud",
     "batches": [7]},
    # inside a block: the residual crosses too (kept); labels on the edge; 3 uneven
    # micro-batches of 5 samples
    {"split_point": "blocks.0.ffn", "links": "keep", "micro": 3, "labels": "edge",
     "batches": [5]},
    # lossy both ways, with per-sample memories: low-rank activations with delta memory,
    # top-k gradients with error feedback, both links kept (two codec pairs), 2 micro-batches
    {"split_point": "blocks.0.ffn", "links": "keep", "micro": 2, "labels": "cloud",
     "batches": [5], "activation_codec": "lowrank:rank=2,memory=delta",
     "gradient_codec": "topk:ratio=0.3,memory=feedback"},
]
TWO_EDGES = [
    # the residual rerouted (its addition moves to the edge: exact), labels on the cloud,
    # uneven batches, one smaller than the micro-batch count
    {"split_point": "blocks.0.ffn", "links": "reroute", "micro": 3, "labels": "cloud",
     "batches": [5, 2]},
    {"split_point": "blocks.1", "links": "keep", "micro": 1, "labels": "edge",
     "batches": [4, 6]},
]


THREE_EDGES = [
    # three edges of uneven batches, one of a single sample (fewer than the micro-batches)
    {"split_point": "blocks.1", "links": "keep", "micro": 2, "labels": "cloud",
     "batches": [3, 1, 4]},
    # the residual eliminated, float16 activations, low-rank float16 gradients chosen by
    # energy, labels on the edge
    {"split_point": "blocks.0.ffn", "links": "eliminate", "micro": 2, "labels": "edge",
     "batches": [2, 5, 3], "activation_codec": "fp16",
     "gradient_codec": "lowrank:energy=0.9,dtype=float16"},
]


def test_two_ranks_equal_unsplit_model(tmp_path) -> None:
    for n, (cfg, records) in enumerate(zip(ONE_EDGE, run_split(tmp_path, ONE_EDGE))):
        check_equal_to_reference(tmp_path / f"cfg{n}", cfg, records)
        check_byte_accounting(records)
        crossing = records[1]["cut"]["crossing"]
        assert crossing[-1] == "mask:side"
        assert sum(c.endswith(":activation") for c in crossing) == (
            2 if cfg["split_point"].endswith("ffn") else 1)


def test_two_edges_and_cloud_equal_single_process_reference(tmp_path) -> None:
    for n, (cfg, records) in enumerate(zip(TWO_EDGES, run_split(tmp_path, TWO_EDGES))):
        check_equal_to_reference(tmp_path / f"cfg{n}", cfg, records)
        check_byte_accounting(records)
        if cfg["links"] == "reroute":
            cut = records[1]["cut"]
            assert cut["rerouted"] and cut["crossing"][0].startswith("add")


BYTES_SCRIPT = r"""
import json, sys
import torch
import dlcomm.torch as hvd
from dlcomm.torch.split import SplitModel

hvd.init()
B, F, H, C = 12, 6, 40, 3
out = {}
for codec in ("none", "lowrank:rank=2,dtype=float16"):
    torch.manual_seed(0)
    edge, cloud = torch.nn.Linear(F, H), torch.nn.Linear(H, C)
    split = SplitModel(parts=(edge, cloud), loss_fn=torch.nn.MSELoss(),
                       split_activation_codec=codec, split_gradient_codec=codec)
    before = split.bytes_sent
    if split.is_cloud:
        split.serve(torch.optim.SGD(split.parameters(), lr=0.1))
    else:
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            split(torch.randn(B, F, generator=g), labels=torch.randn(B, C, generator=g)
                  ).backward()
    split.close()
    out[codec] = {"sent": split.bytes_sent - before, "by_kind": dict(split.link.sent_by_kind)}
errors = []
for kwargs in ({"split_activation_codec": "none" if hvd.rank() else "fp16"},  # ranks differ
               {"split_activation_codec": "lowrank:rank=0"},  # refused on every rank
               {"split_labels": "server"}):
    try:
        SplitModel(parts=(torch.nn.Linear(F, H), torch.nn.Linear(H, C)),
                   loss_fn=torch.nn.MSELoss(), **kwargs)
        errors.append(None)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
out["errors"] = errors
with open(sys.argv[1] + f"/bytes{hvd.rank()}.json", "w") as f:
    json.dump(out, f)
"""


def test_bytes_on_the_link_are_the_protocols_and_bad_settings_fail_everywhere(tmp_path
                                                                            ) -> None:
    """Transport-counted bytes per step equal the protocol's layout: header, layout words and
    the codec's parts (float32 activation, or rank-2 float16 factors with float32 scales).
    Settings that differ between ranks, or that a rank refuses, raise on every rank."""
    run_mpi(2, BYTES_SCRIPT, tmp_path, timeout=240, args=[str(tmp_path)])
    cloud = json.loads((tmp_path / "bytes0.json").read_text())
    edge = json.loads((tmp_path / "bytes1.json").read_text())
    b, h, c, steps, r = 12, 40, 3, 2, 2
    header = 64
    # ACTIVATION: layout 1 + activation 10 (or 21 low-rank) + labels 11 + weight 9 words
    labels_weight = 11 * 8 + 4 * b * c + 9 * 8 + 8
    act_dense = header + 8 * (1 + 10) + 4 * b * h + labels_weight
    act_lowrank = header + 8 * (1 + 21) + 2 * r * (b + h) + 4 * r + labels_weight
    # GRADIENT: layout 1 + loss 9 + gradient 10 (or 21) words, the loss's 8 bytes
    grad_dense = header + 8 * (1 + 9 + 10) + 8 + 4 * b * h
    grad_lowrank = header + 8 * (1 + 9 + 21) + 8 + 2 * r * (b + h) + 4 * r
    close = header + 8
    assert edge["none"]["by_kind"] == {"ACTIVATION": steps * act_dense, "CLOSE": close}
    assert edge["none"]["sent"] == steps * act_dense + close
    assert cloud["none"]["sent"] == steps * grad_dense
    lowrank = "lowrank:rank=2,dtype=float16"
    assert edge[lowrank]["sent"] == steps * act_lowrank + close
    assert cloud[lowrank]["sent"] == steps * grad_lowrank
    assert act_lowrank < act_dense / 3
    for rank_errors in (cloud["errors"], edge["errors"]):
        mismatch, bad_codec, bad_labels = rank_errors
        assert mismatch.startswith("MismatchError") and "activation_codec" in mismatch
        assert "rank 0: 'fp16'" in mismatch and "rank 1: 'none'" in mismatch
        assert bad_codec.startswith("ValueError") and "rank 0" in bad_codec and "rank 1" in \
            bad_codec and "rank must be an int >= 1" in bad_codec
        assert "split_labels" in bad_labels


def test_three_edges_equal_single_process_reference(tmp_path) -> None:
    for n, (cfg, records) in enumerate(zip(THREE_EDGES, run_split(tmp_path, THREE_EDGES))):
        check_equal_to_reference(tmp_path / f"cfg{n}", cfg, records)
        check_byte_accounting(records)
        if cfg["links"] == "eliminate":
            assert records[1]["cut"]["eliminated"]
