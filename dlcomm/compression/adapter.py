"""What every framework adapter's ``Compression`` namespace shares (framework-free).

Horovod copies its compression classes into each framework; here only the fp16 cast, which
needs the framework's own cast, lives in an adapter. ``make_compression`` builds the
Horovod-style namespace (``Compression.none``, ``.fp16``, ``.topk``, ``.lookup(spec)``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlcomm.compression.registry import (
    available_compressors,
    compressor_from_env,
    get_compressor,
)


class Compressor:
    """Horovod's interface: ``compress(tensor) -> (tensor, ctx)`` and ``decompress``."""

    core_spec: str | None = None  # set for compressors the engine runs (not tensor casts)

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class NoneCompressor(Compressor):
    """No compression."""


class CoreCompressor(Compressor):
    """A compressor of ``dlcomm.compression``, run by the engine (state per tensor name)."""

    def __init__(self, spec: str) -> None:
        self.core_spec = spec
        self.core = get_compressor(spec)  # validates the spec now

    def fresh(self) -> CoreCompressor:
        """A new instance with empty state (each optimizer keeps its own residuals)."""
        return CoreCompressor(self.core_spec)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Compression.lookup({self.core_spec!r})"


class _CompressionMeta(type):
    def __getattr__(cls, name: str) -> CoreCompressor:
        if name.startswith("_") or name not in available_compressors():
            raise AttributeError(
                f"Compression has no {name!r}; available: none, fp16, "
                f"{', '.join(sorted(available_compressors()))}")
        return CoreCompressor(name)


def make_compression(fp16: type[Compressor],
                     casts: Mapping[str, type[Compressor]] | None = None) -> type:
    """The adapter's ``Compression`` namespace around its ``fp16`` cast.

    ``casts`` maps spec names that ``lookup`` answers with an adapter cast instead of a core
    compressor (the MXNet adapter maps "fp16" to its NDArray cast).
    """
    by_name = dict(casts or {})

    def lookup(spec: str) -> type[Compressor] | CoreCompressor:
        """The compressor for a spec string (``"none"``, ``"fp16"``, ``"powersgd:rank=4"``)."""
        if not isinstance(spec, str):
            raise TypeError(f"compression spec must be a str, got {type(spec).__name__}")
        key = spec.strip().lower()
        if key == "none":
            return NoneCompressor
        if key in by_name:
            return by_name[key]
        return CoreCompressor(spec)

    doc = ("Compression algorithms, Horovod style: ``Compression.none``, ``Compression.fp16``,"
           " ``Compression.topk`` (default parameters) or "
           "``Compression.lookup(\"topk:ratio=0.01\")``.")
    return _CompressionMeta("Compression", (), {
        "__doc__": doc, "none": NoneCompressor, "fp16": fp16, "lookup": staticmethod(lookup)})


def resolve(compression: Any, namespace: Any) -> type[Compressor] | Compressor:
    """Accept a ``namespace`` member, a CoreCompressor (copied, so its residuals are the
    caller's own), a spec string, or None (``DLCOMM_COMPRESSION``)."""
    if compression is None:
        spec = compressor_from_env().describe()
        return NoneCompressor if spec == "none" else CoreCompressor(spec)
    if isinstance(compression, str):
        return namespace.lookup(compression)
    if isinstance(compression, CoreCompressor):
        return compression.fresh()
    if isinstance(compression, type) and issubclass(compression, Compressor):
        return compression
    if isinstance(compression, Compressor):
        return compression
    raise TypeError(f"compression must be hvd.Compression.<name>, a spec string or None, "
                    f"got {compression!r}")


def core_compressor(compression: Any) -> Any:
    """The engine-side compressor object of ``compression``, or None for casts and none."""
    return compression.core if isinstance(compression, CoreCompressor) else None
