"""Small torch models whose exports compute shapes at run time, exported both ways.

``ShuffleBlocks``: ShuffleNet-v2's channel split (``chunk``), branch convs and channel shuffle
(``view``/``transpose``). ``Attention``: a multi-head attention layer whose reshapes read the
batch and sequence length from the input (exported with those two dimensions dynamic).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn


class _Shuffle(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        half = channels // 2
        self.branch = nn.Sequential(
            nn.Conv2d(half, half, 1), nn.BatchNorm2d(half), nn.ReLU(),
            nn.Conv2d(half, half, 3, padding=1, groups=half), nn.Conv2d(half, half, 1), nn.ReLU())

    def forward(self, x: Any) -> Any:
        left, right = x.chunk(2, dim=1)
        out = torch.cat((left, self.branch(right)), dim=1)
        n, c, h, w = out.size()
        return out.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class ShuffleBlocks(nn.Module):
    """Stem conv, three shuffle blocks, global pooling, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(*(_Shuffle(16) for _ in range(3)))
        self.fc = nn.Linear(16, 10)

    def forward(self, x: Any) -> Any:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class Attention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: Any) -> Any:
        b, s, d = x.shape
        split = [t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                 for t in (self.q(x), self.k(x), self.v(x))]
        scores = torch.softmax(split[0] @ split[1].transpose(-1, -2) / 8.0, dim=-1)
        return self.o((scores @ split[2]).transpose(1, 2).reshape(b, s, d))


def export(module: nn.Module, example: Any, path: Path, dynamo: bool,
           dynamic: dict[int, str] | None = None) -> Path:
    """Export ``module`` (input named ``x``) to ``path``; the dynamo exporter writes the weights
    to ``path.data`` beside it. ``dynamic`` maps axes of ``x`` to dimension names."""
    torch.manual_seed(0)
    module = module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # exporter deprecation and progress notes
        if dynamo:
            shapes = ({"x": {axis: torch.export.Dim(name) for axis, name in dynamic.items()}}
                      if dynamic else None)
            torch.onnx.export(module, (example,), str(path), dynamo=True, input_names=["x"],
                              dynamic_shapes=shapes, verbose=False)
        else:
            axes = {"x": dynamic} if dynamic else None
            torch.onnx.export(module, (example,), str(path), dynamo=False, opset_version=17,
                              input_names=["x"], dynamic_axes=axes)
    return path
