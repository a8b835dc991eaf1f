"""The seeds' headline comparisons, simulated at their scale with dlcomm's methods
(``dlcomm simulate seeds``).

Each scenario names the paper's figure (from its abstract in ``/work/shared/seeds`` or, for
gTop-k and DS-Sync, the paper's own abstract), the setup simulated (cluster sizes and
networks from the paper; devices, batch sizes and latencies are this module's assumptions,
listed per scenario), the simulated figure, whether the direction agrees, the factor between
the two, and why they differ. Deterministic: the same command gives the same table.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from dlcomm.tools.simulate.devices import get_device
from dlcomm.tools.simulate.methods import Method
from dlcomm.tools.simulate.model_zoo import describe, workload_from_description
from dlcomm.tools.simulate.network import Network, Topology, preset_params
from dlcomm.tools.simulate.predict import Prediction, predict
from dlcomm.tools.simulate.traces import CongestionTrace, StragglerTrace


@dataclasses.dataclass
class SeedResult:
    """One seed's comparison: the paper's figure beside the simulated one."""

    key: str
    title: str
    paper: str
    setup: str
    paper_figure: str
    paper_value: float
    simulated_figure: str
    simulated_value: float
    why: str
    rows: list[dict[str, Any]]
    columns: list[str]
    plot: dict[str, Any]

    @property
    def same_direction(self) -> bool:
        """Both figures on the same side of 1 (a gain is a gain)."""
        return (self.paper_value > 1) == (self.simulated_value > 1)

    @property
    def factor(self) -> float:
        """How far apart the two figures are, as a factor >= 1 (on the gains above 1)."""
        a, b = self.paper_value - 1, self.simulated_value - 1
        if a <= 0 or b <= 0:
            return math.inf
        return max(a, b) / min(a, b)


def _run(model: str, batch: int, device: str, workers: int, slots: int, network: str,
         method: str, oversubscription: float = 1.0, **kwargs: Any) -> Prediction:
    dev = get_device(device)
    workload = workload_from_description(describe(model), batch, dev)
    net = Network(Topology.for_workers(workers, slots, oversubscription), preset_params(network))
    # The seeds' systems all-reduce with a ring (NCCL, Horovod, their own): a method that
    # names no algorithm runs dlcomm's ring, not the engine's default.
    return predict(workload, Method.parse(method, algorithm="ring"), net, dev, **kwargs)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _ms(p: Prediction) -> float:
    return round(p.iteration_s * 1e3, 1)


def seed_acpsgd() -> SeedResult:
    """ACP-SGD against PowerSGD and S-SGD, 8 to 64 workers, 1 GbE to 100 Gb IB."""
    models = (("resnet50", 64), ("resnet152", 32), ("bert-base", 32))
    rows, ssgd, psgd, series = [], [], [], {}
    for network in ("1gbe", "10gbe", "100gbib"):
        curve = []
        for workers in (8, 16, 32, 64):
            per_model = []
            for model, batch in models:
                s, p, a = (_run(model, batch, "rtx2080ti", workers, 4, network, m) for m in
                           ("dense", "powersgd:rank=4", "acpsgd:rank=4"))
                ssgd.append(s.iteration_s / a.iteration_s)
                psgd.append(p.iteration_s / a.iteration_s)
                per_model.append(s.iteration_s / a.iteration_s)
                rows.append({"network": network, "workers": workers, "model": model,
                             "S-SGD ms": _ms(s), "PowerSGD ms": _ms(p), "ACP-SGD ms": _ms(a),
                             "ACP / S-SGD": round(s.iteration_s / a.iteration_s, 2),
                             "ACP / PowerSGD": round(p.iteration_s / a.iteration_s, 2)})
            curve.append((workers, _geomean(per_model)))
        series[f"ACP-SGD / S-SGD, {network}"] = curve
    g_s, g_p = _geomean(ssgd), _geomean(psgd)
    return SeedResult(
        "acpsgd", "ACP-SGD vs PowerSGD vs S-SGD", "Shi et al., ACP-SGD (ICDCS 2023)",
        "8, 16, 32, 64 workers (4 per host), 1 GbE, 10 GbE, 100 Gb IB; ResNet-50 (batch 64), "
        "ResNet-152 (32), BERT-Base (32, seq 128) on RTX 2080 Ti; rank 4, WFBP, 64 MiB fusion",
        "4.06x over S-SGD, 1.43x over PowerSGD (averages)", 4.06,
        f"{g_s:.2f}x over S-SGD, {g_p:.2f}x over PowerSGD (geometric means of 36 cases)", g_s,
        "The gain over S-SGD is all network: 6.5-21x at 1 GbE, 1.0-2.6x at 10 GbE, none at "
        "100 Gb IB, where the compute-bound iteration hides the all-reduce and compression "
        "costs a little; the paper's average weights its slow-network runs. Over PowerSGD "
        "dlcomm already fuses both PowerSGD rounds across tensors (its engine's summable "
        "path), which removes most of what the paper charges to PowerSGD's clash with fusion; "
        "what is left is one round and one product per step (dlcomm measured 1.15x on "
        "4x1gbit, docs/compression.md).",
        rows, ["network", "workers", "model", "S-SGD ms", "PowerSGD ms", "ACP-SGD ms",
               "ACP / S-SGD", "ACP / PowerSGD"],
        {"kind": "lines", "series": series, "xlabel": "workers", "ylabel": "speed-up (x)",
         "title": "ACP-SGD over S-SGD (geometric mean of 3 models)", "logy": True})


def seed_dear() -> SeedResult:
    """DeAR against WFBP and MG-WFBP at 64 workers."""
    models = (("resnet50", 64), ("resnet152", 32), ("bert-base", 32), ("bert-large", 8))
    methods = {"WFBP": "dense", "WFBP per tensor": "dense fusion_threshold=0",
               "MG-WFBP": "dense mgwfbp", "DeAR 4 MiB": "dense dear",
               "DeAR 25 MiB": "dense dear dear_bucket_size=25M"}
    rows, best, bars = [], {}, {}
    for network in ("10gbe", "100gbib"):
        gains = []
        for model, batch in models:
            r = {k: _run(model, batch, "rtx2080ti", 64, 4, network, m) for k, m in methods.items()}
            base = min(r[k].iteration_s for k in ("WFBP", "WFBP per tensor", "MG-WFBP"))
            dear = min(r[k].iteration_s for k in ("DeAR 4 MiB", "DeAR 25 MiB"))
            gains.append(base / dear)
            row = {"network": network, "model": model}
            row.update({f"{k} ms": _ms(v) for k, v in r.items()})
            row["DeAR / best other"] = round(base / dear, 2)
            row["DeAR / WFBP per tensor"] = round(r["WFBP per tensor"].iteration_s / dear, 2)
            rows.append(row)
            if network == "10gbe":
                bars[model] = {k: v.iteration_s * 1e3 for k, v in r.items()}
        best[network] = max(gains)
    return SeedResult(
        "dear", "DeAR vs WFBP / MG-WFBP", "Zhang et al., DeAR (ICDCS 2023)",
        "64 workers (16 hosts x 4), 10 GbE and 100 Gb IB; ResNet-50 (64), ResNet-152 (32), "
        "BERT-Base (32), BERT-Large (8) on RTX 2080 Ti; ring all-reduce",
        "up to 1.83x at 10 GbE, 1.15x at 100 Gb IB, over the best existing schedule", 1.83,
        f"up to {best['10gbe']:.2f}x at 10 GbE, {best['100gbib']:.2f}x at 100 Gb IB, over "
        "the best of WFBP (fused or per tensor) and MG-WFBP", best["10gbe"],
        "Same direction, smaller. The simulated baselines already fuse (dlcomm's engine "
        "batches whatever is ready; MG-WFBP merges by its cost model), so the first problem "
        "DeAR solves, a start-up latency per all-reduce, is mostly gone; against WFBP per "
        "tensor DeAR's gain is several times larger (table). What remains is the all-gather "
        "overlapping the next forward, worth at most the forward pass. DeAR with dlcomm's "
        "default 4 MiB buckets pays 2(p-1) latencies per bucket at 64 workers and loses; the "
        "paper tunes its buckets (25 MiB here).",
        rows, ["network", "model", *[f"{k} ms" for k in methods], "DeAR / best other",
               "DeAR / WFBP per tensor"],
        {"kind": "bars", "groups": bars, "ylabel": "ms per iteration",
         "title": "DeAR vs WFBP and MG-WFBP, 64 workers, 10 GbE"})


def seed_gtopk() -> SeedResult:
    """gTop-k against top-k and dense, 4 to 1024 workers on 1 GbE."""
    models = (("vgg16", 32), ("resnet50", 32))
    workers = (4, 8, 16, 32, 64, 128, 256, 512, 1024)
    rows, series, at32_dense, at32_topk, at1024 = [], {}, [], [], []
    for model, batch in models:
        curves: dict[str, list[tuple[float, float]]] = {}
        for p in workers:
            r = {name: _run(model, batch, "rtx2080ti", p, 1, "1gbe", m) for name, m in
                 (("dense", "dense"), ("top-k", "topk:ratio=0.001"),
                  ("gTop-k", "gtopk:ratio=0.001"))}
            for name, pred in r.items():
                curves.setdefault(f"{model} {name}", []).append((p, pred.iteration_s * 1e3))
            vs_dense = r["gTop-k"].scaling_efficiency / r["dense"].scaling_efficiency
            vs_topk = r["gTop-k"].scaling_efficiency / r["top-k"].scaling_efficiency
            if p == 32:
                at32_dense.append(vs_dense)
                at32_topk.append(vs_topk)
            if p == 1024:
                at1024.append(vs_topk)
            rows.append({"model": model, "workers": p, "dense ms": _ms(r["dense"]),
                         "top-k ms": _ms(r["top-k"]), "gTop-k ms": _ms(r["gTop-k"]),
                         "top-k link MB": round(r["top-k"].link_bytes / 1e6, 2),
                         "gTop-k link MB": round(r["gTop-k"].link_bytes / 1e6, 2),
                         "gTop-k / dense eff.": round(vs_dense, 2),
                         "gTop-k / top-k eff.": round(vs_topk, 2)})
        series.update(curves)
    return SeedResult(
        "gtopk", "gTop-k vs top-k vs dense", "Shi et al., gTop-k S-SGD (ICDCS 2019)",
        "4 to 1024 workers (1 per host), 1 GbE; VGG-16 and ResNet-50 (batch 32) on RTX 2080 "
        "Ti; density 0.001; WFBP",
        "2.7-12x the scaling efficiency of dense, 1.1-1.7x that of top-k (32 workers, 1 GbE)",
        1.7,
        f"{min(at32_dense):.1f}-{max(at32_dense):.1f}x dense, {min(at32_topk):.2f}-"
        f"{max(at32_topk):.2f}x top-k at 32 workers; {min(at1024):.1f}-{max(at1024):.1f}x "
        "top-k at 1024", max(at32_topk),
        "Over top-k there is no simulated gain at 32 workers: dlcomm's engine packs a "
        "group's top-k payloads into one all-gather (one latency per group, not per tensor), "
        "and at 32 workers on 1 GbE both exchanges hide behind backward. The gain appears "
        "from 64 workers and grows with the workers as O(kP) against O(k log P) predicts "
        "(link MB columns), past the paper's range at 1024. "
        "Over dense it is larger than the paper's: the model charges dense S-SGD its full "
        "2(P-1)/P n bytes on a 1 GbE link and gives the sparse methods free error-feedback "
        "memory traffic beyond the device model; the paper's dense baseline also had "
        "tensor fusion tuned for its cluster.",
        rows, ["model", "workers", "dense ms", "top-k ms", "gTop-k ms", "top-k link MB",
               "gTop-k link MB", "gTop-k / dense eff.", "gTop-k / top-k eff."],
        {"kind": "lines", "series": series, "xlabel": "workers", "ylabel": "ms per iteration",
         "title": "gTop-k vs top-k vs dense on 1 GbE", "logx": True, "logy": True})


def seed_hierarchical() -> SeedResult:
    """Hierarchical against flat all-reduce at 1024 workers (128 hosts x 8)."""
    models = (("resnet50", 64), ("alexnet", 64))
    methods = {"flat ring per tensor": "dense fusion_threshold=0",
               "hierarchical per tensor": "dense hierarchical fusion_threshold=0",
               "flat ring fused": "dense", "hierarchical fused": "dense hierarchical",
               "hierarchical fused fp16": "fp16 hierarchical"}
    rows, bars, gains, series = [], {}, {}, {}
    for model, batch in models:
        r = {k: _run(model, batch, "p40", 1024, 8, "100gbib", m) for k, m in methods.items()}
        best_h = min(r[k].iteration_s for k in methods if k.startswith("hierarchical"))
        gains[model] = r["flat ring per tensor"].iteration_s / best_h
        row = {"model": model, **{f"{k} ms": _ms(v) for k, v in r.items()}}
        row["best hierarchical / flat per tensor"] = round(gains[model], 2)
        row["hierarchical / flat (both fused)"] = round(
            r["flat ring fused"].iteration_s / r["hierarchical fused"].iteration_s, 2)
        rows.append(row)
        bars[model] = {k: v.iteration_s * 1e3 for k, v in r.items()}
    for name, method in (("flat ring per tensor", "dense fusion_threshold=0"),
                         ("hierarchical per tensor", "dense hierarchical fusion_threshold=0"),
                         ("flat ring fused", "dense"),
                         ("hierarchical fused", "dense hierarchical")):
        series[f"ResNet-50, {name}"] = [
            (p, _run("resnet50", 64, "p40", p, 8, "100gbib", method).samples_per_s)
            for p in (8, 32, 128, 512, 1024)]
    return SeedResult(
        "hierarchical", "hierarchical vs flat all-reduce at 1024",
        "Jia et al., ImageNet in four minutes (2018)",
        "1024 workers (128 hosts x 8 P40), 100 Gb IB between hosts, PCIe-class links inside; "
        "ResNet-50 and AlexNet, batch 64 per worker; flat ring vs dlcomm's hierarchical "
        "(binomial tree inside a host, ring among leaders)",
        "up to 11x (ResNet-50) and 3x (AlexNet) over NCCL-based training", 11.0,
        f"{gains['resnet50']:.1f}x (ResNet-50), {gains['alexnet']:.1f}x (AlexNet), best "
        "hierarchical against a flat ring all-reduce per tensor", gains["resnet50"],
        "The gain is latency: a flat ring pays 2(p-1) = 2046 start-ups per all-reduce, the "
        "leaders' ring 2(h-1) = 254. Against a flat ring per tensor (the assumed NCCL-era "
        "baseline) the direction and the ordering of the models agree; once both fuse "
        "tensors into 64 MiB messages the latency is amortised and hierarchical is level "
        "(ResNet-50) or slower (AlexNet's 244 MB: dlcomm's binomial tree moves the whole "
        "buffer log2(8) = 3 times each way inside a host). The paper's system also gains "
        "from mixed precision and its own fusion, which the simulated baseline lacks.",
        rows, ["model", *[f"{k} ms" for k in methods], "best hierarchical / flat per tensor",
               "hierarchical / flat (both fused)"],
        {"kind": "lines", "series": series, "xlabel": "workers", "ylabel": "samples/s",
         "title": "ResNet-50 on P40s, 8 per host, 100 Gb IB", "logx": True, "logy": True})


def seed_dssync() -> SeedResult:
    """DS-Sync groups against BSP, 16 to 128 workers, core 1:1 and 4:1 oversubscribed."""
    models = (("resnet50", 64), ("bert-base", 32))
    rows, series, best = [], {}, {}
    for oversub in (1.0, 4.0):
        top = 0.0
        for model, batch in models:
            curve = []
            for p in (16, 32, 64, 128):
                r = {k: _run(model, batch, "v100", p, 1, "10gbe", m, oversubscription=oversub)
                     for k, m in (("BSP", "dense"), ("S=2", "dssync:group_size=2"),
                                  ("S=4", "dssync:group_size=4"))}
                gain = r["BSP"].iteration_s / r["S=2"].iteration_s
                top = max(top, gain)
                curve.append((p, gain))
                rows.append({"oversubscription": oversub, "model": model, "workers": p,
                             "BSP ms": _ms(r["BSP"]), "DS-Sync S=2 ms": _ms(r["S=2"]),
                             "DS-Sync S=4 ms": _ms(r["S=4"]), "BSP / S=2": round(gain, 2),
                             "BSP / S=4": round(r["BSP"].iteration_s / r["S=4"].iteration_s,
                                                2)})
            series[f"{model}, oversubscription {oversub:g}"] = curve
        best[oversub] = top
    return SeedResult(
        "dssync", "DS-Sync vs BSP", "Wang et al., DS-Sync (2020-2022)",
        "16 to 128 workers (1 per host), 10 GbE, core not oversubscribed and 4:1 "
        "oversubscribed; ResNet-50 (64) and BERT-Base (32) on V100; groups of 2 and 4",
        "up to 94% less training time (arXiv version; the seed's abstract gives no figure)",
        1.0 / (1 - 0.94),
        f"up to {best[4.0]:.2f}x per iteration with a 4:1 core, {best[1.0]:.2f}x without",
        best[4.0],
        "Per iteration a pair averages one model's bytes against a ring's 2(p-1)/p, and its "
        "latency does not grow with p: at most 2x when communication dominates. Without "
        "oversubscription ResNet-50 loses, because BSP overlaps its all-reduce with backward "
        "and DS-Sync averages after the step. The paper's 94% is time to accuracy under "
        "contention measured in production clusters with topology-aware groups (dlcomm's "
        "groups are random), which per-iteration simulation does not cover.",
        rows, ["oversubscription", "model", "workers", "BSP ms", "DS-Sync S=2 ms",
               "DS-Sync S=4 ms", "BSP / S=2", "BSP / S=4"],
        {"kind": "lines", "series": series, "xlabel": "workers",
         "ylabel": "DS-Sync (S=2) over BSP (x)", "title": "DS-Sync vs BSP, 10 GbE",
         "logx": True})


def seed_lbbsp() -> SeedResult:
    """LB-BSP against BSP under straggler traces, 16 workers."""
    workers, iterations = 16, 400
    traces = {
        "one worker at half speed": StragglerTrace.constant(workers, {3: 0.5}),
        "non-dedicated, persistent (10% slow, dwell 400)": StragglerTrace.markov_stragglers(
            workers, iterations, slow_fraction=0.1, mean_dwell=400, seed=1),
        "non-dedicated, persistent (25% slow, dwell 400)": StragglerTrace.markov_stragglers(
            workers, iterations, slow_fraction=0.25, mean_dwell=400, seed=1),
        "non-dedicated, transient (25% slow, dwell 20)": StragglerTrace.markov_stragglers(
            workers, iterations, slow_fraction=0.25, mean_dwell=20, seed=1),
    }
    rows, gains = [], {}
    for name, trace in traces.items():
        r = {k: _run("resnet50", 64, "v100", workers, 1, "10gbe", m, stragglers=trace,
                     iterations=iterations) for k, m in (("BSP", "dense"), ("LB-BSP", "lbbsp"))}
        gains[name] = r["BSP"].iteration_s / r["LB-BSP"].iteration_s
        rows.append({"trace": name, "BSP ms": _ms(r["BSP"]), "LB-BSP ms": _ms(r["LB-BSP"]),
                     "LB-BSP / BSP": round(gains[name], 2),
                     "final batches": " ".join(map(str, r["LB-BSP"].details["batch_sizes"]))})
    constant = gains["one worker at half speed"]
    return SeedResult(
        "lbbsp", "LB-BSP vs BSP with stragglers", "Chen et al., LB-BSP (TCC 2021)",
        "16 workers (1 per host), 10 GbE; ResNet-50 (global batch 1024) on V100; traces: one "
        "worker at half speed, and workers switching between full and half speed (Markov, "
        "mean stay 400 or 20 iterations); dlcomm's balancer (EMA, re-size every 8 after "
        "2, 4)",
        "up to 1.54x (\"up to 54 percent\")", 1.54,
        f"{constant:.2f}x with one half-speed worker; {min(gains.values()):.2f}-"
        f"{max(gains.values()):.2f}x over the traces", constant,
        "A persistent straggler is what semi-dynamic balancing fixes: the simulated gain "
        "matches the paper's order. When slowdowns last about as long as the re-size "
        "interval (transient trace) the balancer chases the last interval and the gain "
        "vanishes or turns into a small loss: LB-BSP's prediction (NARX in the paper, EMA "
        "here) is what such clusters need.",
        rows, ["trace", "BSP ms", "LB-BSP ms", "LB-BSP / BSP", "final batches"],
        {"kind": "barh", "values": gains, "xlabel": "LB-BSP over BSP (x)",
         "title": "LB-BSP vs BSP, 16 workers, ResNet-50"})


def seed_dlcp() -> SeedResult:
    """DLCP's bounded-loss exchange against the lossless all-reduce under congestion."""
    specs = {"one host, 1 Gb/s bursts (0.5 s every ~4 s)": "congest=3:1gbit:0.5:4,seed=1",
             "every host, 1 Gb/s bursts (0.5 s every ~8 s)": "congest=*:1gbit:0.5:8,seed=1",
             "every host, 2 Gb/s short bursts (0.2 s every ~10 s)":
                 "congest=*:2gbit:0.2:10,seed=1"}
    rows, gains = [], {}
    for label, spec in specs.items():
        trace = CongestionTrace.from_heterogeneity(spec, 16, "10gbit", 4000)
        for model, batch in (("vgg16", 32), ("resnet50", 64)):
            r = {k: _run(model, batch, "v100", 16, 1, "10gbe", m, congestion=trace,
                         iterations=300)
                 for k, m in (("lossless", "dense"), ("p=0.1", "loss_tolerance=0.1"),
                              ("p=0.3", "loss_tolerance=0.3"))}
            best = min(r["p=0.1"].iteration_s, r["p=0.3"].iteration_s)
            gains[f"{model}, {label}"] = r["lossless"].iteration_s / best
            rows.append({"congestion": label, "model": model, "lossless ms": _ms(r["lossless"]),
                         "DLCP p=0.1 ms": _ms(r["p=0.1"]), "DLCP p=0.3 ms": _ms(r["p=0.3"]),
                         "lost (p=0.3)": f"{r['p=0.3'].details['lost_fraction']:.2%}",
                         "best DLCP / lossless": round(r["lossless"].iteration_s / best, 2)})
    top = max(gains.values())
    return SeedResult(
        "dlcp", "DLCP bounded loss vs lossless, congested links",
        "Wang et al., DLCP (2020)",
        "16 workers (1 per host), 10 GbE with heavy-tailed congestion (the emulator's "
        "congest= model); VGG-16 (32) and ResNet-50 (64) on V100; dlcomm's exchange with "
        "p = 0.1 and 0.3 against the engine's overlapped ring all-reduce",
        "up to 1.84x (\"84.3% additional acceleration\")", 1.843,
        f"{min(gains.values()):.2f}-{top:.2f}x", top,
        "Not reproduced: slower in every case, as on the emulated cluster (README: level, "
        "or a gain the lossless ring shares). The lossless ring keeps moving bytes through "
        "a burst at the congested rate and catches up after it (the model drains each "
        "iteration's bytes at the rate of each moment, as the emulated links measured). "
        "dlcomm's DLCP "
        "works at the application: it may stop waiting "
        "for at most p of the bytes, but the other 1-p still cross the congested link, the "
        "late chunks are drained before the next exchange, and the exchange does not overlap "
        "backward as the engine's all-reduce does. The paper's gain comes from switches that "
        "prioritise and drop packets inside the network, which dlcomm cannot do.",
        rows, ["congestion", "model", "lossless ms", "DLCP p=0.1 ms", "DLCP p=0.3 ms",
               "lost (p=0.3)", "best DLCP / lossless"],
        {"kind": "barh", "values": gains, "xlabel": "DLCP over lossless (x)",
         "title": "DLCP vs lossless all-reduce, 16 workers, 10 GbE"})


def seed_cloud_topk() -> SeedResult:
    """Top-k on a public-cloud cluster (16 hosts x 8 V100, 25 GbE)."""
    methods = {"dense ring": "dense", "dense hierarchical": "dense hierarchical",
               "fp16 hierarchical": "fp16 hierarchical",
               "top-k exact": "topk:ratio=0.001", "top-k approx": "topk:ratio=0.001,approx=1",
               "gTop-k": "gtopk:ratio=0.001"}
    rows, gains, bars = [], {}, {}
    for model, batch in (("resnet50", 64), ("bert-base", 32)):
        r = {k: _run(model, batch, "v100", 128, 8, "25gbe", m) for k, m in methods.items()}
        dense = min(r[k].iteration_s for k in ("dense ring", "dense hierarchical",
                                               "fp16 hierarchical"))
        sparse = min(r[k].iteration_s for k in ("top-k exact", "top-k approx", "gTop-k"))
        gains[model] = dense / sparse
        rows.append({"model": model, **{f"{k} ms": _ms(v) for k, v in r.items()},
                     "best sparse / best dense": round(gains[model], 2)})
        bars[model] = {k: v.iteration_s * 1e3 for k, v in r.items()}
    return SeedResult(
        "cloud-topk", "top-k on a public cloud cluster",
        "Shi et al., public-cloud top-k (MLSys 2021)",
        "128 workers (16 hosts x 8 V100), 25 GbE; ResNet-50 (64), BERT-Base (32); density "
        "0.001 against dense ring, hierarchical and fp16",
        "25-40% faster than existing systems", 1.4,
        f"{min(gains.values()):.2f}-{max(gains.values()):.2f}x (best sparse over best dense)",
        max(gains.values()),
        "ResNet-50 is compute-bound at 25 GbE with 8 V100s per host and gains nothing; "
        "BERT-Base's 440 MB of gradients gain in the paper's range. The paper's system also "
        "caches data and parallelises the update, which the simulator does not model.",
        rows, ["model", *[f"{k} ms" for k in methods], "best sparse / best dense"],
        {"kind": "bars", "groups": bars, "ylabel": "ms per iteration",
         "title": "128 V100s, 25 GbE"})


SEEDS: dict[str, Callable[[], SeedResult]] = {
    "acpsgd": seed_acpsgd, "dear": seed_dear, "gtopk": seed_gtopk,
    "hierarchical": seed_hierarchical, "dssync": seed_dssync, "lbbsp": seed_lbbsp,
    "dlcp": seed_dlcp, "cloud-topk": seed_cloud_topk,
}


def run_seeds(only: Sequence[str] | None = None) -> list[SeedResult]:
    """Every scenario in ``SEEDS`` (or those named in ``only``)."""
    names = list(only) if only else list(SEEDS)
    unknown = [n for n in names if n not in SEEDS]
    if unknown:
        raise ValueError(f"unknown seed scenarios {unknown}; available: {', '.join(SEEDS)}")
    return [SEEDS[n]() for n in names]


def _cell(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_seeds(results: Sequence[SeedResult], plots: dict[str, str] | None = None) -> str:
    """The summary table and a section per seed (Markdown)."""
    lines = ["| seed | comparison | paper | simulated | same direction | factor apart |",
             "|---|---|---|---|:---:|---:|"]
    for r in results:
        factor = "-" if math.isinf(r.factor) else f"{r.factor:.1f}x"
        lines.append(f"| {r.paper} | {r.title} | {r.paper_figure} | {r.simulated_figure} | "
                     f"{'yes' if r.same_direction else 'no'} | {factor} |")
    lines.append("\n\"factor apart\" compares the gains above 1 (paper's figure - 1 against "
                 "the simulated one - 1); \"-\" when one side shows no gain.\n")
    for r in results:
        lines += [f"### {r.title} ({r.paper})", "", f"Simulated setup: {r.setup}.", "",
                  f"Paper: {r.paper_figure}. Simulated: {r.simulated_figure}.", "",
                  f"Where and why they differ: {r.why}", ""]
        if plots and r.key in plots:
            lines += [f"![{r.title}]({plots[r.key]})", ""]
        lines.append("| " + " | ".join(r.columns) + " |")
        lines.append("|" + "---|" * len(r.columns))
        for row in r.rows:
            lines.append("| " + " | ".join(_cell(row[c]) for c in r.columns) + " |")
        lines.append("")
    return "\n".join(lines)
