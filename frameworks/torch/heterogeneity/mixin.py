"""How a heterogeneity mode's optimizer is made: its mixin class in front of the wrapped
optimizer's class, on the same parameter groups and state."""
from __future__ import annotations

import torch


def build_mixin(mixin: type, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """An optimizer of class ``mixin`` + ``optimizer``'s class on the same parameter groups."""
    base = optimizer.__class__
    cls = type(base.__name__, (mixin, base), {"_optimizer_class": base})
    obj = cls.__new__(cls)
    base.__init__(obj, optimizer.param_groups)
    obj.defaults = dict(optimizer.defaults)
    obj.state.update(optimizer.state)
    return obj
