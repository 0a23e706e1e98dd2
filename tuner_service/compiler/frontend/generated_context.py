"""What the generated-operator planner knows about a graph, and the layer it produces.

A generated layer is one kernel of ``schedule_templates.ops`` standing for ONNX nodes that no
template tunes (elementwise chains, pooling, softmax, layer norm, data movement). The planner
decides from static shapes, element types and constant-ness only: uploads are untrusted, so a
constant's *value* is read only when it is tiny (a clip bound, slice starts, split sizes), the
way ``fusion`` reads clip bounds. Anything it is unsure of raises ``Refused`` and the node stays
a numpy step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper

from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, op_from_json
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.folding import SMALL_ELEMENTS, ConstantValues
from tuner_service.compiler.frontend.fusion import node_name, subgraph_reads
from tuner_service.compiler.frontend.graph import GraphIndex

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class GeneratedLayer:
    """One generated kernel call standing for ``nodes``.

    ``inputs`` maps a kernel input name (``op.input_shapes()``) to the ONNX tensor that feeds
    it with the same element count and order (activations, or graph constants the runner has
    folded); ``constants`` holds inputs the planner computed (a batch norm's per-channel scale
    and shift), float32 in the kernel input's shape. The output, reshaped, is ``output``.
    """

    op: GeneratedOp
    nodes: tuple[str, ...]
    inputs: dict[str, str]
    constants: dict[str, np.ndarray]
    output: str
    #: index in ``graph.node`` of the last node (where a runner computes the layer)
    last_index: int


class Refused(Exception):
    """The planner leaves a node to numpy; the message says why (logged at debug level)."""


def make_op(kind: str, **fields: Any) -> GeneratedOp:
    """The registered operator of ``kind``; Refused when it does not exist (yet) or rejects
    the fields, so a missing operator class only keeps its nodes in numpy."""
    try:
        return op_from_json({"kind": kind, **fields})
    except GeneratedOpError as e:
        raise Refused(str(e)) from e


def layer_for(op: GeneratedOp, nodes: Sequence[int], tensors: Sequence[str], output: str,
              context: PlanContext, constants: dict[str, np.ndarray] | None = None
              ) -> GeneratedLayer:
    """A layer whose kernel inputs (in ``input_shapes()`` order) are fed by ``tensors``; a
    name in ``constants`` is fed by the planner instead (give "" for its tensor)."""
    names = list(op.input_shapes())
    if len(names) != len(tensors):
        raise Refused(f"{op.kind} takes {len(names)} inputs, the plan has {len(tensors)}")
    constants = constants or {}
    inputs = {n: t for n, t in zip(names, tensors, strict=True) if n not in constants}
    for name, tensor in inputs.items():
        want = math.prod(op.input_shapes()[name])
        shape = context.shape(tensor)
        if math.prod(shape) != want:
            raise Refused(f"{tensor} has shape {shape}, {op.kind} input {name} wants {want} "
                          "elements")
    names_of = tuple(context.name(i) for i in sorted(nodes))
    if math.prod(context.shape(output)) != math.prod(op.output_shape()):
        raise Refused(f"{op.kind} output {op.output_shape()} does not fit {output}")
    return GeneratedLayer(op, names_of, inputs, constants, output, max(nodes))


class PlanContext:
    """The graph, its static types, its readers and its tiny constants."""

    def __init__(self, proto: onnx.ModelProto, info: GraphIndex, values: ConstantValues,
                 opset: int) -> None:
        self.graph = proto.graph
        self.info = info
        self.values = values
        self.opset = opset
        self.outputs = {v.name for v in proto.graph.output}
        self.readers: dict[str, int] = {}
        #: constants given as data (initializers, Constant nodes): the only values read, so a
        #: planning decision never evaluates a computation from an upload
        self.given = {t.name for t in proto.graph.initializer} | {
            out for node in proto.graph.node if node.op_type == "Constant"
            and node.domain in ("", "ai.onnx") for out in node.output}
        for node in proto.graph.node:
            for name in [*node.input, *subgraph_reads(node)]:
                if name:
                    self.readers[name] = self.readers.get(name, 0) + 1

    def name(self, index: int) -> str:
        return node_name(self.graph.node[index], index)

    def single_reader(self, tensor: str) -> bool:
        """Only one node reads ``tensor`` and it is not a graph output."""
        return self.readers.get(tensor) == 1 and tensor not in self.outputs

    def is_constant(self, tensor: str) -> bool:
        return self.info.is_constant(tensor)

    def shape(self, tensor: str) -> Shape:
        """The static shape of a float32 tensor, else Refused."""
        found = self.info.tensors.get(tensor)
        if found is None or found.dims is None:
            raise Refused(f"the shape of {tensor!r} is unknown")
        if found.elem_type != onnx.TensorProto.FLOAT:
            raise Refused(f"{tensor!r} is not float32")
        if not all(isinstance(d, int) and d >= 1 for d in found.dims):
            raise Refused(f"{tensor!r} has shape {found.dims}, not static and non-empty")
        return tuple(int(d) for d in found.dims if isinstance(d, int))

    def small(self, tensor: str) -> np.ndarray:
        """The value of a tiny given constant (an initializer or a Constant node of at most
        ``SMALL_ELEMENTS`` elements; load-time folding turned small computations on constants
        into such nodes), else Refused."""
        found = self.info.tensors.get(tensor)
        if tensor not in self.given or found is None or found.dims is None:
            raise Refused(f"{tensor!r} is not a given constant of known shape")
        if not all(isinstance(d, int) for d in found.dims) or math.prod(
                int(d) for d in found.dims if isinstance(d, int)) > SMALL_ELEMENTS:
            raise Refused(f"{tensor!r} is not a tiny constant")
        try:
            return np.asarray(self.values.get(tensor))
        except ModelError as e:
            raise Refused(str(e)) from e

    def scalar(self, tensor: str) -> float | None:
        """A one-element numeric constant's value, else None."""
        if not self.is_constant(tensor):
            return None
        try:
            value = self.small(tensor)
        except Refused:
            return None
        if value.size != 1 or value.dtype.kind not in "fiu":
            return None
        return float(value.reshape(()))

    def ints(self, node: onnx.NodeProto, position: int, attribute: str
             ) -> list[int] | None:
        """Integers given by a constant input (newer opsets) or an attribute (older ones);
        None when neither is present."""
        if len(node.input) > position and node.input[position]:
            value = self.small(node.input[position])
            if value.dtype.kind not in "iu":
                raise Refused(f"{node.input[position]!r} is not an integer tensor")
            return [int(v) for v in value.reshape(-1)]
        found = attr(node, attribute)
        return None if found is None else [int(v) for v in found]


def attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def axis_of(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise Refused(f"axis {axis} is out of range for rank {rank}")
    return axis % rank
