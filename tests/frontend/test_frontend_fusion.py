"""The layer plan reproduces onnxruntime: each layer, run with its workload's numpy reference
(and, for small exported modules, as a compiled fused kernel), gives the tensor onnxruntime
computes for the layer's last node."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from fusion_support import check_plan  # noqa: E402

from tuner_service.compiler.frontend.fusion import plan_layers  # noqa: E402
from tuner_service.compiler.frontend.graph import index_graph  # noqa: E402

# --- sample models ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_block"])
def test_sample_model_plan_matches_onnxruntime(name: str, sample_model: Any) -> None:
    model = sample_model(name)
    (graph_input,) = model.graph.input
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    feeds = {graph_input.name: np.random.default_rng(0).standard_normal(shape, np.float32)}
    layers = check_plan(model, feeds)
    fused = [layer for layer in layers if layer.workload.epilogue_spec]
    assert fused, "the sample's anchors absorb their batch norms, biases and activations"


def test_resnet_block_plan_shapes(sample_model: Any) -> None:
    """Without running anything: what a deploy runtime binds for one residual block."""
    layers = {layer.nodes[0]: layer for layer in plan_layers(sample_model("resnet18"))}
    conv2 = layers["layer1.0.conv2"]
    assert conv2.nodes == ("layer1.0.conv2", "layer1.0.conv2.bn", "layer1.0.add",
                           "layer1.0.relu2")
    assert conv2.inputs == {"data": "layer1.0.relu1", "weight": "layer1.0.conv2.weight",
                            "residual": "maxpool"}
    assert sorted(conv2.constants) == ["bias", "scale"]
    assert conv2.output == "layer1.0.relu2"
    # in a downsampling block the add joins the shortcut conv, which runs after conv2
    assert str(layers["layer2.0.conv2"].workload.epilogue_spec) == "scale+bias"
    shortcut = layers["layer2.0.downsample"]
    assert shortcut.inputs["residual"] == "layer2.0.conv2.bn"
    assert shortcut.anchor_index > layers["layer2.0.conv2"].last_index


# --- modules exported by torch ---------------------------------------------------------------

torch = pytest.importorskip("torch")


def _export(module: Any, *shapes: tuple[int, ...]) -> tuple[Any, dict[str, np.ndarray]]:
    args = tuple(torch.randn(*s) for s in shapes)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # without constant folding the exporter keeps BatchNormalization (folding merges it
        # into the Conv) and feeds its parameters through Identity nodes
        torch.onnx.export(module.eval(), args, buffer, dynamo=False, opset_version=17,
                          do_constant_folding=False)
    model = onnx.load_from_string(buffer.getvalue())
    names = [i.name for i in model.graph.input]
    return model, {n: a.numpy() for n, a in zip(names, args, strict=True)}


def _randomize_bn(module: Any) -> Any:
    """Non-trivial running statistics, so folding them is actually tested."""
    gen = torch.Generator().manual_seed(3)
    for m in module.modules():
        if isinstance(m, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.randn(m.num_features, generator=gen))
                m.bias.copy_(torch.randn(m.num_features, generator=gen))
    return module


class _Residual(torch.nn.Module):
    def __init__(self, channels: int, downsample: bool, groups: int = 1) -> None:
        super().__init__()
        stride = 2 if downsample else 1
        out = channels * 2 if downsample else channels
        self.conv1 = torch.nn.Conv2d(channels, out, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(out)
        self.conv2 = torch.nn.Conv2d(out, out, 3, 1, 1, groups=groups, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(out)
        self.shortcut = torch.nn.Sequential(
            torch.nn.Conv2d(channels, out, 1, stride, bias=False), torch.nn.BatchNorm2d(out)
        ) if downsample else torch.nn.Identity()

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class _LinearStack(torch.nn.Module):
    """Linear + ReLU on a 3-D input (MatMul + Add), then on 2-D (Gemm), then a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 32)

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.a(x))  # (2, 3, 32)
        y = y.reshape(6, 32)
        z = torch.relu(self.b(y))
        return torch.clamp(self.c(z) + y, -0.5, 0.75)


def _conv_bn_relu6(depthwise: bool) -> Any:
    groups = 8 if depthwise else 1
    return torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, 1, 1, groups=groups),
                               torch.nn.BatchNorm2d(16), torch.nn.ReLU6())


MODULES = {
    "conv_bn_relu": (lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU()), [(1, 3, 12, 12)], ["scale+bias+relu"]),
    "conv_bias_bn_relu6": (lambda: _conv_bn_relu6(False), [(1, 8, 10, 10)],
                           ["scale+bias+relu6"]),
    "depthwise_bn_relu6": (lambda: _conv_bn_relu6(True), [(1, 8, 10, 10)],
                           ["scale+bias+relu6"]),
    "residual_block": (lambda: _Residual(8, False), [(1, 8, 8, 8)],
                       ["scale+bias+relu", "scale+bias+residual+relu"]),
    "downsample_block": (lambda: _Residual(8, True), [(1, 8, 8, 8)],
                         ["scale+bias+relu", "scale+bias", "scale+bias+residual+relu"]),
    "grouped_bn_relu": (lambda: torch.nn.Sequential(
        torch.nn.Conv2d(16, 24, 3, 2, 1, groups=4, bias=False), torch.nn.BatchNorm2d(24),
        torch.nn.ReLU()), [(1, 16, 11, 9)], ["scale+bias+relu"]),
    "grouped_residual_block": (lambda: _Residual(16, False, groups=8), [(1, 16, 7, 9)],
                               ["scale+bias+relu", "scale+bias+residual+relu"]),
    "conv1d_grouped_bn_relu": (lambda: torch.nn.Sequential(
        torch.nn.Conv1d(6, 12, 5, padding=2, groups=3), torch.nn.BatchNorm1d(12),
        torch.nn.ReLU()), [(1, 6, 23)], ["scale+bias+relu"]),
    "linear_relu": (lambda: torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU()),
                    [(4, 24)], ["bias+relu"]),
    "linear_stack": (_LinearStack, [(2, 3, 16)],
                     ["bias+relu", "bias+relu", "bias+residual+clip(-0.5:0.75)"]),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_exported_module_plan_matches_onnxruntime(name: str) -> None:
    factory, shapes, epilogues = MODULES[name]
    torch.manual_seed(0)
    model, feeds = _export(_randomize_bn(factory()), *shapes)
    layers = check_plan(model, feeds, compile_kernels=True)
    assert [str(layer.workload.epilogue_spec) for layer in layers] == epilogues
    # every node but reshapes and those computing constants (weights, bounds) is in a layer
    covered = {n for layer in layers for n in layer.nodes}
    constants = index_graph(model.graph).constants
    left = [n.op_type for n in model.graph.node
            if n.name not in covered and not set(n.output) <= constants]
    assert set(left) <= {"Reshape"}, left
