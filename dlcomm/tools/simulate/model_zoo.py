"""Model descriptions: per layer, the forward FLOPs of one sample and the parameter tensors.

Enough to simulate without torch: ``workload_from_description(describe("resnet50"), 64,
get_device("v100"))``. The layer lists follow torchvision's ResNet (v1.5), VGG-16 and
AlexNet, Hugging Face's BERT, and the models of dlcomm's examples (their parameter counts
are tested against the real ones). FLOPs count a multiply-add as 2; convolutions and
matrix products only (normalisation, activations and pooling are small next to them).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from dlcomm.tools.simulate.devices import Device
from dlcomm.tools.simulate.workload import Layer, Tensor, Workload

# Backward = BACKWARD_RATIO x forward: gradients of the input and of the weights, each a
# product as large as the forward one.
BACKWARD_RATIO = 2.0
# Bytes moved per parameter by an SGD-with-momentum update (read weight, gradient and
# momentum, write weight and momentum; float32).
UPDATE_BYTES_PER_PARAMETER = 20


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer: forward FLOPs per sample and its parameter tensors."""

    name: str
    forward_flops: float
    tensors: tuple[Tensor, ...]


@dataclasses.dataclass(frozen=True)
class ModelDescription:
    """A model as layers in forward order."""

    name: str
    layers: tuple[LayerSpec, ...]

    @property
    def parameters(self) -> int:
        """Number of parameters."""
        return sum(t.numel for layer in self.layers for t in layer.tensors)

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs of one sample."""
        return sum(layer.forward_flops for layer in self.layers)


class _Builder:
    def __init__(self) -> None:
        self.layers: list[LayerSpec] = []

    def conv(self, name: str, cin: int, cout: int, k: int, out_hw: int, *, bias: bool = False,
             bn: bool = True) -> None:
        tensors = [Tensor(f"{name}.weight", (cout, cin, k, k))]
        if bias:
            tensors.append(Tensor(f"{name}.bias", (cout,)))
        if bn:
            tensors += [Tensor(f"{name}.bn.weight", (cout,)), Tensor(f"{name}.bn.bias", (cout,))]
        self.layers.append(LayerSpec(name, 2.0 * cin * cout * k * k * out_hw * out_hw,
                                     tuple(tensors)))

    def linear(self, name: str, fin: int, fout: int, *, tokens: int = 1, bias: bool = True
               ) -> None:
        tensors = [Tensor(f"{name}.weight", (fout, fin))]
        if bias:
            tensors.append(Tensor(f"{name}.bias", (fout,)))
        self.layers.append(LayerSpec(name, 2.0 * fin * fout * tokens, tuple(tensors)))

    def norm(self, name: str, width: int) -> None:
        self.layers.append(LayerSpec(name, 0.0, (Tensor(f"{name}.weight", (width,)),
                                                 Tensor(f"{name}.bias", (width,)))))

    def embedding(self, name: str, rows: int, width: int) -> None:
        self.layers.append(LayerSpec(name, 0.0, (Tensor(f"{name}.weight", (rows, width)),)))

    def compute(self, name: str, flops: float) -> None:
        """A layer without parameters (attention scores) that still takes time."""
        self.layers.append(LayerSpec(name, flops, ()))


def _resnet(name: str, blocks: tuple[int, int, int, int]) -> ModelDescription:
    b = _Builder()
    b.conv("conv1", 3, 64, 7, 112)
    hw, cin = 56, 64
    for stage, (count, mid) in enumerate(zip(blocks, (64, 128, 256, 512)), start=1):
        for i in range(count):
            stride = 2 if stage > 1 and i == 0 else 1
            out_hw = hw // stride
            p = f"layer{stage}.{i}"
            b.conv(f"{p}.conv1", cin, mid, 1, hw)
            b.conv(f"{p}.conv2", mid, mid, 3, out_hw)
            b.conv(f"{p}.conv3", mid, 4 * mid, 1, out_hw)
            if i == 0:
                b.conv(f"{p}.downsample", cin, 4 * mid, 1, out_hw)
            cin, hw = 4 * mid, out_hw
    b.linear("fc", 2048, 1000)
    return ModelDescription(name, tuple(b.layers))


def _vgg16() -> ModelDescription:
    b = _Builder()
    cin, hw, i = 3, 224, 0
    for item in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                 512, 512, 512, "M"):
        if item == "M":
            hw //= 2
            continue
        b.conv(f"features.{i}", cin, int(item), 3, hw, bias=True, bn=False)
        cin, i = int(item), i + 1
    b.linear("classifier.0", 512 * 7 * 7, 4096)
    b.linear("classifier.3", 4096, 4096)
    b.linear("classifier.6", 4096, 1000)
    return ModelDescription("vgg16", tuple(b.layers))


def _alexnet() -> ModelDescription:
    b = _Builder()
    for name, cin, cout, k, hw in (("features.0", 3, 64, 11, 55), ("features.3", 64, 192, 5, 27),
                                   ("features.6", 192, 384, 3, 13),
                                   ("features.8", 384, 256, 3, 13),
                                   ("features.10", 256, 256, 3, 13)):
        b.conv(name, cin, cout, k, hw, bias=True, bn=False)
    b.linear("classifier.1", 256 * 6 * 6, 4096)
    b.linear("classifier.4", 4096, 4096)
    b.linear("classifier.6", 4096, 1000)
    return ModelDescription("alexnet", tuple(b.layers))


def _bert(name: str, layers: int, width: int, seq: int = 128) -> ModelDescription:
    b = _Builder()
    ffn = 4 * width
    b.embedding("embeddings.word", 30522, width)
    b.embedding("embeddings.position", 512, width)
    b.embedding("embeddings.token_type", 2, width)
    b.norm("embeddings.norm", width)
    for i in range(layers):
        p = f"encoder.{i}"
        for proj in ("query", "key", "value"):
            b.linear(f"{p}.attention.{proj}", width, width, tokens=seq)
        b.compute(f"{p}.attention.scores", 2.0 * 2 * seq * seq * width)
        b.linear(f"{p}.attention.output", width, width, tokens=seq)
        b.norm(f"{p}.attention.norm", width)
        b.linear(f"{p}.intermediate", width, ffn, tokens=seq)
        b.linear(f"{p}.output", ffn, width, tokens=seq)
        b.norm(f"{p}.output.norm", width)
    b.linear("pooler", width, width)
    return ModelDescription(name, tuple(b.layers))


def _mlp(name: str, widths: tuple[int, ...], names: Sequence[str]) -> ModelDescription:
    b = _Builder()
    for layer, fin, fout in zip(names, widths, widths[1:]):
        b.linear(layer, fin, fout)
    return ModelDescription(name, tuple(b.layers))


def _small_cnn(name: str, cin: int, side: int, c1: int, c2: int, hidden: int,
               names: Sequence[str]) -> ModelDescription:
    b = _Builder()
    b.conv(names[0], cin, c1, 3, side, bias=True, bn=False)
    b.conv(names[1], c1, c2, 3, side // 2, bias=True, bn=False)
    b.linear(names[2], c2 * (side // 4) ** 2, hidden)
    b.linear(names[3], hidden, 10)
    return ModelDescription(name, tuple(b.layers))


MODELS: dict[str, Callable[[], ModelDescription]] = {
    "resnet50": lambda: _resnet("resnet50", (3, 4, 6, 3)),
    "resnet101": lambda: _resnet("resnet101", (3, 4, 23, 3)),
    "resnet152": lambda: _resnet("resnet152", (3, 8, 36, 3)),
    "vgg16": _vgg16,
    "alexnet": _alexnet,
    "bert-base": lambda: _bert("bert-base", 12, 768),
    "bert-large": lambda: _bert("bert-large", 24, 1024),
    # dlcomm's examples, with their parameter names (so timelines match them):
    # examples/torch_mnist.py (--model mlp / cnn, width 16) and
    # examples/torch_synthetic_benchmark.py (--model mlp / cnn, torch.nn.Sequential).
    "mnist-mlp": lambda: _mlp("mnist-mlp", (784, 2048, 2048, 10), ("fc1", "fc2", "fc3")),
    "mnist-cnn": lambda: _small_cnn("mnist-cnn", 1, 28, 16, 32, 128,
                                    ("conv1", "conv2", "fc1", "fc2")),
    "synthetic-mlp": lambda: _mlp("synthetic-mlp", (3072, 1536, 1024, 10), ("1", "3", "5")),
    "synthetic-cnn": lambda: _small_cnn("synthetic-cnn", 3, 32, 32, 64, 256,
                                        ("0", "3", "7", "9")),
}


def describe(name: str) -> ModelDescription:
    """The description of a model in ``MODELS``."""
    key = name.strip().lower()
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}; described models: {', '.join(MODELS)} "
                         "(or profile a torch model, or load a workload JSON)")
    return MODELS[key]()


def workload_from_description(description: ModelDescription, batch_size: int, device: Device,
                              *, backward_ratio: float = BACKWARD_RATIO) -> Workload:
    """Per-layer times of ``description`` at ``batch_size`` samples on ``device``."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not backward_ratio > 0:
        raise ValueError(f"backward_ratio must be > 0, got {backward_ratio!r}")
    layers = []
    for spec in description.layers:
        forward = device.seconds_for(spec.forward_flops * batch_size)
        layers.append(Layer(spec.name, forward, forward * backward_ratio, spec.tensors))
    update = device.seconds_for(0.0, UPDATE_BYTES_PER_PARAMETER * description.parameters)
    return Workload(description.name, batch_size, tuple(layers), update)
