"""The graph view the quantized-model rewrites share (``quantized``, ``quantized_glue``): each
node's producer and readers, constant values, and the groups of nodes one ``tuner.int8`` node
replaces."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnx.numpy_helper

from tuner_service.compiler.frontend.errors import ModelError, UnmappableNode
from tuner_service.compiler.frontend.graph import GraphIndex, index_graph

_DEFAULT = ("", "ai.onnx")


@dataclasses.dataclass
class Group:
    """Nodes one ``tuner.int8`` node replaces; it takes the place of the last of them."""

    nodes: set[int]
    node: onnx.NodeProto
    initializers: list[onnx.TensorProto]

    @property
    def last(self) -> int:
        return max(self.nodes)


class QuantGraph:
    """Constants, producers and readers of a graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.info: GraphIndex = index_graph(graph)
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        self.outputs = {v.name for v in graph.output}
        for position, node in enumerate(graph.node):
            for name in node.output:
                self.producer[name] = position
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(position)
            for attr in node.attribute:  # subgraph reads pin a tensor: never absorb it
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    for inner in sub.node:
                        for name in inner.input:
                            self.readers.setdefault(name, []).extend([-1, -1])

    def constant(self, name: str) -> np.ndarray | None:
        """An initializer's value, or a ``Constant`` node's (``value`` attribute)."""
        tensor = self.initializers.get(name)
        if tensor is None:
            position = self.producer.get(name)
            node = self.graph.node[position] if position is not None else None
            if node is None or node.op_type != "Constant" or node.domain not in _DEFAULT:
                return None
            tensor = next((a.t for a in node.attribute if a.name == "value"
                           and a.HasField("t")), None)
        return None if tensor is None else onnx.numpy_helper.to_array(tensor)

    def only_reader(self, name: str) -> int | None:
        found = self.readers.get(name, [])
        return found[0] if len(found) == 1 and name not in self.outputs else None

    def made_by(self, name: str, op_type: str) -> onnx.NodeProto | None:
        position = self.producer.get(name)
        if position is None:
            return None
        node = self.graph.node[position]
        return node if node.op_type == op_type and node.domain in _DEFAULT else None


def scalar_constant(view: QuantGraph, name: str, role: str, node: str) -> np.ndarray:
    value = view.constant(name) if name else None
    if value is None:  # computed at run time: the node stays as it is (numpy runs it)
        raise UnmappableNode(f"the {role} {name!r} is not a constant")
    if value.size != 1:
        raise ModelError(f"quantized node {node!r}: the {role} {name!r} has {value.size} "
                         "values; activations are quantized per tensor (one value)")
    return value.reshape(1)
