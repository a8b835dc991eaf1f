"""The fused parameter update (``DLCOMM_FUSED_UPDATE``): which groups get torch's foreach or
fused paths, that ``foreach`` changes no result by a single bit and ``fused`` only rounds,
that sparse gradients still step, and that the user's own choice is kept."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from one_rank import one_rank_dlcomm  # noqa: E402

from dlcomm.torch.fused_update import (  # noqa: E402
    configure_update,
    resolve_fused_update,
    wrapped_step,
)

OPTIMIZERS = [
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (torch.optim.Adam, dict(lr=1e-3)),
    (torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.01)),
    (torch.optim.Adagrad, dict(lr=0.1)),
    (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5)),
]


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    # Several shapes, odd sizes, one scalar: the multi-tensor paths group and chunk them.
    shapes = [(1000, 37), (37,), (3, 5, 7), ()]
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _train(cls: type, kwargs: dict, mode: str | None, steps: int = 6) -> list[torch.Tensor]:
    params = _params()
    optimizer = cls(params, **kwargs)
    if mode is not None:
        configure_update(optimizer, cls, mode)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("cls,kwargs", OPTIMIZERS, ids=lambda x: getattr(x, "__name__", ""))
def test_foreach_is_bitwise_equal_to_the_per_tensor_loop(cls, kwargs):
    loop = _train(cls, dict(kwargs, foreach=False), None)
    foreach = _train(cls, kwargs, "foreach")
    for a, b in zip(loop, foreach):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cls,kwargs", OPTIMIZERS, ids=lambda x: getattr(x, "__name__", ""))
def test_fused_follows_the_loop_to_rounding(cls, kwargs):
    loop = _train(cls, dict(kwargs, foreach=False), None)
    fused = _train(cls, kwargs, "fused")
    for a, b in zip(loop, fused):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_which_path_each_optimizer_gets():
    def used(cls, mode, **kwargs):
        return configure_update(cls(_params(), **kwargs), cls, mode)

    assert used(torch.optim.SGD, "foreach", lr=0.1) == "foreach"
    assert used(torch.optim.SGD, "fused", lr=0.1) == "fused"
    assert used(torch.optim.Adam, "fused") == "fused"
    assert used(torch.optim.RMSprop, "fused") == "foreach"  # torch has no fused RMSprop
    assert used(torch.optim.SGD, "off", lr=0.1) == "per-tensor"
    # The user's explicit choice stays, either way.
    assert used(torch.optim.SGD, "fused", lr=0.1, foreach=False) == "user"
    assert used(torch.optim.Adam, "foreach", fused=True) == "user"


def test_an_optimizer_without_the_options_steps_per_tensor():
    class Plain(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, dict(lr=lr))

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.data.add_(p.grad, alpha=-group["lr"])

    optimizer = Plain(_params())
    assert configure_update(optimizer, Plain, "fused") == "per-tensor"
    assert "foreach" not in optimizer.param_groups[0]


def test_groups_are_configured_one_by_one():
    params = _params()
    optimizer = torch.optim.SGD([{"params": params[:2], "foreach": False},
                                 {"params": params[2:]}], lr=0.1)
    assert configure_update(optimizer, torch.optim.SGD, "foreach") == "user+foreach"
    assert optimizer.param_groups[0]["foreach"] is False
    assert optimizer.param_groups[1]["foreach"] is True


@pytest.mark.parametrize("mode", ["foreach", "fused"])
def test_sparse_gradients_step(mode):
    embedding = torch.nn.Embedding(50, 4, sparse=True)
    optimizer = torch.optim.SGD(embedding.parameters(), lr=0.5, momentum=0.9)
    configure_update(optimizer, torch.optim.SGD, mode)
    before = embedding.weight.detach().clone()
    embedding(torch.tensor([3, 7])).sum().backward()
    assert embedding.weight.grad.is_sparse
    if mode == "fused":  # torch's fused kernel refuses it; the wrapped step goes around
        with pytest.raises(RuntimeError, match="sparse"):
            optimizer.step()
    wrapped_step(optimizer, torch.optim.SGD)
    assert bool(optimizer.param_groups[0]["fused"]) is (mode == "fused")
    changed = (embedding.weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3, 7]


def test_modes_are_validated(monkeypatch):
    monkeypatch.setenv("DLCOMM_FUSED_UPDATE", "Fused")
    assert resolve_fused_update(None) == "fused"
    assert resolve_fused_update(" ForEach ") == "foreach"
    monkeypatch.delenv("DLCOMM_FUSED_UPDATE")
    assert resolve_fused_update(None) == "off"
    with pytest.raises(ValueError, match="valid: off, foreach, fused"):
        resolve_fused_update("fast")
    monkeypatch.setenv("DLCOMM_FUSED_UPDATE", "yes")
    with pytest.raises(ValueError, match="DLCOMM_FUSED_UPDATE"):
        resolve_fused_update(None)
    with pytest.raises(TypeError, match="must be a str"):
        resolve_fused_update(True)
    with pytest.raises(ValueError, match="unknown fused update mode"):
        configure_update(torch.optim.SGD(_params(), lr=0.1), torch.optim.SGD, "fast")


def test_distributed_optimizer_reports_its_update(monkeypatch):
    import dlcomm.torch as hvd

    monkeypatch.delenv("DLCOMM_FUSED_UPDATE", raising=False)
    with one_rank_dlcomm():
        def wrap(make, **kwargs):  # a model of its own: optimizers hook their parameters
            model = torch.nn.Linear(5, 3)
            opt = hvd.DistributedOptimizer(make(model.parameters()),
                                           named_parameters=model.named_parameters(), **kwargs)
            return model, opt

        _, opt = wrap(lambda p: torch.optim.SGD(p, lr=0.1))
        assert opt.update_implementation == "per-tensor"
        model, opt = wrap(torch.optim.Adam, fused_update="fused")
        assert opt.update_implementation == "fused"
        model(torch.ones(2, 5)).sum().backward()
        opt.step()
        monkeypatch.setenv("DLCOMM_FUSED_UPDATE", "foreach")
        _, opt = wrap(lambda p: torch.optim.SGD(p, lr=0.1))
        assert opt.update_implementation == "foreach"
