"""LARS and LAMB against steps computed by hand, exclusions for biases and norms, and the
warm-up + decay schedule."""
import math

import pytest

torch = pytest.importorskip("torch")

from dlcomm.torch import LAMB, LARS, exclude_bias_and_norm  # noqa: E402
from dlcomm.torch.lr_warmup import warmup_decay_factor, warmup_lr_scheduler  # noqa: E402


def _param(values, grad):
    p = torch.nn.Parameter(torch.tensor(values, dtype=torch.float32))
    p.grad = torch.tensor(grad, dtype=torch.float32)
    return p


def test_lars_step_by_hand():
    # w = (3, 4) as a 1x2 matrix, |w| = 5; g = (0.6, 0.8), |g| = 1; weight decay 0.1:
    # ratio = 0.001 * 5 / (1 + 0.1 * 5) = 1/300; d = (g + 0.1 w) * ratio = (0.003, 0.004)
    w = _param([[3.0, 4.0]], [[0.6, 0.8]])
    b = _param([1.0, -1.0], [0.5, 0.25])  # 1-D: no ratio, plain SGD with weight decay
    opt = LARS([w, b], lr=1.0, momentum=0.9, weight_decay=0.1, trust_coefficient=0.001, eps=0)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([[3.0 - 0.003, 4.0 - 0.004]]))
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - 0.6, -1.0 - 0.15]))
    # second step, same gradient: momentum buffer = 0.9 * d1 + d2
    w_norm = math.hypot(2.997, 3.996)
    ratio = 0.001 * w_norm / (1.0 + 0.1 * w_norm)
    d2 = [(0.6 + 0.1 * 2.997) * ratio, (0.8 + 0.1 * 3.996) * ratio]
    opt.step()
    expected = [2.997 - (0.9 * 0.003 + d2[0]), 3.996 - (0.9 * 0.004 + d2[1])]
    torch.testing.assert_close(w.detach(), torch.tensor([expected]), rtol=1e-6, atol=1e-7)


def test_lamb_step_by_hand():
    # first step: m_hat = g, v_hat = g^2, so Adam's step is sign(g) = (1, 1) (eps = 0);
    # r = (1, 1) + 0.1 * (3, 4) = (1.3, 1.4); ratio = |w| / |r| = 5 / sqrt(3.65)
    w = _param([[3.0, 4.0]], [[0.6, 0.8]])
    opt = LAMB([w], lr=0.01, betas=(0.9, 0.999), eps=0.0, weight_decay=0.1)
    opt.step()
    ratio = 5.0 / math.sqrt(1.3 ** 2 + 1.4 ** 2)
    torch.testing.assert_close(
        w.detach(), torch.tensor([[3.0 - 0.01 * ratio * 1.3, 4.0 - 0.01 * ratio * 1.4]]))


def test_trust_ratio_group_key_overrides_the_default():
    w = _param([[3.0, 4.0]], [[0.6, 0.8]])
    opt = LARS([{"params": [w], "trust_ratio": False}], lr=1.0, momentum=0.0)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([[2.4, 3.2]]))  # plain SGD


def test_zero_weights_take_ratio_one():
    w = _param([[0.0, 0.0]], [[1.0, 2.0]])
    LARS([w], lr=0.5, momentum=0.0).step()
    torch.testing.assert_close(w.detach(), torch.tensor([[-0.5, -1.0]]))


def test_exclude_bias_and_norm():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3),
                                torch.nn.Conv1d(1, 2, 3), torch.nn.BatchNorm1d(2))
    adapted, excluded = exclude_bias_and_norm(model, weight_decay=5e-4)
    assert adapted["weight_decay"] == 5e-4 and adapted["trust_ratio"] is True
    assert excluded["weight_decay"] == 0.0 and excluded["trust_ratio"] is False
    ids = {id(p) for p in adapted["params"]}
    assert ids == {id(model[0].weight), id(model[2].weight)}
    assert len(excluded["params"]) == 6  # 2 biases, LayerNorm and BatchNorm weight + bias
    LARS(exclude_bias_and_norm(model), lr=0.1)  # usable as param groups
    with pytest.raises(TypeError, match="torch.nn.Module"):
        exclude_bias_and_norm([])


def test_arguments_are_checked():
    w = _param([[1.0]], [[1.0]])
    with pytest.raises(ValueError, match="momentum"):
        LARS([w], momentum=1.0)
    with pytest.raises(ValueError, match="trust_coefficient"):
        LARS([w], trust_coefficient=0)
    with pytest.raises(ValueError, match="betas"):
        LAMB([w], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr"):
        LAMB([w], lr=-1)


def test_warmup_then_decay():
    assert [warmup_decay_factor(s, 4, 10) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert warmup_decay_factor(4, 4, 10) == 1.0
    assert warmup_decay_factor(7, 4, 10, power=2.0) == pytest.approx((1 - 3 / 6) ** 2)
    assert warmup_decay_factor(7, 4, 10, decay="cosine") == pytest.approx(0.5)
    assert warmup_decay_factor(10, 4, 10, end_factor=0.1) == pytest.approx(0.1)
    assert warmup_decay_factor(50, 4, 10) == 0.0
    w = _param([[1.0]], [[1.0]])
    opt = LARS([w], lr=0.8)
    sched = warmup_lr_scheduler(opt, warmup_steps=2, total_steps=6, decay="cosine")
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.4, 0.8, 0.8])
    assert lrs[3] == pytest.approx(0.8 * 0.5 * (1 + math.cos(math.pi / 4)))
    with pytest.raises(ValueError, match="decay"):
        warmup_lr_scheduler(opt, 1, 2, decay="linear")
    with pytest.raises(ValueError, match="total_steps"):
        warmup_lr_scheduler(opt, 5, 2)
