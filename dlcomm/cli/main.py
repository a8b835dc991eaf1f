"""``dlcomm``: the command-line tools (timeline summary and plot, benchmarks), by name.

Each subcommand lives in its own module with ``register(subparsers)``, which adds its parser
and sets ``func(args) -> int`` as the default. ``SUBCOMMANDS`` lists them; a listed module
that does not exist yet gets a placeholder that says so, so adding one is one line (or none).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import version

# name -> module defining register(subparsers). Keep imports inside handlers: every module
# here is imported on each `dlcomm` call to build the help.
SUBCOMMANDS: dict[str, str] = {
    "timeline": "dlcomm.tools.timeline.command",
    "bench": "dlcomm.tools.bench.command",
    "simulate": "dlcomm.tools.simulate.cli",
    "faults": "dlcomm.tools.faults.command",
}

EXIT_NOT_AVAILABLE = 2


def _version() -> str:
    """The installed dlcomm version, or 'unknown' from an uninstalled tree."""
    try:
        return version("dlcomm")
    except Exception:  # noqa: BLE001 - any metadata problem just means "unknown"
        return "unknown"


def _register_placeholder(subparsers: argparse._SubParsersAction, name: str) -> None:
    """A subcommand whose module is not written yet: accepts anything, exits 2."""
    parser = subparsers.add_parser(name, help="(not yet available)", add_help=False)

    def _not_available(_args: argparse.Namespace) -> int:
        print(f"dlcomm {name}: not yet available in this version of dlcomm", file=sys.stderr)
        return EXIT_NOT_AVAILABLE

    parser.set_defaults(func=_not_available, accepts_any_arguments=True)


def build_parser() -> argparse.ArgumentParser:
    """The ``dlcomm`` parser with every subcommand in ``SUBCOMMANDS`` registered."""
    parser = argparse.ArgumentParser(
        prog="dlcomm", description="dlcomm tools. Launch training jobs with dlcommrun."
    )
    parser.add_argument("--version", action="version", version=f"dlcomm {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # the module exists but one of its imports is missing
            _register_placeholder(subparsers, name)
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(None if argv is None else list(argv))
    if unknown and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args))
    except (ValueError, OSError) as exc:
        print(f"dlcomm {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
