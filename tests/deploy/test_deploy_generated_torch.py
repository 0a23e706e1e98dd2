"""The fused combinations the zoo's exports use, as torch writes them, run as generated kernels:
squeeze-excite with sigmoid or hardsigmoid, SiLU and hardswish, ConvNeXt's channels-last layer
norm (decomposed before opset 17), ViT's class token, attention and GELU, ShuffleNet's split and
channel shuffle, DenseNet's pre-activation batch norm and concats. Each must match onnxruntime
to 1e-5 relative with only view operators (Reshape, Flatten, Squeeze, Unsqueeze) left in numpy.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.deploy.conftest import onnxruntime_outputs

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from tuner_service.compiler.deploy.concat_inplace import PlacedConcat  # noqa: E402
from tuner_service.compiler.deploy.configs import ConfigBook  # noqa: E402
from tuner_service.compiler.deploy.executor import ModelRunner  # noqa: E402
from tuner_service.compiler.deploy.kernel_step import KernelStep  # noqa: E402
from tuner_service.compiler.deploy.library import build_library  # noqa: E402
from tuner_service.compiler.deploy.loader import KernelLibrary  # noqa: E402

nn = torch.nn
F = torch.nn.functional
VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, gate: Any) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, 4, 1), nn.Conv2d(4, channels, 1)
        self.gate = gate

    def forward(self, x: Any) -> Any:
        return x * self.gate(self.expand(F.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))


class MobileNetV3Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, 1, 1, groups=16)
        self.se, self.fc = SqueezeExcite(16, F.hardsigmoid), nn.Linear(16, 10)

    def forward(self, x: Any) -> Any:
        x = self.se(F.hardswish(self.dw(F.hardswish(self.bn(self.stem(x))))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class EfficientNetBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn1 = nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16)
        self.dw, self.bn2 = nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16)
        self.se = SqueezeExcite(16, torch.sigmoid)

    def forward(self, x: Any) -> Any:
        x = F.silu(self.bn1(self.stem(x)))
        return F.max_pool2d(x + self.se(F.silu(self.bn2(self.dw(x)))), 3, 2, 1, ceil_mode=True)


class ConvNeXtBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.norm0 = nn.Conv2d(3, 16, 4, 4), nn.LayerNorm(16)
        self.dw, self.norm = nn.Conv2d(16, 16, 7, padding=3, groups=16), nn.LayerNorm(16, 1e-6)
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)
        self.gamma = nn.Parameter(torch.full((16,), 0.1))

    def forward(self, x: Any) -> Any:
        x = self.norm0(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = self.down(F.gelu(self.up(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        return (x + (self.gamma * y).permute(0, 3, 1, 2)).mean((-2, -1))


class ViTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, 32))
        self.pos = nn.Parameter(torch.randn(1, 17, 32) * 0.02)
        self.norm1, self.norm2 = nn.LayerNorm(32), nn.LayerNorm(32)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x: Any) -> Any:
        x = torch.cat([self.cls, self.patch(x).flatten(2).transpose(1, 2)], 1) + self.pos
        y = self.norm1(x)
        x = x + self.attention(y, y, y, need_weights=False)[0]
        return (x + self.down(F.gelu(self.up(self.norm2(x)))))[:, 0]


class ShuffleBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.branch, self.bn = nn.Conv2d(3, 16, 3, 2, 1), nn.Conv2d(8, 8, 1), \
            nn.BatchNorm2d(8)

    def forward(self, x: Any) -> Any:
        a, b = F.relu(self.stem(x)).chunk(2, 1)
        x = torch.cat([a, F.relu(self.bn(self.branch(b)))], 1)
        n, c, h, w = x.shape
        x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        return F.avg_pool2d(x, 2)


class DenseBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn1, self.conv1 = nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), \
            nn.Conv2d(8, 4, 3, 1, 1)
        self.bn2, self.conv2 = nn.BatchNorm2d(12), nn.Conv2d(12, 4, 1)

    def forward(self, x: Any) -> Any:
        x = self.stem(x)
        x = torch.cat([x, self.conv1(F.relu(self.bn1(x)))], 1)
        return torch.cat([x, self.conv2(F.relu(self.bn2(x)))], 1)


BLOCKS = {"mobilenet_v3": (MobileNetV3Block, 17), "efficientnet": (EfficientNetBlock, 17),
          "convnext": (ConvNeXtBlock, 14), "vit": (ViTBlock, 14), "vit18": (ViTBlock, 18),
          "shufflenet": (ShuffleBlock, 17), "densenet": (DenseBlock, 17)}


def export(name: str) -> Any:
    cls, opset = BLOCKS[name]
    torch.manual_seed(0)
    module = cls().eval()
    for sub in module.modules():
        if isinstance(sub, nn.BatchNorm2d):  # non-trivial statistics
            sub.running_mean.uniform_(-0.2, 0.2)
            sub.running_var.uniform_(0.5, 1.5)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.randn(1, 3, 32, 32),), buffer, opset_version=opset,
                          dynamo=False)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_zoo_blocks_run_generated(name: str, tmp_path: Path) -> None:
    model = export(name)
    build_library(model, ConfigBook(), tmp_path)
    runner = ModelRunner(model, KernelLibrary(tmp_path))
    feeds = runner.random_feeds(0)
    got, want = runner.run(feeds), onnxruntime_outputs(model, feeds)
    for key, expected in want.items():
        error = float(np.max(np.abs(got[key] - expected)))
        assert error <= 1e-5 * float(np.max(np.abs(expected))), (key, error)
    numpy_ops = {step.info.op_type for step in runner.steps
                 if not isinstance(step, KernelStep | PlacedConcat)}
    assert numpy_ops <= VIEWS, numpy_ops
    assert runner.generated_steps
