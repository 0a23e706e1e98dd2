"""Extraction on what ``torch.onnx.export`` really emits for small modules."""

from __future__ import annotations

import io
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from tuner_service.compiler.frontend.extract import ExtractionResult, extract_tasks  # noqa: E402


class _BatchedMatmul(torch.nn.Module):
    def forward(self, a: Any, b: Any) -> Any:
        return torch.matmul(a, b)


def _export(module: Any, *args: Any, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter announces its deprecation
        # dynamo=False: the torch.export-based exporter needs onnxscript, which is not a
        # dependency of ours; the TorchScript exporter emits the same operators here.
        torch.onnx.export(module.eval(), args, buffer, dynamo=False, opset_version=17, **kwargs)
    return buffer.getvalue()


def _summary(result: ExtractionResult) -> list[tuple[str, int]]:
    return [(task.workload.key, task.weight) for task in result.tasks]


@pytest.mark.parametrize(
    ("module", "shapes", "expected"),
    [
        (
            torch.nn.Conv2d(8, 16, 3, padding=1),
            [(1, 8, 16, 16)],
            "conv2d:N=1,C=8,H=16,W=16,K=16,R=3,S=3,pad=1,epilogue=bias",
        ),
        (
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=8, bias=False),
            [(1, 8, 16, 16)],
            "depthwise_conv2d:N=1,C=8,H=16,W=16,R=3,S=3,stride=2,pad=1,multiplier=2",
        ),
        (
            torch.nn.Conv2d(4, 4, (3, 1), dilation=(2, 1), padding=(2, 0)),
            [(2, 4, 10, 10)],
            "conv2d:N=2,C=4,H=10,W=10,K=4,R=3,S=1,pad=2x0x2x0,dilation=2x1,epilogue=bias",
        ),
        (
            torch.nn.Conv2d(8, 16, 3, groups=2),
            [(1, 8, 16, 16)],
            "group_conv2d:N=1,C=8,H=16,W=16,K=16,R=3,S=3,groups=2,epilogue=bias",
        ),
        (
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1, groups=8, bias=False),
            [(1, 32, 15, 15)],
            "group_conv2d:N=1,C=32,H=15,W=15,K=64,R=3,S=3,stride=2,pad=1,groups=8",
        ),
        (
            torch.nn.Conv1d(4, 8, 3),
            [(1, 4, 20)],
            "conv2d:N=1,C=4,H=1,W=20,K=8,R=1,S=3,epilogue=bias",
        ),
        (
            torch.nn.Conv1d(12, 6, 5, stride=2, padding=2, dilation=2, groups=3, bias=False),
            [(2, 12, 33)],
            "group_conv2d:N=2,C=12,H=1,W=33,K=6,R=1,S=5,stride=1x2,pad=0x2x0x2,dilation=1x2,"
            "groups=3",
        ),
        # Gemm with C, and MatMul + Add: the bias is fused either way
        (torch.nn.Linear(32, 10), [(4, 32)], "dense:M=4,N=10,K=32,epilogue=bias"),
        (torch.nn.Linear(32, 10), [(2, 5, 32)], "dense:M=10,N=10,K=32,epilogue=bias"),
        (_BatchedMatmul(), [(12, 8, 16), (12, 16, 5)], "batch_matmul:B=12,M=8,N=5,K=16"),
        (_BatchedMatmul(), [(3, 4, 8, 16), (3, 4, 16, 5)], "batch_matmul:B=12,M=8,N=5,K=16"),
    ],
)
def test_exported_module(module: Any, shapes: list[tuple[int, ...]], expected: str) -> None:
    args = [torch.randn(*shape) for shape in shapes]
    result = extract_tasks(_export(module, *args))
    assert result.unsupported == []
    assert _summary(result) == [(expected, 1)]


@pytest.mark.parametrize(
    ("module", "shape", "op", "reason"),
    [
        (torch.nn.Conv3d(4, 8, 3), (1, 4, 6, 6, 6), "Conv", "3-D convolution"),
        (torch.nn.ConvTranspose2d(4, 8, 3), (1, 4, 10, 10), "ConvTranspose", "transposed"),
    ],
)
def test_exported_module_without_template(
    module: Any, shape: tuple[int, ...], op: str, reason: str
) -> None:
    result = extract_tasks(_export(module, torch.randn(*shape)))
    assert result.tasks == []
    assert [u.op for u in result.unsupported] == [op]
    assert reason in result.unsupported[0].reason


def test_dynamic_batch_is_reported() -> None:
    data = _export(
        torch.nn.Linear(32, 10),
        torch.randn(4, 32),
        input_names=["x"],
        dynamic_axes={"x": {0: "batch"}},
    )
    result = extract_tasks(data)
    assert result.tasks == []
    assert "dynamic dimension 'batch'" in result.unsupported[0].reason


def test_small_cnn_merges_repeated_layers() -> None:
    layers = [torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU()]
    layers += [torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)]
    result = extract_tasks(_export(torch.nn.Sequential(*layers), torch.randn(1, 3, 8, 8)))
    assert _summary(result) == [
        ("conv2d:N=1,C=3,H=8,W=8,K=8,R=3,S=3,pad=1,epilogue=bias+relu", 1),
        ("conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,pad=1,epilogue=bias+relu", 3),
        ("dense:M=1,N=10,K=512,epilogue=bias", 1),
    ]
