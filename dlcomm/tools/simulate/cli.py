"""``dlcomm simulate``: predict, profile, calibrate, validate, reproduce the seeds, and run the
measurements calibration and validation need.

    dlcomm simulate predict --model resnet50 --device v100 --workers 8,64,1024 \\
        --slots-per-host 8 --network 100gbib --method dense --method "acpsgd:rank=4"
    dlcomm simulate calibrate calibration/*.json -o network.json
    dlcomm simulate validate validation/*.json --params network.json
    dlcomm simulate seeds --out docs/simulation
    dlcomm simulate measure calibration --out runs [--quick] [--dry-run] [--only REGEX]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NAME = "simulate"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--model", default="resnet50",
                   help="a described model (resnet50, resnet101, resnet152, vgg16, alexnet, "
                   "bert-base, bert-large, mnist-mlp, mnist-cnn, synthetic-mlp, "
                   "synthetic-cnn; default resnet50)")
    g.add_argument("--workload", metavar="JSON", help="a workload JSON (from `dlcomm simulate "
                   "profile`) instead of --model")
    g.add_argument("--batch-size", type=int, default=32, help="per worker (default 32)")
    g.add_argument("--device", default="v100", help="device preset for --model and for "
                   "compression costs: rtx2080ti, v100, v100-amp, p40, cpu-core (default v100)")
    g.add_argument("--device-flops", type=float, help="effective FLOP/s (overrides the preset)")
    g.add_argument("--device-memory-bandwidth", type=float, help="bytes/s (overrides)")
    g.add_argument("--compute-s", type=float, help="rescale forward+backward to this many "
                   "seconds (e.g. measured), keeping the per-layer split")
    g.add_argument("--timeline", nargs="+", metavar="JSON", help="dlcomm timeline file(s) of a "
                   "real run: forward, backward and gradient ready times from them")
    g.add_argument("--timeline-rank", type=int, default=0)


def _add_network_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("network")
    g.add_argument("--workers", type=_int_list, default=[8], metavar="LIST",
                   help="worker counts, e.g. 8,64,1024 (default 8)")
    g.add_argument("--slots-per-host", type=int, default=1, help="workers per host (default 1)")
    g.add_argument("--oversubscription", type=float, default=1.0,
                   help="core oversubscription, >= 1 (default 1: non-blocking)")
    g.add_argument("--network", default="10gbe", help="preset (1gbe, 10gbe, 25gbe, 56gbib, "
                   "100gbib, emulated-1gbit) or a rate such as 40gbit (default 10gbe)")
    g.add_argument("--params", metavar="JSON", help="calibrated parameters (`dlcomm simulate "
                   "calibrate` output) instead of --network")
    g.add_argument("--latency-s", type=float, help="override alpha (seconds per message)")
    g.add_argument("--local-rate", default=None, help="link inside a host (default 80gbit)")


def _add_method_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("methods")
    g.add_argument("--method", action="append", default=None, metavar="TEXT",
                   help="repeatable; e.g. dense, 'dense dear', 'acpsgd:rank=4', "
                   "'topk:ratio=0.01 schedule=none', 'dense hierarchical', "
                   "'dssync:group_size=2', lbbsp, 'loss_tolerance=0.1' (default: dense)")
    g.add_argument("--compressor-costs", metavar="JSON", help="measured compression costs "
                   "(`dlcomm simulate calibrate --compressors`)")
    g.add_argument("--cpu-share", type=float, default=1.0, metavar="X",
                   help="ranks per core where a machine runs more ranks than cores: "
                   "forward, backward, the update and compression take X times longer "
                   "(default 1: a core or a device each)")
    g.add_argument("--compression-own-core", action="store_true",
                   help="compression runs beside training without slowing it (default: it "
                   "shares the device)")
    g.add_argument("--stragglers", metavar="SPEC", help="worker speeds per iteration: "
                   "'constant:3=0.5', 'markov:slow_fraction=0.25,slow_speed=0.5,dwell=20,"
                   "seed=0', an emulator spec 'compute=1:0.5,seed=1', or a JSON file")
    g.add_argument("--congestion", metavar="SPEC", help="link congestion as the emulator's "
                   "--heterogeneity takes it, e.g. 'congest=*:1gbit:0.5:4,seed=1'")
    g.add_argument("--iterations", type=int, default=200,
                   help="iterations simulated with a straggler or congestion trace")
    g.add_argument("--global-every", type=int, default=0,
                   help="DS-Sync: a global average every N iterations (default never)")


def _add_outputs(p: argparse.ArgumentParser, plot: bool = True) -> None:
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    if plot:
        p.add_argument("--plot", metavar="PNG", help="draw a figure")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``dlcomm simulate`` and its actions."""
    parser = subparsers.add_parser(
        NAME, help="simulate 8 to 1024 workers: predict, calibrate, validate, seeds",
        description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="simulate_action", metavar="ACTION", required=True)

    p = actions.add_parser("predict", help="time per iteration, bytes and scaling efficiency "
                           "of each method at each worker count")
    _add_workload_args(p)
    _add_network_args(p)
    _add_method_args(p)
    _add_outputs(p)
    p.set_defaults(func=run_predict)

    p = actions.add_parser("profile", help="profile a torch model into a workload JSON "
                           "(needs torch)")
    p.add_argument("--factory", required=True, metavar="MODULE:CALLABLE",
                   help="builds the model, e.g. examples/torch_mnist.py:MLP or "
                   "torchvision.models:resnet18")
    p.add_argument("--factory-args", default="[]", metavar="JSON",
                   help="positional arguments for the factory as a JSON list, e.g. [28]")
    p.add_argument("--input-shape", required=True, metavar="C,H,W",
                   help="one sample's shape, e.g. 1,28,28")
    p.add_argument("--classes", type=int, default=10, help="targets drawn from 0..classes-1")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--name", default=None, help="workload name (default: the factory)")
    p.add_argument("-o", "--output", required=True, metavar="JSON")
    p.set_defaults(func=run_profile)

    p = actions.add_parser("calibrate", help="fit alpha, beta, gamma (and in-host terms) "
                           "from `dlcomm bench` JSON, or compressor costs")
    p.add_argument("files", nargs="*", metavar="JSON", help="bench (or campaign) JSON files")
    p.add_argument("-o", "--output", required=True, metavar="JSON")
    p.add_argument("--peer", default="dlcomm", choices=("dlcomm", "mpi4py"),
                   help="whose times to fit (default dlcomm: the engine included)")
    p.add_argument("--algorithm", default=None, help="DLCOMM_ALLREDUCE_ALGORITHM of files "
                   "without a campaign setup: ordered (this one's default), ordered_tcp, "
                   "ring, rhd, tree, hierarchical (not auto, the engine's default: it picks "
                   "per size)")
    p.add_argument("--prior", action="append", default=[], metavar="NAME=VALUE",
                   help="fix a parameter instead of fitting it (repeatable)")
    p.add_argument("--min-bytes", type=float, default=0.0, help="ignore smaller sizes")
    p.add_argument("--markdown", metavar="PATH")
    p.add_argument("--compressors", action="store_true", help="measure compressor costs with "
                   "dlcomm's throughput benchmark instead (a timing: quiet machine)")
    p.add_argument("--sizes", type=_int_list, default=[1 << 18, 1 << 20, 1 << 22],
                   help="--compressors: element counts (multiples of 1024)")
    p.add_argument("--specs", default="fp16;topk:ratio=0.01;topk:ratio=0.01,approx=1;"
                   "randomk:ratio=0.01;gtopk:ratio=0.01;efsignsgd;signum;qsgd:levels=16;"
                   "powersgd:rank=4;acpsgd:rank=4",
                   help="--compressors: specs separated by ';', or by ',' as in 'dlcomm bench "
                   "train --configs' (a piece like approx=1 stays with the spec before it)")
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=run_calibrate)

    p = actions.add_parser("validate", help="predicted against measured time per iteration")
    p.add_argument("files", nargs="+", metavar="JSON", help="campaign run files")
    p.add_argument("--params", required=True, metavar="JSON", help="calibrated parameters")
    p.add_argument("--compressor-costs", metavar="JSON")
    p.add_argument("--machine-cores", type=int, default=None, metavar="N",
                   help="cores of the machine the runs shared, for run files that do not "
                   "record it (machine_cores): where ranks outnumber them, CPU work measured "
                   "alone is stretched by ranks / cores")
    p.add_argument("--roundtrip", metavar="JSON", default=None,
                   help="'dlcomm bench roundtrip --json' of the same cluster: where ranks "
                   "outnumber the cores, each collective call and negotiation of an operation "
                   "that compresses costs its busy minus idle round trip more")
    _add_outputs(p)
    p.set_defaults(func=run_validate)

    p = actions.add_parser("seeds", help="the seeds' headline comparisons at their scale")
    p.add_argument("--out", metavar="DIR", help="write seeds.md, seeds.json and figures here")
    p.add_argument("--only", default=None, metavar="LIST", help="comma-separated scenarios")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--no-plots", action="store_true")
    p.set_defaults(func=run_seeds)

    p = actions.add_parser("measure", help="run (or print) the emulated-cluster measurements "
                           "calibration and validation need (root; a timing)")
    p.add_argument("stage", choices=("calibration", "validation"))
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--quick", action="store_true", help="a tiny subset: checks the plumbing")
    p.add_argument("--dry-run", action="store_true", help="print the jobs' names and "
                   "commands and how many there are; run nothing")
    p.add_argument("--only", default=None, metavar="REGEX", help="run only the jobs whose "
                   "name matches (Python re.search; --dry-run shows the names), e.g. "
                   "'^4x1gbitx1_' or 'allreduce_ordered'")
    p.add_argument("--keep-going", action="store_true", help="continue after a failed run")
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"),
                   help="validation: the demo's model (default mlp)")
    p.set_defaults(func=run_measure)


# --- handlers ------------------------------------------------------------------------------

def _device(args: argparse.Namespace) -> Any:
    import dataclasses

    from dlcomm.tools.simulate.devices import get_device

    dev = get_device(args.device)
    changes = {}
    if args.device_flops:
        changes["flops"] = args.device_flops
    if args.device_memory_bandwidth:
        changes["memory_bandwidth"] = args.device_memory_bandwidth
    return dataclasses.replace(dev, **changes) if changes else dev


def _workload(args: argparse.Namespace, device: Any) -> Any:
    from dlcomm.tools.simulate.model_zoo import describe, workload_from_description
    from dlcomm.tools.simulate.workload import Workload

    if args.workload:
        workload = Workload.load(args.workload)
    else:
        workload = workload_from_description(describe(args.model), args.batch_size, device)
    if args.timeline:
        from dlcomm.tools.simulate.timeline_profile import (
            timeline_compute,
            workload_from_timeline,
        )

        workload = workload_from_timeline(workload, timeline_compute(args.timeline,
                                                                     args.timeline_rank))
    if args.compute_s is not None:
        workload = workload.with_compute(args.compute_s)
    return workload


def _params(args: argparse.Namespace) -> Any:
    import dataclasses

    from dlcomm.tools.simulate.network import CostParams, preset_params

    if args.params:
        data = json.loads(Path(args.params).read_text())
        params = CostParams.from_dict(data.get("params", data))
    else:
        kwargs = {"local_rate": args.local_rate} if args.local_rate else {}
        params = preset_params(args.network, **kwargs)
    if args.latency_s is not None:
        params = dataclasses.replace(params, alpha=args.latency_s)
    return params


def _stragglers(text: str | None, workers: int, hosts: int, slots: int, iterations: int
                ) -> Any:
    from dlcomm.tools.simulate.traces import StragglerTrace

    if not text:
        return None
    if text.startswith("compute="):
        return StragglerTrace.from_heterogeneity(text, hosts, slots, iterations)
    kind, _, rest = text.partition(":")
    items = dict(item.split("=", 1) for item in rest.split(",") if "=" in item)
    if kind == "constant":
        return StragglerTrace.constant(workers, {int(k): float(v) for k, v in items.items()})
    if kind == "markov":
        return StragglerTrace.markov_stragglers(
            workers, iterations, slow_fraction=float(items.get("slow_fraction", 0.25)),
            slow_speed=float(items.get("slow_speed", 0.5)),
            mean_dwell=float(items.get("dwell", 20)), seed=int(items.get("seed", 0)))
    if Path(text).exists():
        return StragglerTrace.load(text)
    raise ValueError(f"bad --stragglers {text!r}: use constant:I=SPEED, markov:..., "
                     "compute=H:SPEED,seed=N or a JSON file")


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | workers | hosts x slots | ms per iteration | compute ms | exposed ms "
             "| link MB per iteration | samples/s | scaling efficiency | vs first |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    first: dict[int, float] = {}
    for r in rows:
        first.setdefault(r["workers"], r["iteration_s"])
        lines.append(
            f"| {r['method']} | {r['workers']} | {r['hosts']}x{r['slots_per_host']} | "
            f"{r['iteration_s'] * 1e3:.1f} | {r['compute_s'] * 1e3:.1f} | "
            f"{r['exposed_comm_s'] * 1e3:.1f} | {r['link_bytes'] / 1e6:.2f} | "
            f"{r['samples_per_s']:.0f} | {r['scaling_efficiency']:.2f} | "
            f"{first[r['workers']] / r['iteration_s']:.2f}x |")
    return "\n".join(lines) + "\n"


def run_predict(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm simulate predict``."""
    from dlcomm.tools.simulate.compressors import load_measured_costs
    from dlcomm.tools.simulate.messages import check_cpu_share
    from dlcomm.tools.simulate.methods import Method
    from dlcomm.tools.simulate.network import Network, Topology
    from dlcomm.tools.simulate.predict import predict
    from dlcomm.tools.simulate.traces import CongestionTrace

    device = _device(args)
    workload = _workload(args, device)
    if args.cpu_share != 1.0:
        check_cpu_share(args.cpu_share)
        workload = workload.scaled(args.cpu_share, update=True)
    params = _params(args)
    methods = [Method.parse(m) for m in (args.method or ["dense"])]
    costs = load_measured_costs(args.compressor_costs) if args.compressor_costs else None
    rows = []
    for workers in args.workers:
        topo = Topology.for_workers(workers, args.slots_per_host, args.oversubscription)
        network = Network(topo, params)
        stragglers = _stragglers(args.stragglers, workers, topo.hosts, topo.slots_per_host,
                                 args.iterations)
        congestion = None
        if args.congestion:
            if params.beta <= 0:
                raise ValueError("--congestion needs a link rate: give --network or --params "
                                 "with beta > 0")
            congestion = CongestionTrace.from_heterogeneity(
                args.congestion, topo.hosts, 8.0 / params.beta, horizon_s=10 * args.iterations)
        for method in methods:
            pred = predict(workload, method, network, device, measured_costs=costs,
                           stragglers=stragglers, congestion=congestion,
                           iterations=args.iterations, global_every=args.global_every,
                           compression_on_device=not args.compression_own_core,
                           cpu_share=args.cpu_share)
            rows.append(pred.to_dict())
    text = _table(rows)
    print(f"{workload.name}, batch {workload.batch_size} per worker, compute "
          f"{workload.compute_s * 1e3:.1f} ms, {workload.parameter_bytes / 1e6:.1f} MB of "
          "gradients\n")
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        from dlcomm.tools.simulate.plots import draw

        series: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            series.setdefault(r["method"], []).append((r["workers"], r["samples_per_s"]))
        draw({"kind": "lines", "series": series, "xlabel": "workers", "ylabel": "samples/s",
              "title": f"{workload.name} on {args.params or args.network}",
              "logx": len(args.workers) > 2}, args.plot)
    return 0


def _load_factory(spec: str) -> Any:
    import importlib
    import importlib.util

    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"--factory must be MODULE:CALLABLE or FILE.py:CALLABLE, got {spec!r}")
    if target.endswith(".py"):
        path = Path(target)
        if not path.exists():
            raise ValueError(f"--factory: {path} does not exist")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        module = importlib.import_module(target)
    if not hasattr(module, attr):
        raise ValueError(f"--factory: {target} has no {attr!r}")
    return getattr(module, attr)


def run_profile(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm simulate profile``."""
    try:
        import torch
    except ImportError:
        print("dlcomm simulate profile needs torch (pip install -e '.[torch]')", file=sys.stderr)
        return 2
    from dlcomm.tools.simulate.profile_torch import profile_model

    shape = tuple(int(v) for v in args.input_shape.split(","))
    factory = _load_factory(args.factory)
    model = factory(*json.loads(args.factory_args))
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def batch() -> tuple[Any, Any]:
        return (torch.randn(args.batch_size, *shape),
                torch.randint(0, args.classes, (args.batch_size,)))

    workload = profile_model(model, batch, optimizer=opt, warmup=args.warmup,
                             repeats=args.repeats, name=args.name or args.factory)
    workload.save(args.output)
    print(f"{workload.name}: {len(workload.layers)} layers, {len(workload.tensors)} tensors, "
          f"{workload.parameter_bytes / 1e6:.2f} MB; forward {workload.forward_s * 1e3:.2f} ms, "
          f"backward {workload.backward_s * 1e3:.2f} ms, update {workload.update_s * 1e3:.2f} "
          f"ms at batch {workload.batch_size} -> {args.output}")
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm simulate calibrate``."""
    from dlcomm.tools.simulate import calibrate

    if args.compressors:
        from dlcomm.compression.registry import split_spec_list

        specs = split_spec_list(args.specs)
        data = calibrate.measure_compressor_costs(args.sizes, specs, args.repeats)
        Path(args.output).write_text(json.dumps(data, indent=1) + "\n")
        for spec, cost in data["compressors"].items():
            print(f"{spec:>28}: {cost['per_tensor_s'] * 1e6:9.1f} us per tensor + "
                  f"{cost['per_element_s'] * 1e9:7.3f} ns per element")
        return 0
    if not args.files:
        raise ValueError("give bench JSON files to fit (or --compressors)")
    priors = {}
    for item in args.prior:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--prior needs NAME=VALUE, got {item!r}")
        priors[key.strip()] = float(value)
    measurements = calibrate.load_measurements(args.files, peer=args.peer,
                                               algorithm=args.algorithm,
                                               min_bytes=args.min_bytes)
    fit = calibrate.fit(measurements, priors=priors)
    Path(args.output).write_text(json.dumps(fit.to_dict(), indent=1) + "\n")
    text = calibrate.format_fit(fit)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


def run_validate(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm simulate validate``."""
    from dlcomm.tools.simulate.compressors import load_measured_costs
    from dlcomm.tools.simulate.network import CostParams
    from dlcomm.tools.simulate.validate import (
        busy_call_from_roundtrip,
        format_validation,
        load_runs,
        validate,
    )

    data = json.loads(Path(args.params).read_text())
    params = CostParams.from_dict(data.get("params", data))
    costs = load_measured_costs(args.compressor_costs) if args.compressor_costs else None
    if args.machine_cores is not None and args.machine_cores < 1:
        raise ValueError(f"--machine-cores must be >= 1, got {args.machine_cores}")
    busy = (busy_call_from_roundtrip(json.loads(Path(args.roundtrip).read_text()))
            if args.roundtrip else 0.0)
    rows = validate(load_runs(args.files), params, measured_costs=costs,
                    machine_cores=args.machine_cores, busy_call_s=busy)
    if not rows:
        raise ValueError("no multi-rank runs among the files")
    text = format_validation(rows)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.plot:
        from dlcomm.tools.simulate.plots import predicted_vs_measured

        predicted_vs_measured(rows, args.plot)
    return 0


def run_seeds(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm simulate seeds``."""
    from dlcomm.tools.simulate.seeds import SEEDS, format_seeds
    from dlcomm.tools.simulate.seeds import run_seeds as simulate_seeds

    if args.list:
        for name, fn in SEEDS.items():
            print(f"{name:>14}: {(fn.__doc__ or '').strip().splitlines()[0]}")
        return 0
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    results = simulate_seeds(only)
    plots: dict[str, str] = {}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if not args.no_plots:
            from dlcomm.tools.simulate.plots import draw

            for r in results:
                name = f"seed_{r.key}.png"
                draw(r.plot, str(out / name))
                plots[r.key] = name
        text = format_seeds(results, plots)
        (out / "seeds.md").write_text(text)
        (out / "seeds.json").write_text(json.dumps(
            [{"key": r.key, "title": r.title, "paper": r.paper, "setup": r.setup,
              "paper_figure": r.paper_figure, "paper_value": r.paper_value,
              "simulated_figure": r.simulated_figure, "simulated_value": r.simulated_value,
              "same_direction": r.same_direction, "rows": r.rows} for r in results],
            indent=1) + "\n")
        print(f"wrote {out / 'seeds.md'}, seeds.json and {len(plots)} figures")
    else:
        print(format_seeds(results))
    return 0


def run_measure(args: argparse.Namespace) -> int:
    """Handler of ``dlcomm simulate measure``."""
    from dlcomm.tools.simulate import campaign

    out = Path(args.out)
    jobs = (campaign.calibration_jobs(out, quick=args.quick) if args.stage == "calibration"
            else campaign.validation_jobs(out, quick=args.quick, model=args.model))
    chosen = campaign.select_jobs(jobs, args.only)
    if args.only is not None:
        print(f"--only {args.only!r}: {len(chosen)} of the {len(jobs)} {args.stage} jobs",
              flush=True)
    status = campaign.run_jobs(chosen, dry_run=args.dry_run, keep_going=args.keep_going)
    if not args.dry_run and status == 0:
        follow = (f"dlcomm simulate calibrate {out}/calibration/*.json -o {out}/network.json"
                  if args.stage == "calibration" else
                  f"dlcomm simulate validate {out}/validation/*.json --params "
                  f"{out}/network.json --markdown {out}/validation.md --plot "
                  f"{out}/validation.png")
        print(f"next: {follow}")
    return status
