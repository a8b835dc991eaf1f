"""Cross-rank agreement on a sync algorithm's settings, checked once at construction.

DS-Sync, LB-BSP and DLCP derive their plans (partitions, batch sizes, chunk plans) on every
rank independently; ranks built with different settings would split communicators that do
not match, hand out overlapping samples or post receives of the wrong size: a hang or
silent corruption. One small all-gather of the settings turns that into an error on every
rank, naming the settings that differ and each rank's value.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dlcomm.errors import MismatchError


def differing_settings(per_rank: list[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The settings whose values are not the same on every rank: name -> value per rank."""
    names = sorted({k for settings in per_rank for k in settings})
    out: dict[str, list[Any]] = {}
    for name in names:
        values = [settings.get(name) for settings in per_rank]
        if any(v != values[0] for v in values[1:]):
            out[name] = values
    return out


def check_same_settings(comm: Any, what: str, settings: Mapping[str, Any],
                        ranks: Sequence[int] | None = None) -> None:
    """Raise ``MismatchError`` on every rank of ``comm`` unless all passed equal ``settings``
    (collective: every rank of ``comm`` calls it at the same point). ``ranks`` names the
    members in the message (default: their ranks in ``comm``), e.g. a group's global ranks."""
    if not isinstance(settings, Mapping):
        raise TypeError(f"settings must be a mapping, got {type(settings).__name__}")
    every = comm.allgather(dict(settings))
    names = list(range(len(every))) if ranks is None else list(ranks)
    if len(names) != len(every):
        raise ValueError(f"ranks lists {len(names)} members but the communicator has "
                         f"{len(every)}")
    message = settings_mismatch(what, names, every)
    if message:
        raise MismatchError(message)


def settings_mismatch(what: str, names: Sequence[int], per_rank: list[Mapping[str, Any]]
                      ) -> str | None:
    """The error text when ``per_rank`` (the settings of the ranks ``names``, in order)
    differ, naming each differing setting and every rank's value; None when they agree."""
    differ = differing_settings(per_rank)
    if not differ:
        return None
    lines = "; ".join(f"{name}: " + ", ".join(f"rank {r}: {v!r}" for r, v in zip(names, vals))
                      for name, vals in differ.items())
    return (f"{what} was built with different settings on different ranks ({lines}); "
            "every rank must pass the same")
