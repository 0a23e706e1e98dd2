"""Models as ``torch.onnx.export`` writes them run with our kernels and match onnxruntime."""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest

from tests.deploy.conftest import RunModel, assert_close

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

nn = torch.nn


class ConvBnRelu(nn.Sequential):
    def __init__(self, cin: int, cout: int, stride: int = 1, groups: int = 1,
                 act: Any = nn.ReLU) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), act())


class Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.a = ConvBnRelu(channels, channels)
        self.b = nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1), nn.BatchNorm2d(channels))

    def forward(self, x: Any) -> Any:
        return torch.relu(self.b(self.a(x)) + x)


class InvertedResidual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = channels * 4
        self.body = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6(),
            ConvBnRelu(hidden, hidden, groups=hidden, act=nn.ReLU6),
            nn.Conv2d(hidden, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: Any) -> Any:
        return x + self.body(x)


class Bottleneck(nn.Module):
    """ResNeXt's block: 1x1, grouped 3x3 (stride 2, 4 channels per group), 1x1, shortcut."""

    def __init__(self, cin: int, width: int, cout: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            ConvBnRelu(width, width, stride=2, groups=width // 4),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: Any) -> Any:
        return torch.relu(self.body(x) + self.shortcut(x))


class Conv1dStack(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Conv1d(8, 16, 5, padding=2, groups=2), nn.ReLU(),
                         nn.Conv1d(16, 16, 3, stride=2, dilation=2, groups=4), nn.Tanh(),
                         nn.Conv1d(16, 4, 1))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(ConvBnRelu(3, 16, stride=2), nn.MaxPool2d(3, 2, 1))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(),
                                  nn.Linear(32, 10))

    def forward(self, x: Any) -> Any:
        return torch.softmax(self.head(self.features(x)), dim=-1)


class EncoderMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: Any) -> Any:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: Any) -> Any:
        return self.attn(x, x, x, need_weights=False)[0]


def _exported(module: Any, shape: tuple[int, ...]) -> Any:
    torch.manual_seed(0)
    for m in module.modules():  # non-trivial batch-norm statistics
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(shape),), buffer, dynamo=False,
                          opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize(("module", "shape"), [
    (lambda: Residual(8), (1, 8, 8, 8)),
    (lambda: InvertedResidual(8), (1, 8, 12, 12)),
    (Classifier, (1, 3, 16, 16)),
    (EncoderMlp, (2, 6, 32)),
    (Attention, (1, 8, 32)),
    (lambda: Bottleneck(16, 32, 32), (1, 16, 13, 11)),
    (Conv1dStack, (2, 8, 41)),
], ids=["residual", "inverted_residual", "classifier", "encoder_mlp", "attention",
        "resnext_bottleneck", "conv1d_stack"])
def test_exported_module_matches_onnxruntime(run_model: RunModel, module: Any,
                                             shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    got, want = run_model(_exported(module(), shape))
    assert_close(got, want)
