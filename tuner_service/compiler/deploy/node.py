"""An ONNX node as the numpy operators see it: decoded attributes, its name and the opset."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

from tuner_service.compiler.deploy.errors import UnsupportedOperatorError

Array = np.ndarray
#: a numpy implementation: input arrays (None for an omitted optional input) -> outputs
OpFn = Callable[[Sequence["Array | None"], "NodeInfo"], list[Array]]


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    op_type: str
    name: str
    attrs: dict[str, Any]
    opset: int
    outputs: int = 1

    @classmethod
    def from_proto(cls, node: onnx.NodeProto, name: str, opset: int) -> NodeInfo:
        attrs = {a.name: _attribute(a) for a in node.attribute}
        return cls(node.op_type, name, attrs, opset, len(node.output))

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def refuse(self, reason: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError(self.op_type, self.name, reason)


def _attribute(attr: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def required(inputs: Sequence[Array | None], index: int, node: NodeInfo) -> Array:
    value = inputs[index] if index < len(inputs) else None
    if value is None:
        raise node.refuse(f"input {index} is missing")
    return value


def optional(inputs: Sequence[Array | None], index: int) -> Array | None:
    return inputs[index] if index < len(inputs) else None


def ints(value: Array | None) -> list[int]:
    return [] if value is None else [int(v) for v in np.asarray(value).reshape(-1)]
