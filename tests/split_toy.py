"""A tiny masked sequence classifier for split fine-tuning tests: token features, an
attention-style block and a feed-forward block with residual connections and layer norms,
masked mean pooling, a linear head. Small enough for multi-rank equality tests."""
from __future__ import annotations

import torch


class Mixer(torch.nn.Module):
    """A parameterised token mixer that respects the padding mask (an attention stand-in)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.value = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(h @ h.transpose(1, 2) / h.shape[-1] ** 0.5 + bias, dim=-1)
        return self.out(scores @ self.value(h))


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = Mixer(width)
        self.norm1 = torch.nn.LayerNorm(width)
        self.ffn = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                       torch.nn.Linear(2 * width, width))
        self.norm2 = torch.nn.LayerNorm(width)

    def forward(self, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.norm1(h + self.mix(h, bias))
        return self.norm2(h + self.ffn(h))


class ToyClassifier(torch.nn.Module):
    def __init__(self, features: int = 5, width: int = 8, blocks: int = 2,
                 classes: int = 3) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(features, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bias = (1.0 - mask[:, None, :].float()) * -1e4
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, bias)
        m = mask[:, :, None].float()
        return self.head((h * m).sum(1) / m.sum(1))


def toy_batch(seed: int, batch: int, tokens: int = 6, features: int = 5, classes: int = 3
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs, a padding mask (every row at least one token) and labels, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, tokens, features, generator=g)
    lengths = torch.randint(1, tokens + 1, (batch,), generator=g)
    mask = (torch.arange(tokens)[None, :] < lengths[:, None]).long()
    y = torch.randint(0, classes, (batch,), generator=g)
    return x, mask, y
