"""The sample models are valid, run in onnxruntime, and extract to the expected tasks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from schedule_templates.workloads import parse_workload  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks  # noqa: E402
from tuner_service.compiler.frontend.fusion import plan_layers  # noqa: E402
from tuner_service.compiler.frontend.samples import (  # noqa: E402
    SAMPLE_MODELS,
    build_sample_model,
    sample_model_bytes,
)

SampleModel = Callable[[str], Any]

RESNET18_CONVS = {
    "conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3": 1,
    "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1": 4,
    "conv2d:N=1,C=64,H=56,W=56,K=128,R=3,S=3,stride=2,pad=1": 1,
    "conv2d:N=1,C=64,H=56,W=56,K=128,R=1,S=1,stride=2": 1,
    "conv2d:N=1,C=128,H=28,W=28,K=128,R=3,S=3,pad=1": 3,
    "conv2d:N=1,C=128,H=28,W=28,K=256,R=3,S=3,stride=2,pad=1": 1,
    "conv2d:N=1,C=128,H=28,W=28,K=256,R=1,S=1,stride=2": 1,
    "conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1": 3,
    "conv2d:N=1,C=256,H=14,W=14,K=512,R=3,S=3,stride=2,pad=1": 1,
    "conv2d:N=1,C=256,H=14,W=14,K=512,R=1,S=1,stride=2": 1,
    "conv2d:N=1,C=512,H=7,W=7,K=512,R=3,S=3,pad=1": 3,
}


def _weights(model: Any) -> dict[str, int]:
    result = extract_tasks(model)
    assert result.unsupported == []
    return {task.workload.key: task.weight for task in result.tasks}


def _base_weights(weights: dict[str, int]) -> dict[str, int]:
    """Weights per workload without its fused epilogue (the tuning-space identity)."""
    merged: Counter[str] = Counter()
    for key, weight in weights.items():
        merged[parse_workload(key).base_key] += weight
    return dict(merged)


def _layer_keys(model: Any) -> Counter[str]:
    """How many layers of the plan compute each fused workload."""
    return Counter(layer.workload.key for layer in plan_layers(model))


def _epilogues(weights: Counter[str], prefix: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for key, weight in weights.items():
        if key.startswith(prefix):
            found[str(parse_workload(key).epilogue_spec)] += weight
    return found


def test_resnet18_gives_eleven_convs_and_the_classifier(sample_model: SampleModel) -> None:
    model = sample_model("resnet18")
    weights = _weights(model)
    # one task per base workload: fused variants share a space, so they are tuned once
    assert _base_weights(weights) == {**RESNET18_CONVS, "dense:M=1,N=1000,K=512": 1}
    assert len(weights) == 12
    assert sum(weights.values()) == 21  # 20 convolutions (3 downsample) and the Gemm
    # the task measures the most frequent variant (the first seen on ties)
    assert "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,epilogue=scale+bias+relu" in weights
    layers = _layer_keys(model)
    # Conv + BN (+ Relu), the residual add joining whichever conv runs second
    assert _epilogues(layers, "conv2d:") == {
        "scale+bias+relu": 9,  # stem and the first conv of every block
        "scale+bias+residual+relu": 8,  # second conv (or the downsample) of every block
        "scale+bias": 3,  # second conv of a downsampling block: its add goes to the shortcut
    }
    assert layers["conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,epilogue=scale+bias+relu"] == 2
    assert layers["conv2d:N=1,C=64,H=56,W=56,K=128,R=1,S=1,stride=2,"
                  "epilogue=scale+bias+residual+relu"] == 1
    assert layers["dense:M=1,N=1000,K=512,epilogue=bias"] == 1
    assert len(layers) == 19


def test_mobilenet_v2_fuses_batch_norm_relu6_and_residuals(sample_model: SampleModel) -> None:
    weights = _layer_keys(sample_model("mobilenet_v2"))
    assert _epilogues(weights, "depthwise_conv2d:") == {"scale+bias+relu6": 17}
    assert _epilogues(weights, "conv2d:") == {
        "scale+bias+relu6": 1 + 16 + 1,  # stem, expand convs, last conv
        "scale+bias+residual": 10,  # projections of stride-1 blocks with equal channels
        "scale+bias": 7,  # the other projections
    }


def test_mobilenet_v2_depthwise_layers(sample_model: SampleModel) -> None:
    weights = _base_weights(_weights(sample_model("mobilenet_v2")))
    depthwise = {k: w for k, w in weights.items() if k.startswith("depthwise_conv2d:")}
    assert sum(depthwise.values()) == 17  # one per inverted residual block
    assert depthwise["depthwise_conv2d:N=1,C=32,H=112,W=112,R=3,S=3,pad=1"] == 1
    assert depthwise["depthwise_conv2d:N=1,C=384,H=14,W=14,R=3,S=3,pad=1"] == 4
    assert depthwise["depthwise_conv2d:N=1,C=960,H=7,W=7,R=3,S=3,pad=1"] == 3
    assert weights["conv2d:N=1,C=3,H=224,W=224,K=32,R=3,S=3,stride=2,pad=1"] == 1
    assert weights["conv2d:N=1,C=320,H=7,W=7,K=1280,R=1,S=1"] == 1
    assert weights["dense:M=1,N=1000,K=1280"] == 1
    # stem, 17 blocks of 3 convs less the missing expand of block 1, last conv, Gemm
    assert sum(weights.values()) == 1 + 17 * 3 - 1 + 1 + 1


def test_bert_block_dense_and_batch_matmul(sample_model: SampleModel) -> None:
    model = sample_model("bert_block")
    assert _layer_keys(model) == {
        "dense:M=128,N=768,K=768,epilogue=bias": 3,  # query, key, value
        "dense:M=128,N=768,K=768,epilogue=bias+residual": 1,  # attention output
        "dense:M=128,N=3072,K=768,epilogue=bias+gelu": 1,  # the exported erf-GELU pattern
        "dense:M=128,N=768,K=3072,epilogue=bias+residual": 1,
        "batch_matmul:B=12,M=128,N=128,K=64": 1,
        "batch_matmul:B=12,M=128,N=64,K=128": 1,
    }
    tasks = {t.workload.key: t for t in extract_tasks(model).tasks}
    assert {key: t.weight for key, t in tasks.items()} == {
        "dense:M=128,N=768,K=768,epilogue=bias": 4,  # the 3 projections and the output one
        "dense:M=128,N=3072,K=768,epilogue=bias+gelu": 1,
        "dense:M=128,N=768,K=3072,epilogue=bias+residual": 1,
        "batch_matmul:B=12,M=128,N=128,K=64": 1,
        "batch_matmul:B=12,M=128,N=64,K=128": 1,
    }
    assert tasks["dense:M=128,N=768,K=768,epilogue=bias"].variants == (
        "dense:M=128,N=768,K=768,epilogue=bias", "dense:M=128,N=768,K=768,epilogue=bias+residual")


@pytest.mark.parametrize("name", SAMPLE_MODELS)
def test_sample_passes_the_checker_and_runs(name: str, sample_model: SampleModel) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = sample_model(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 17
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    data = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32)
    (out,) = session.run(None, {inp.name: data})
    assert out.shape == tuple(
        model.graph.output[0].type.tensor_type.shape.dim[i].dim_value for i in range(out.ndim)
    )
    assert np.isfinite(out).all()


def test_samples_are_deterministic() -> None:
    assert sample_model_bytes("bert_block") == sample_model_bytes("bert_block")


def test_unknown_sample_name() -> None:
    with pytest.raises(ValueError, match="resnet18"):
        build_sample_model("vgg16")
