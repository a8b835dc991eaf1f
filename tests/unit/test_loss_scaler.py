"""LossScaler in one process: argument checks, knobs, skipping, backoff and growth."""
import pytest

torch = pytest.importorskip("torch")

from dlcomm.torch.loss_scaler import LossScaler, gradients_finite  # noqa: E402


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_arguments_are_checked():
    _, opt = _model_and_opt()
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        LossScaler(object())
    with pytest.raises(ValueError, match="loss_scale_init"):
        LossScaler(opt, loss_scale_init=0.0)
    with pytest.raises(ValueError, match="loss_scale_growth_interval"):
        LossScaler(opt, loss_scale_growth_interval=0)
    with pytest.raises(ValueError, match="loss_scale_flag"):
        LossScaler(opt, loss_scale_flag="sometimes")
    with pytest.raises(ValueError, match="fused"):
        LossScaler(opt, loss_scale_flag="fused")  # a plain optimizer has no all-reduce
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScaler(opt, backoff_factor=1.0)


def test_knobs_come_from_the_environment(monkeypatch):
    _, opt = _model_and_opt()
    monkeypatch.setenv("DLCOMM_LOSS_SCALE_INIT", "256")
    monkeypatch.setenv("DLCOMM_LOSS_SCALE_GROWTH_INTERVAL", "7")
    scaler = LossScaler(opt)
    assert scaler.loss_scale == 256.0 and scaler.growth_interval == 7
    assert LossScaler(opt, loss_scale_init=8.0).loss_scale == 8.0  # the argument wins
    monkeypatch.setenv("DLCOMM_LOSS_SCALE_FLAG", "bogus")
    with pytest.raises(ValueError, match="loss_scale_flag"):
        LossScaler(opt)


def test_skips_non_finite_steps_and_unscales():
    model, opt = _model_and_opt()
    scaler = LossScaler(opt, loss_scale_init=64.0, loss_scale_growth_interval=2)
    x = torch.ones(3, 4)
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    results = []
    for step in range(4):
        loss = model(x).sum() * (float("inf") if step == 1 else 1.0)
        scaler.scale(loss).backward()
        results.append((scaler.step(), scaler.loss_scale))
        opt.zero_grad()
        if step != 1:
            ref(x).sum().backward()
            ref_opt.step()
            ref_opt.zero_grad()
    assert results == [(True, 64.0), (False, 32.0), (True, 32.0), (True, 64.0)]
    assert scaler.skipped_steps == 1
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    state = scaler.state_dict()
    other = LossScaler(opt)
    other.load_state_dict(state)
    assert other.loss_scale == 64.0 and other.skipped_steps == 1


def test_gradients_finite():
    assert gradients_finite([torch.ones(3), None])
    assert not gradients_finite([torch.ones(3), torch.tensor([float("nan")])])
