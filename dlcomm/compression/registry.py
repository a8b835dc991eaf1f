"""Find compressors by name: ``get_compressor("topk:ratio=0.01")`` and ``DLCOMM_COMPRESSION``.

Spec syntax::

    spec   := name [":" param "=" value {"," param "=" value}] ["+" cast]
    cast   := "fp16" | "bf16"        (casts the payloads of `name`, see payload_cast)

e.g. ``"none"``, ``"topk:ratio=0.01,approx=1"``, ``"powersgd:rank=4+fp16"``, ``"qsgd:levels=8"``.
``topk`` also takes ``hierarchical=0|1|auto``: flat (the default), ``htopk`` with the same
parameters, or per tensor whichever of the two measures faster where ranks span several hosts
(``HierarchyChoice``).
Every compressor also takes ``start_iter=N`` (each tensor's first N exchanges go dense, as
DDP's PowerSGD hook's ``start_powerSGD_iter``; ``DenseStart``), ``ef=0|1`` and, with error
feedback, ``mc=0|1`` (momentum correction, on by default; ``mc=0`` keeps error feedback on
the bare gradient whatever the optimizer's momentum, as the PowerSGD paper and DDP's hook
do). ``ef=0|1`` wraps it in ``ErrorFeedback``. It defaults to 1 for
topk, gtopk, htopk, efsignsgd, powersgd and acpsgd, whose convergence relies on it. randomk defaults
to neither memory nor n/k scaling (``ef=0,unbiased=0``): both hand each element about n/k
steps' worth of update at once, which diverges at a dense learning rate (see RandomK).
Bypass knobs (same names as the env variables, see ``compressor_from_env``): tensors with
fewer than ``min_compress_size`` elements, and 1-D tensors unless ``compress_1d``, go dense.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dlcomm.compression.base import DEFAULT_MIN_COMPRESS_SIZE, Compressor
from dlcomm.compression.casts import BF16Compressor, FP16Compressor, NoneCompressor
from dlcomm.compression.dense_start import DenseStart, check_start_iter
from dlcomm.compression.error_feedback import ErrorFeedback
from dlcomm.compression.gtopk import GTopK
from dlcomm.compression.hierarchy_choice import HierarchyChoice
from dlcomm.compression.htopk import HierarchicalTopK
from dlcomm.compression.lowrank import ACPSGD, PowerSGD
from dlcomm.compression.payload_cast import CASTS, PayloadCast
from dlcomm.compression.qsgd import QSGD
from dlcomm.compression.sign import EFSignSGD, Signum
from dlcomm.compression.sparsify import RandomK, TopK

ENV_COMPRESSION = "DLCOMM_COMPRESSION"
ENV_MIN_COMPRESS_SIZE = "DLCOMM_MIN_COMPRESS_SIZE"
ENV_COMPRESS_1D = "DLCOMM_COMPRESS_1D"


# topk's ``hierarchical``: flat (0), always ``htopk`` (1), or chosen per tensor by measured
# cost (auto; ``hierarchy_choice``). A tuple as a parameter type lists the values it takes.
HIERARCHY_MODES = ("0", "1", "auto")

# Parameters every compressor takes (module doc), beside its own.
COMMON_PARAMS: Mapping[str, type] = {"ef": bool, "mc": bool, "start_iter": int}


@dataclass(frozen=True)
class Entry:
    """A registered compressor: its factory, its parameters (name -> type), EF default."""

    factory: Callable[..., Compressor]
    params: Mapping[str, type]
    error_feedback: bool


REGISTRY: dict[str, Entry] = {
    "none": Entry(NoneCompressor, {}, False),
    "fp16": Entry(FP16Compressor, {}, False),
    "bf16": Entry(BF16Compressor, {}, False),
    "topk": Entry(TopK, {"ratio": float, "approx": bool, "hierarchical": HIERARCHY_MODES},
                  True),
    "randomk": Entry(RandomK, {"ratio": float, "seed": int, "unbiased": bool}, False),
    "gtopk": Entry(GTopK, {"ratio": float}, True),
    "htopk": Entry(HierarchicalTopK, {"ratio": float, "approx": bool}, True),
    "efsignsgd": Entry(EFSignSGD, {}, True),
    "signum": Entry(Signum, {}, False),
    "qsgd": Entry(QSGD, {"levels": int, "seed": int, "bucket": int, "norm": float},
                  False),
    "powersgd": Entry(PowerSGD, {"rank": int, "seed": int}, True),
    "acpsgd": Entry(ACPSGD, {"rank": int, "seed": int}, True),
}


def register_compressor(
    name: str, factory: Callable[..., Compressor], params: Mapping[str, type],
    error_feedback: bool = False,
) -> None:
    """Add a compressor under ``name`` (a lower-case word, not already taken)."""
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"compressor name must be a lower-case identifier, got {name!r}")
    if name in REGISTRY:
        raise ValueError(f"compressor {name!r} is already registered")
    if not callable(factory):
        raise TypeError("factory must be callable")
    REGISTRY[name] = Entry(factory, dict(params), bool(error_feedback))


def available_compressors() -> list[str]:
    """Registered compressor names, sorted."""
    return sorted(REGISTRY)


def _parse_value(compressor: str, key: str, raw: str, kind: type | tuple) -> object:
    if isinstance(kind, tuple):
        if raw not in kind:
            raise ValueError(f"{compressor}: parameter {key}={raw!r} is not one of "
                             f"{list(kind)}")
        return raw
    try:
        if kind is bool:
            if raw not in ("0", "1", "true", "false", "True", "False"):
                raise ValueError
            return raw in ("1", "true", "True")
        if kind is int:
            return int(raw)
        return float(raw)
    except ValueError:
        want = "0 or 1" if kind is bool else kind.__name__
        raise ValueError(f"{compressor}: parameter {key}={raw!r} is not {want}") from None


def parse_spec(spec: str) -> tuple[str, dict[str, object], str | None]:
    """Split a spec into (name, parameters, cast); ValueError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"compression spec must be a non-empty str, got {spec!r}; "
                         f"valid names: {available_compressors()}")
    head, plus, cast = spec.strip().partition("+")
    if plus and cast not in CASTS:
        raise ValueError(f"{spec!r}: cast after '+' must be one of {list(CASTS)}, got {cast!r}")
    name, _, arg_text = head.partition(":")
    name = name.strip().lower()
    if name not in REGISTRY:
        raise ValueError(f"unknown compressor {name!r}; valid names: {available_compressors()}")
    entry = REGISTRY[name]
    valid = {**entry.params, **COMMON_PARAMS}
    params: dict[str, object] = {}
    for item in filter(None, (s.strip() for s in arg_text.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in valid:
            raise ValueError(
                f"{name}: unknown parameter {item!r}; valid parameters: {sorted(valid)}"
            )
        params[key] = _parse_value(name, key, raw.strip(), valid[key])
    return name, params, (cast if plus else None)


def format_spec(name: str, params: Mapping[str, object], cast: str | None = None) -> str:
    """The spec ``parse_spec`` reads back as ``(name, params, cast)``: booleans as 0/1."""
    args = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in params.items())
    return f"{name}:{args}" + (f"+{cast}" if cast else "")


def split_spec_list(text: str) -> list[str]:
    """Split a list of specs at ';', or at ',' where a piece with '=' and no ':' stays a
    parameter of the spec before it (``none,topk:ratio=0.01,approx=1`` is two specs)."""
    if ";" in text:
        pieces = text.split(";")
    else:
        pieces = []
        for piece in text.split(","):
            if pieces and "=" in piece and ":" not in piece:
                pieces[-1] += "," + piece
            else:
                pieces.append(piece)
    out = [p.strip() for p in pieces if p.strip()]
    if not out:
        raise ValueError(f"empty list of compression specs: {text!r}")
    return out


def get_compressor(
    spec: str,
    *,
    min_compress_size: int | None = None,
    compress_1d: bool | None = None,
) -> Compressor:
    """Build the compressor named by ``spec`` (see module docstring), with error feedback
    where it is the default, and the bypass knobs applied: each left None comes from its
    environment variable (``DLCOMM_MIN_COMPRESS_SIZE``, ``DLCOMM_COMPRESS_1D``), as every
    knob does, so ``Compression.lookup(...)`` and spec strings honour them too."""
    if min_compress_size is None or compress_1d is None:
        env_size, env_1d = bypass_knobs_from_env()
        min_compress_size = env_size if min_compress_size is None else min_compress_size
        compress_1d = env_1d if compress_1d is None else compress_1d
    name, params, cast = parse_spec(spec)
    hierarchical = params.pop("hierarchical", "0") if name == "topk" else "0"
    if hierarchical != "0":
        return _hierarchical_topk(params, cast, hierarchical, min_compress_size, compress_1d)
    entry = REGISTRY[name]
    ef = bool(params.pop("ef", entry.error_feedback))
    mc = params.pop("mc", None)
    if mc is not None and not ef:
        raise ValueError(f"{spec!r}: mc (momentum correction) belongs to error feedback, "
                         f"which is off here (ef=0)")
    start_iter = check_start_iter(params.pop("start_iter", 0))
    compressor = entry.factory(
        **params, min_compress_size=min_compress_size, compress_1d=compress_1d
    )
    if cast is not None:
        compressor = PayloadCast(compressor, cast)
    if ef:
        compressor = ErrorFeedback(compressor, momentum_correction=mc is None or bool(mc))
    if start_iter:
        compressor = DenseStart(compressor, start_iter)
    return compressor


def _hierarchical_topk(params: dict[str, object], cast: str | None, mode: str,
                       min_compress_size: int, compress_1d: bool) -> Compressor:
    """``topk:...,hierarchical=1`` is ``htopk:...``; ``hierarchical=auto`` a
    ``HierarchyChoice`` between the two, each with its own error feedback, under one
    ``DenseStart`` (which counts a tensor's dense exchanges before either sees it)."""
    def build(compressor: str, params: dict[str, object]) -> Compressor:
        return get_compressor(format_spec(compressor, params, cast),
                              min_compress_size=min_compress_size, compress_1d=compress_1d)

    if mode == "1":
        return build("htopk", params)
    start_iter = check_start_iter(params.pop("start_iter", 0))
    chosen = HierarchyChoice(build("topk", params), build("htopk", params))
    return DenseStart(chosen, start_iter) if start_iter else chosen


def compressor_from_env(
    default: str = "none", env: Mapping[str, str] | None = None
) -> Compressor:
    """The compressor named by ``DLCOMM_COMPRESSION`` (``default`` when unset), with
    ``DLCOMM_MIN_COMPRESS_SIZE`` and ``DLCOMM_COMPRESS_1D`` (0/1) as bypass knobs."""
    env = os.environ if env is None else env
    spec = env.get(ENV_COMPRESSION, "").strip() or default
    min_size, compress_1d = bypass_knobs_from_env(env)
    return get_compressor(spec, min_compress_size=min_size, compress_1d=compress_1d)


def bypass_knobs_from_env(env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """``(min_compress_size, compress_1d)`` from ``DLCOMM_MIN_COMPRESS_SIZE`` and
    ``DLCOMM_COMPRESS_1D`` (0/1), their defaults where unset; ValueError on a bad value."""
    env = os.environ if env is None else env
    raw_size = env.get(ENV_MIN_COMPRESS_SIZE, str(DEFAULT_MIN_COMPRESS_SIZE)).strip()
    try:
        min_size = int(raw_size)
    except ValueError:
        raise ValueError(f"{ENV_MIN_COMPRESS_SIZE}={raw_size!r} is not an int") from None
    if min_size < 0:
        raise ValueError(f"{ENV_MIN_COMPRESS_SIZE}={raw_size!r} must be >= 0")
    raw_1d = env.get(ENV_COMPRESS_1D, "0").strip()
    if raw_1d not in ("0", "1"):
        raise ValueError(f"{ENV_COMPRESS_1D}={raw_1d!r} must be 0 or 1")
    return min_size, raw_1d == "1"
