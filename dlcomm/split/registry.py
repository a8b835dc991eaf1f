"""Split codecs by name: ``get_codec("lowrank:energy=0.95,dtype=float16")``.

Spec syntax (as ``dlcomm.compression``'s): ``name[:param=value{,param=value}]``. Every codec
takes ``memory=delta`` or ``memory=feedback`` (``dlcomm.split.memory``): a per-sample
correction, which needs the batch's sample ids.

=========  =====================================================  ==========================
name       parameters                                             travels per array
=========  =====================================================  ==========================
none       -                                                      the array
fp16       -                                                      float16 values, one scale
lowrank    rank=R | energy=E, max_rank=R, dtype=float32|float16   r (rows + cols) numbers
topk       ratio=R, dtype=float32|float16                         k values and k positions
=========  =====================================================  ==========================
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dlcomm.split.codec import Codec, Float16Codec, NoneCodec
from dlcomm.split.lowrank import LowRankCodec
from dlcomm.split.memory import MODES, SampleMemory
from dlcomm.split.topk import TopKCodec


@dataclass(frozen=True)
class CodecEntry:
    """A codec's factory and its parameters (name -> type)."""

    factory: Callable[..., Codec]
    params: Mapping[str, type]


CODECS: dict[str, CodecEntry] = {
    "none": CodecEntry(NoneCodec, {}),
    "fp16": CodecEntry(Float16Codec, {}),
    "lowrank": CodecEntry(LowRankCodec, {"rank": int, "energy": float, "max_rank": int,
                                          "dtype": str}),
    "topk": CodecEntry(TopKCodec, {"ratio": float, "dtype": str}),
}


def available_codecs() -> list[str]:
    """The codec names ``get_codec`` knows, sorted."""
    return sorted(CODECS)


def parse_codec_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """(name, parameters) of ``spec``; ValueError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"codec spec must be a non-empty str such as 'lowrank:rank=8', got "
                         f"{spec!r}; codecs: {available_codecs()}")
    name, _, arg_text = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in CODECS:
        raise ValueError(f"unknown split codec {name!r}; codecs: {available_codecs()}")
    valid = {**CODECS[name].params, "memory": str}
    params: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in arg_text.split(","))):
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or key not in valid:
            raise ValueError(f"{name}: unknown parameter {item!r}; parameters: {sorted(valid)}")
        if key in params:
            raise ValueError(f"{name}: parameter {key!r} given twice")
        try:
            params[key] = valid[key](raw)
        except ValueError:
            raise ValueError(f"{name}: {key}={raw!r} is not {valid[key].__name__}") from None
    return name, params


def get_codec(spec: str | Codec | SampleMemory) -> Codec | SampleMemory:
    """The codec ``spec`` names (a codec object is returned as it is)."""
    if isinstance(spec, (Codec, SampleMemory)):
        return spec
    name, params = parse_codec_spec(spec)
    memory = params.pop("memory", "none")
    if memory not in (*MODES, "none"):
        raise ValueError(f"{name}: memory must be none, delta or feedback, got {memory!r}")
    codec = CODECS[name].factory(**params)
    return codec if memory == "none" else SampleMemory(codec, memory)
