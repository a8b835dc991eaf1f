"""Find strategies by name: ``get_strategy("fedopt:optimizer=yogi,eta=0.03")``.

Spec syntax (as compressors'): ``name [":" param "=" value {"," param "=" value}]``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dlcomm.fl.strategies.base import Strategy
from dlcomm.fl.strategies.fedavg import FedAvg
from dlcomm.fl.strategies.fednova import FedNova
from dlcomm.fl.strategies.fedopt import FedOpt
from dlcomm.fl.strategies.fedprox import FedProx
from dlcomm.fl.strategies.scaffold import Scaffold


def _bool(text: str) -> bool:
    if text.lower() in {"1", "true", "yes"}:
        return True
    if text.lower() in {"0", "false", "no"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class Entry:
    factory: Callable[..., Strategy]
    params: Mapping[str, Callable[[str], object]]


REGISTRY: dict[str, Entry] = {
    "fedavg": Entry(FedAvg, {"server_lr": float, "weighted": _bool}),
    "fedprox": Entry(FedProx, {"mu": float, "server_lr": float, "weighted": _bool}),
    "fedopt": Entry(FedOpt, {"optimizer": str, "eta": float, "beta1": float, "beta2": float,
                             "tau": float, "weighted": _bool}),
    "fednova": Entry(FedNova, {"momentum": float, "server_lr": float, "weighted": _bool}),
    "scaffold": Entry(Scaffold, {"client_lr": float, "server_lr": float, "weighted": _bool}),
}


def available_strategies() -> list[str]:
    """Registered strategy names, sorted."""
    return sorted(REGISTRY)


def get_strategy(spec: str | Strategy) -> Strategy:
    """A new strategy from a spec such as ``"fedprox:mu=0.1"`` (a Strategy passes through)."""
    if isinstance(spec, Strategy):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"strategy must be a name such as 'fedavg' or a Strategy, "
                        f"got {type(spec).__name__}")
    name, _, rest = spec.strip().partition(":")
    entry = REGISTRY.get(name.lower())
    if entry is None:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(available_strategies())}")
    kwargs: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        if not eq or key not in entry.params:
            raise ValueError(f"strategy {name}: bad parameter {item!r}; takes "
                             f"{', '.join(f'{k}=' for k in entry.params)}")
        try:
            kwargs[key] = entry.params[key](raw)
        except ValueError as exc:
            raise ValueError(f"strategy {name}: bad value for {key}: {exc}") from None
    try:
        return entry.factory(**kwargs)
    except TypeError as exc:
        raise ValueError(f"strategy {name}: {exc}") from None
