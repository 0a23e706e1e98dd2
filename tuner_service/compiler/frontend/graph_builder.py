"""A small helper that builds single-output ONNX graphs with random weights.

Used by the sample models; it keeps their code at the level of layers (``conv``, ``linear``)
rather than protobuf plumbing. Names are readable (``layer1.0.conv1``) and unique.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

logger = logging.getLogger(__name__)

OPSET = 17  # the first opset with LayerNormalization
IR_VERSION = 8  # the IR version that goes with opset 17; older runtimes refuse newer ones


class GraphBuilder:
    """Accumulates nodes and initializers of one graph, then wraps them in a model."""

    def __init__(self, name: str, seed: int) -> None:
        self.name = name
        self._rng = np.random.default_rng(seed)
        self._nodes: list[onnx.NodeProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._used: dict[str, int] = {}

    def unique(self, hint: str) -> str:
        """``hint`` itself the first time, then ``hint_1``, ``hint_2``, ..."""
        count = self._used.get(hint, 0)
        self._used[hint] = count + 1
        return hint if count == 0 else f"{hint}_{count}"

    def constant(self, hint: str, value: np.ndarray | float | Sequence[int]) -> str:
        """An initializer holding ``value``: floats become fp32, integer lists int64."""
        if isinstance(value, float):
            array = np.asarray(value, dtype=np.float32)
        elif isinstance(value, np.ndarray):
            array = value
        else:
            array = np.asarray(value, dtype=np.int64)
        name = self.unique(hint)
        self._initializers.append(onnx.numpy_helper.from_array(array, name))
        return name

    def random(self, hint: str, shape: Sequence[int], std: float) -> str:
        """A normally distributed fp32 weight (std chosen by the caller to keep outputs finite)."""
        array = self._rng.normal(0.0, std, size=tuple(shape)).astype(np.float32)
        return self.constant(hint, array)

    def uniform(self, hint: str, shape: Sequence[int], low: float, high: float) -> str:
        array = self._rng.uniform(low, high, size=tuple(shape)).astype(np.float32)
        return self.constant(hint, array)

    def op(self, op_type: str, inputs: Sequence[str], hint: str = "", **attrs: Any) -> str:
        """Append one node with a single output named like the node; return that name."""
        name = self.unique(hint or op_type.lower())
        self._nodes.append(onnx.helper.make_node(op_type, list(inputs), [name], name, **attrs))
        return name

    def build(
        self,
        input_name: str,
        input_shape: Sequence[int],
        output_name: str,
        output_shape: Sequence[int],
    ) -> onnx.ModelProto:
        """The finished model: one fp32 input, one fp32 output, opset 17."""
        graph = onnx.helper.make_graph(
            self._nodes,
            self.name,
            [onnx.helper.make_tensor_value_info(input_name, onnx.TensorProto.FLOAT, input_shape)],
            [onnx.helper.make_tensor_value_info(output_name, onnx.TensorProto.FLOAT, output_shape)],
            initializer=self._initializers,
        )
        model = onnx.helper.make_model(
            graph,
            opset_imports=[onnx.helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name="tuner-samples",
        )
        model.doc_string = f"{self.name}: sample model with random weights, for tuning demos"
        return model
