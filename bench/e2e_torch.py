"""The sample models in PyTorch eager mode, for the end-to-end benchmark's PyTorch column.

The samples are built as ONNX graphs in code (no torch definitions exist), so this builds the
equivalent eager program from the same graph and weights: one ``torch.nn.functional`` call per
ONNX node (conv2d, batch_norm in inference mode, linear, layer_norm, softmax, ...), exactly the
calls the modules' ``forward`` would make. No tracing, compilation or fusion is applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

Tensor = Any
OpFn = Callable[[list[Tensor], dict[str, Any]], Tensor]


def _ops() -> dict[str, OpFn]:
    import torch
    import torch.nn.functional as F

    def conv(x: list[Tensor], a: dict[str, Any]) -> Tensor:
        pads = a.get("pads", [0, 0, 0, 0])
        if pads[:2] != pads[2:]:
            raise ValueError("asymmetric Conv padding is not in the sample models")
        return F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, a.get("strides", 1),
                        pads[:2], a.get("dilations", 1), a.get("group", 1))

    def max_pool(x: list[Tensor], a: dict[str, Any]) -> Tensor:
        return F.max_pool2d(x[0], a["kernel_shape"], a.get("strides"), a.get("pads")[:2])

    def gemm(x: list[Tensor], a: dict[str, Any]) -> Tensor:
        weight = x[1] if a.get("transB", 0) else x[1].T
        return F.linear(x[0], weight, x[2] if len(x) > 2 else None)

    def layer_norm(x: list[Tensor], a: dict[str, Any]) -> Tensor:
        return F.layer_norm(x[0], x[1].shape, x[1], x[2], a.get("epsilon", 1e-5))

    return {
        "Conv": conv, "MaxPool": max_pool, "Gemm": gemm, "LayerNormalization": layer_norm,
        "BatchNormalization": lambda x, a: F.batch_norm(
            x[0], x[3], x[4], x[1], x[2], False, 0.0, a.get("epsilon", 1e-5)),
        "Relu": lambda x, a: F.relu(x[0]),
        "Clip": lambda x, a: torch.clamp(x[0], float(x[1]), float(x[2])),
        "Add": lambda x, a: x[0] + x[1], "Mul": lambda x, a: x[0] * x[1],
        "Div": lambda x, a: x[0] / x[1], "Erf": lambda x, a: torch.erf(x[0]),
        "GlobalAveragePool": lambda x, a: F.adaptive_avg_pool2d(x[0], 1),
        "Flatten": lambda x, a: torch.flatten(x[0], a.get("axis", 1)),
        "MatMul": lambda x, a: torch.matmul(x[0], x[1]),
        "Reshape": lambda x, a: torch.reshape(x[0], [int(v) for v in x[1]]),
        "Transpose": lambda x, a: x[0].permute(*a["perm"]),
        "Softmax": lambda x, a: torch.softmax(x[0], a.get("axis", -1)),
    }


def torch_program(model: onnx.ModelProto) -> Callable[[Any], Any]:
    """A function running ``model`` eagerly on a torch tensor input; weights stay torch
    tensors bound once (as module parameters would be)."""
    import torch

    ops = _ops()
    weights = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
               for t in model.graph.initializer}
    steps = []
    for node in model.graph.node:
        if node.op_type not in ops:
            raise ValueError(f"no PyTorch equivalent written for {node.op_type}")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        steps.append((ops[node.op_type], list(node.input), node.output[0], attrs))
    input_name, output_name = model.graph.input[0].name, model.graph.output[0].name

    def run(x: Any) -> Any:
        env = dict(weights)
        env[input_name] = x
        for fn, inputs, output, attrs in steps:
            env[output] = fn([env[name] for name in inputs], attrs)
        return env[output_name]

    return run


def check_against(model: onnx.ModelProto, feed: np.ndarray, expected: np.ndarray) -> float:
    """Max abs difference of the eager program from a reference output (sanity check)."""
    import torch

    with torch.inference_mode():
        got = torch_program(model)(torch.from_numpy(feed)).numpy()
    return float(np.max(np.abs(got - expected)))
