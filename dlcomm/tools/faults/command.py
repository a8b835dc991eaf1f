"""``dlcomm faults``: seeded fault runs of an elastic job on the emulated cluster.

    dlcomm faults --runs 20 --kinds process,host,link --seed 0 --out runs/faults

Needs root and ip/tc (the emulated cluster). Prints a markdown table and writes every run's
figures to ``OUT/faults.json``; each run's driver log and event logs stay in ``OUT``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "faults"


def _kinds(text: str) -> list[str]:
    from dlcomm.tools.faults.inject import KINDS  # noqa: PLC0415 - keep `dlcomm --help` fast

    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise argparse.ArgumentTypeError(f"kinds must be a list of {', '.join(KINDS)}, "
                                         f"got {text!r}")
    return kinds


def _positive(kind: type) -> callable:
    def parse(text: str) -> int | float:
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value
    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(NAME, help="seeded fault runs of an elastic job",
                              description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=_positive(int), default=20, help="fault runs (default 20)")
    p.add_argument("--kinds", type=_kinds, default=["process", "host", "link"],
                   help="faults to cycle through: process, host, link (default all three)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first run")
    p.add_argument("--emulate", default="4x1gbit", help="emulated cluster (default 4x1gbit)")
    p.add_argument("--min-np", type=_positive(int), default=2)
    p.add_argument("--max-np", type=_positive(int), default=4)
    p.add_argument("--epochs", type=_positive(int), default=6)
    p.add_argument("--step-seconds", type=float, default=0.0,
                   help="extra seconds per training step (a larger model)")
    p.add_argument("--timeout", type=_positive(float), default=600.0,
                   help="seconds one run may take")
    p.add_argument("--out", type=Path, required=True, help="folder for logs and faults.json")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dlcomm.tools.faults.campaign import (  # noqa: PLC0415 - keep `dlcomm --help` fast
        JobSettings,
        campaign,
        summary_table,
    )

    settings = JobSettings(emulate=args.emulate, min_np=args.min_np, max_np=args.max_np,
                           epochs=args.epochs, step_seconds=args.step_seconds,
                           timeout_s=args.timeout)
    baseline, runs = campaign(settings, args.kinds, args.runs, args.seed, args.out)
    (args.out / "faults.json").write_text(json.dumps(
        {"settings": vars(settings) if hasattr(settings, "__dict__") else {},
         "baseline": baseline.as_dict(), "runs": [r.as_dict() for r in runs]}, indent=1))
    print(summary_table(baseline, runs))
    ok = all(r.exit_code == 0 and r.recovery is not None
             and not r.recovery.committed_step_lost for r in runs)
    return 0 if ok else 1
