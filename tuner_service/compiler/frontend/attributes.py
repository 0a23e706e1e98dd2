"""Typed reads of node attributes: a wrong attribute type is the model's fault, not a crash."""

from __future__ import annotations

import onnx

from tuner_service.compiler.frontend.errors import UnmappableNode


def _find(node: onnx.NodeProto, name: str) -> onnx.AttributeProto | None:
    for attr in node.attribute:
        if attr.name == name:
            return attr
    return None


def attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    attr = _find(node, name)
    if attr is None:
        return default
    if attr.type != onnx.AttributeProto.INT:
        raise UnmappableNode(f"attribute {name} must be an integer")
    return int(attr.i)


def attr_float(node: onnx.NodeProto, name: str, default: float) -> float:
    attr = _find(node, name)
    if attr is None:
        return default
    if attr.type != onnx.AttributeProto.FLOAT:
        raise UnmappableNode(f"attribute {name} must be a float")
    return float(attr.f)


def attr_ints(node: onnx.NodeProto, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    attr = _find(node, name)
    if attr is None:
        return default
    if attr.type != onnx.AttributeProto.INTS:
        raise UnmappableNode(f"attribute {name} must be a list of integers")
    return tuple(int(v) for v in attr.ints)


def attr_str(node: onnx.NodeProto, name: str, default: str) -> str:
    attr = _find(node, name)
    if attr is None:
        return default
    if attr.type != onnx.AttributeProto.STRING:
        raise UnmappableNode(f"attribute {name} must be a string")
    return attr.s.decode("utf-8", errors="replace")
