"""Sample models built in code (no downloads): ResNet-18, MobileNet-v2 and one BERT-base layer.

They have the real architectures' shapes with random weights (fixed seeds), which is all a
tuner needs: tasks depend on shapes only. onnx is imported when a model is built, not when this
module is imported, so the CLI can list the names on an install without onnx.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

    from tuner_service.compiler.frontend.graph_builder import GraphBuilder

logger = logging.getLogger(__name__)

SAMPLE_MODELS: tuple[str, ...] = ("resnet18", "mobilenet_v2", "bert_block")

# MobileNet-v2 1.0 stages: expansion t, output channels c, repeats n, first stride s.
_MOBILENET_V2_STAGES = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def build_sample_model(name: str) -> onnx.ModelProto:
    """Build the sample model called ``name`` (one of ``SAMPLE_MODELS``)."""
    builders: dict[str, Callable[[], onnx.ModelProto]] = {
        "resnet18": resnet18,
        "mobilenet_v2": mobilenet_v2,
        "bert_block": bert_block,
    }
    if name not in builders:
        raise ValueError(f"unknown sample model {name!r}; choose one of {', '.join(SAMPLE_MODELS)}")
    return builders[name]()


def sample_model_bytes(name: str) -> bytes:
    """The serialized sample model, as an upload would carry it."""
    return build_sample_model(name).SerializeToString()


def _builder(name: str, seed: int) -> GraphBuilder:
    from tuner_service.compiler.frontend.graph_builder import GraphBuilder

    return GraphBuilder(name, seed)


# --- shared layers -------------------------------------------------------------------------


def _conv_bn(
    b: GraphBuilder,
    x: str,
    cin: int,
    cout: int,
    kernel: int,
    stride: int,
    name: str,
    group: int = 1,
) -> str:
    """Conv without bias followed by inference-mode BatchNormalization, as exporters emit."""
    fan_in = cin // group * kernel * kernel
    weight = b.random(f"{name}.weight", (cout, cin // group, kernel, kernel), math.sqrt(2 / fan_in))
    pad = kernel // 2
    y = b.op(
        "Conv",
        [x, weight],
        name,
        kernel_shape=[kernel, kernel],
        strides=[stride, stride],
        pads=[pad, pad, pad, pad],
        group=group,
    )
    scale = b.uniform(f"{name}.bn.scale", (cout,), 0.5, 1.0)
    bias = b.uniform(f"{name}.bn.bias", (cout,), -0.1, 0.1)
    mean = b.uniform(f"{name}.bn.mean", (cout,), -0.1, 0.1)
    var = b.uniform(f"{name}.bn.var", (cout,), 0.9, 1.1)
    return b.op("BatchNormalization", [y, scale, bias, mean, var], f"{name}.bn", epsilon=1e-5)


def _relu6(b: GraphBuilder, x: str) -> str:
    """ReLU6 the way exporters write it at opset >= 11: Clip with constant bounds."""
    low, high = b.constant("relu6.min", 0.0), b.constant("relu6.max", 6.0)
    return b.op("Clip", [x, low, high], "relu6")


def _classifier(b: GraphBuilder, x: str, features: int, classes: int) -> str:
    """Global average pool, flatten and a Gemm with the weight stored (classes, features)."""
    y = b.op("GlobalAveragePool", [x], "avgpool")
    y = b.op("Flatten", [y], "flatten", axis=1)
    weight = b.random("fc.weight", (classes, features), 1 / math.sqrt(features))
    bias = b.constant("fc.bias", _zeros(classes))
    return b.op("Gemm", [y, weight, bias], "fc", transB=1)


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.float32)


# --- ResNet-18 -------------------------------------------------------------------------------


def resnet18() -> onnx.ModelProto:
    """ImageNet ResNet-18, batch 1, 3x224x224 input, 1000 classes."""
    b = _builder("resnet18", seed=18)
    y = _conv_bn(b, "input", 3, 64, 7, 2, "conv1")
    y = b.op("Relu", [y], "relu")
    y = b.op("MaxPool", [y], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            y = _basic_block(b, y, cin, cout, stride, f"layer{stage}.{block}")
            cin = cout
    y = _classifier(b, y, 512, 1000)
    return b.build("input", (1, 3, 224, 224), y, (1, 1000))


def _basic_block(b: GraphBuilder, x: str, cin: int, cout: int, stride: int, name: str) -> str:
    y = _conv_bn(b, x, cin, cout, 3, stride, f"{name}.conv1")
    y = b.op("Relu", [y], f"{name}.relu1")
    y = _conv_bn(b, y, cout, cout, 3, 1, f"{name}.conv2")
    shortcut = x
    if stride != 1 or cin != cout:
        shortcut = _conv_bn(b, x, cin, cout, 1, stride, f"{name}.downsample")
    y = b.op("Add", [y, shortcut], f"{name}.add")
    return b.op("Relu", [y], f"{name}.relu2")


# --- MobileNet-v2 ----------------------------------------------------------------------------


def mobilenet_v2() -> onnx.ModelProto:
    """MobileNet-v2 1.0, batch 1, 3x224x224 input, 1000 classes (dropout omitted: inference)."""
    b = _builder("mobilenet_v2", seed=2)
    y = _relu6(b, _conv_bn(b, "input", 3, 32, 3, 2, "features.0"))
    cin, index = 32, 1
    for expand, cout, repeats, first_stride in _MOBILENET_V2_STAGES:
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            y = _inverted_residual(b, y, cin, cout, stride, expand, f"features.{index}")
            cin, index = cout, index + 1
    y = _relu6(b, _conv_bn(b, y, cin, 1280, 1, 1, f"features.{index}"))
    y = _classifier(b, y, 1280, 1000)
    return b.build("input", (1, 3, 224, 224), y, (1, 1000))


def _inverted_residual(
    b: GraphBuilder, x: str, cin: int, cout: int, stride: int, expand: int, name: str
) -> str:
    """1x1 expand (skipped when expand is 1), 3x3 depthwise, linear 1x1 project, residual."""
    hidden = cin * expand
    y = x
    if expand != 1:
        y = _relu6(b, _conv_bn(b, y, cin, hidden, 1, 1, f"{name}.expand"))
    y = _relu6(b, _conv_bn(b, y, hidden, hidden, 3, stride, f"{name}.depthwise", group=hidden))
    y = _conv_bn(b, y, hidden, cout, 1, 1, f"{name}.project")
    if stride == 1 and cin == cout:
        y = b.op("Add", [y, x], f"{name}.add")
    return y


# --- BERT-base encoder layer -----------------------------------------------------------------

_SEQ, _HIDDEN, _HEADS, _FFN = 128, 768, 12, 3072
_HEAD_DIM = _HIDDEN // _HEADS


def bert_block() -> onnx.ModelProto:
    """One BERT-base encoder layer (post-norm), batch 1, sequence 128, hidden 768, 12 heads."""
    b = _builder("bert_block", seed=768)
    x = "input"
    query = _heads(b, _linear(b, x, _HIDDEN, _HIDDEN, "query"), (0, 2, 1, 3))
    key_t = _heads(b, _linear(b, x, _HIDDEN, _HIDDEN, "key"), (0, 2, 3, 1))
    value = _heads(b, _linear(b, x, _HIDDEN, _HIDDEN, "value"), (0, 2, 1, 3))
    scores = b.op("MatMul", [query, key_t], "scores")  # 12 x (128x64 . 64x128)
    scale = b.constant("scale", 1 / math.sqrt(_HEAD_DIM))
    probs = b.op("Softmax", [b.op("Mul", [scores, scale], "scaled")], "probs", axis=-1)
    context = b.op("MatMul", [probs, value], "context")  # 12 x (128x128 . 128x64)
    context = b.op("Transpose", [context], "context.t", perm=[0, 2, 1, 3])
    shape = b.constant("hidden_shape", [1, _SEQ, _HIDDEN])
    context = b.op("Reshape", [context, shape], "context.merged")
    attention = _linear(b, context, _HIDDEN, _HIDDEN, "attention.output")
    y = _layer_norm(b, b.op("Add", [attention, x], "attention.residual"), "attention.norm")
    hidden = _gelu(b, _linear(b, y, _HIDDEN, _FFN, "intermediate"))
    out = _linear(b, hidden, _FFN, _HIDDEN, "output")
    out = _layer_norm(b, b.op("Add", [out, y], "output.residual"), "output.norm")
    return b.build("input", (1, _SEQ, _HIDDEN), out, (1, _SEQ, _HIDDEN))


def _linear(b: GraphBuilder, x: str, cin: int, cout: int, name: str) -> str:
    """A 3-D activation times a constant (cin, cout) matrix, plus bias: torch's Linear export."""
    weight = b.random(f"{name}.weight", (cin, cout), 0.02)
    bias = b.constant(f"{name}.bias", _zeros(cout))
    return b.op("Add", [b.op("MatMul", [x, weight], name), bias], f"{name}.bias_add")


def _heads(b: GraphBuilder, x: str, perm: tuple[int, ...]) -> str:
    """(1, seq, hidden) -> (1, seq, heads, head_dim) -> transposed by ``perm``."""
    shape = b.constant("heads_shape", [1, _SEQ, _HEADS, _HEAD_DIM])
    y = b.op("Reshape", [x, shape], f"{x}.split")
    return b.op("Transpose", [y], f"{x}.heads", perm=list(perm))


def _layer_norm(b: GraphBuilder, x: str, name: str) -> str:
    scale = b.uniform(f"{name}.weight", (_HIDDEN,), 0.9, 1.1)
    bias = b.constant(f"{name}.bias", _zeros(_HIDDEN))
    return b.op("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=1e-12)


def _gelu(b: GraphBuilder, x: str) -> str:
    """Exact GELU as BERT exports write it: 0.5 * x * (1 + erf(x / sqrt(2)))."""
    erf = b.op("Erf", [b.op("Div", [x, b.constant("sqrt2", math.sqrt(2.0))], "gelu.div")], "erf")
    one_plus = b.op("Add", [erf, b.constant("one", 1.0)], "gelu.add")
    return b.op("Mul", [b.op("Mul", [x, one_plus], "gelu.mul"), b.constant("half", 0.5)], "gelu")
