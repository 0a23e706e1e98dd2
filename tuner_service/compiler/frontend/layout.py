"""Layout planning: blocked activations (NCHW[b]c) between conv-family layers.

A pass over the layer plan (``fusion.plan_layers``) and the generated plan
(``generated.plan_generated``), run the same way at build and at load time:

- every ``conv2d`` layer and every ``depthwise_conv2d`` layer of multiplier 1 becomes its
  blocked operator (``conv2d_nchwc``, ``depthwise_conv2d_nchwc``; its epilogue stays fused, the
  per-channel scale and bias padded to whole blocks, the residual read blocked);
- a generated elementwise chain over a 4-D activation that already exists blocked runs blocked
  too (its other full-size inputs are read blocked, per-channel constants are re-laid out at
  plan time), so a region grows from conv-family layers through the cheap ops between them;
- a transform is inserted only where a producer and a consumer disagree: ``to_nchwc`` where a
  blocked layer reads a plain tensor (a model input, a numpy step's output), ``from_nchwc``
  where a plain reader (a Flatten, a pooling, a graph output) reads a blocked one.

A blocked tensor is named ``NAME@nchw{b}c`` beside the plain ``NAME``, so everything that reads
``NAME`` (numpy steps, graph outputs) keeps its meaning. The padded lanes of a blocked tensor are
finite (an epilogue of zero), never NaN: chains that could turn them into NaN or infinity
(division, log, sqrt, pow, reciprocal) stay plain, so a zero weight times a padded lane is zero.

Transforms run right after the tensor's producer: ``last_index`` is the producing node's
index, -1 for a model input (the runner places those first).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx

from schedule_templates.ops.base import GeneratedOp
from schedule_templates.ops.elementwise import Elementwise
from schedule_templates.ops.layout import FromBlocked, ToBlocked
from schedule_templates.workloads import Workload, parse_workload
from schedule_templates.workloads.conv_nchwc import channel_blocks, to_blocked
from tuner_service.compiler.frontend.folding import ConstantValues
from tuner_service.compiler.frontend.fusion import Layer, default_opset, node_name
from tuner_service.compiler.frontend.generated_context import GeneratedLayer
from tuner_service.compiler.frontend.graph import index_graph

#: layouts a build may ask for; ``auto`` is resolved at build time (``deploy.layout_choice``)
LAYOUTS = ("nchw", "nchwc", "auto")
#: elementwise instructions that may turn a finite padded lane into NaN or infinity
_UNSAFE = frozenset({"div", "log", "sqrt", "pow", "reciprocal"})
#: kernel inputs of a blocked conv that are activations in the blocked layout
_BLOCKED_INPUTS = ("data", "residual")


def blocked_name(tensor: str, block: int) -> str:
    return f"{tensor}@nchw{block}c"


@dataclasses.dataclass(frozen=True)
class LayoutPlan:
    """The plan after the pass: layers and generated layers (transforms included)."""

    layers: list[Layer]
    generated: list[GeneratedLayer]
    block: int
    blocked: tuple[str, ...]  # plain names of the tensors that exist blocked
    transforms: int


def plan_layout(proto: onnx.ModelProto, layers: Sequence[Layer],
                generated: Sequence[GeneratedLayer], block: int) -> LayoutPlan:
    """Blocked layers where they fit, transforms where producers and readers disagree."""
    return _Planner(proto, block).run(layers, generated)


class _Planner:
    def __init__(self, proto: onnx.ModelProto, block: int) -> None:
        self.graph = proto.graph
        self.block = block
        self.values = ConstantValues(proto.graph, default_opset(proto))
        self.index = index_graph(proto.graph)
        self.producer = {out: i for i, node in enumerate(proto.graph.node) for out in node.output}
        self.blocked: dict[str, str] = {}  # plain tensor -> its blocked name
        self.transforms: list[GeneratedLayer] = []
        self.blocked_nodes: set[str] = set()
        self.shapes: dict[str, tuple[int, ...]] = {}  # plain NCHW shapes of the tensors seen

    def run(self, layers: Sequence[Layer], generated: Sequence[GeneratedLayer]) -> LayoutPlan:
        order = sorted([(layer.last_index, 0, n, layer) for n, layer in enumerate(layers)]
                       + [(g.last_index, 1, n, g) for n, g in enumerate(generated)],
                       key=lambda item: item[:3])
        new_layers: list[Layer] = list(layers)
        new_generated: list[GeneratedLayer] = list(generated)
        produced: list[tuple[str, int]] = []  # blocked outputs and where they are produced
        for _, kind, position, planned in order:
            if kind == 0:
                converted = self._conv_layer(planned)  # type: ignore[arg-type]
                if converted is not None:
                    new_layers[position] = converted
                    produced.append((planned.output, planned.last_index))
            else:
                blocked = self._elementwise(planned)  # type: ignore[arg-type]
                if blocked is not None:
                    new_generated[position] = blocked
                    produced.append((planned.output, planned.last_index))
        for tensor, index in produced:
            if self._needs_plain(tensor):
                self._add_transform(FromBlocked(self._shape(tensor), self.block),
                                    self.blocked[tensor], tensor, index)
        ordered = sorted([(g.last_index, 0, n, g) for n, g in enumerate(new_generated)]
                         + [(t.last_index, 1, n, t) for n, t in enumerate(self.transforms)],
                         key=lambda item: item[:3])
        return LayoutPlan(new_layers, [item[3] for item in ordered], self.block,
                          tuple(sorted(self.blocked)), len(self.transforms))

    # -- conv-family layers ----------------------------------------------------------------

    def _conv_layer(self, layer: Layer) -> Layer | None:
        workload = _blocked_workload(layer.workload, self.block)
        if workload is None or layer.inputs.get("data") is None:
            return None
        inputs = dict(layer.inputs)
        constants = dict(layer.constants)
        plain = workload.plain()  # type: ignore[attr-defined]
        padded = channel_blocks(plain.output_shape()[1], self.block) * self.block
        self.shapes[inputs["data"]] = plain.input_shapes()["data"]
        if "residual" in inputs:
            self.shapes[inputs["residual"]] = plain.output_shape()
        self.shapes[layer.output] = plain.output_shape()
        for name in ("scale", "bias"):
            value = self._constant(layer, name)
            if value is not None:
                constants[name] = _pad(value.reshape(-1), padded)
                inputs.pop(name, None)
        for name in _BLOCKED_INPUTS:
            if name in inputs:
                inputs[name] = self._blocked_input(inputs[name])
        self.blocked[layer.output] = blocked_name(layer.output, self.block)
        self.blocked_nodes.update(layer.nodes)
        return dataclasses.replace(layer, workload=workload, inputs=inputs, constants=constants,
                                   output=self.blocked[layer.output])

    def _constant(self, layer: Layer, name: str) -> np.ndarray | None:
        if name in layer.constants:
            return np.asarray(layer.constants[name], np.float32)
        tensor = layer.inputs.get(name)
        if tensor is None:
            return None
        return np.asarray(self.values.get(tensor), np.float32)

    # -- elementwise chains ----------------------------------------------------------------

    def _elementwise(self, layer: GeneratedLayer) -> GeneratedLayer | None:
        op = layer.op
        if not isinstance(op, Elementwise) or len(op.shape) != 4:
            return None
        if any(str(ins[0]) in _UNSAFE for ins in op.program):
            return None
        names = list(op.input_shapes())
        full = [n for n, s in zip(names, op.inputs, strict=True) if tuple(s) == op.shape]
        if not any(layer.inputs.get(n) in self.blocked for n in full):
            return None  # a region starts at a conv-family layer, never here
        relaid = [self._relaid_input(layer, n, tuple(s), op.shape)
                  for n, s in zip(names, op.inputs, strict=True)]
        if any(r is None for r in relaid):
            return None
        shapes, inputs, constants = [], dict(layer.inputs), dict(layer.constants)
        for name, (shape, constant) in zip(names, relaid, strict=True):  # type: ignore[misc]
            shapes.append(shape)
            if constant is not None:
                constants[name] = constant
                inputs.pop(name, None)
            elif name in inputs and len(shape) == 5 and math.prod(shape) > 1:
                if name in full:
                    self.shapes[inputs[name]] = op.shape
                inputs[name] = self._blocked_input(inputs[name])
        self.shapes[layer.output] = op.shape
        blocked_op = Elementwise(_blocked_shape(op.shape, self.block), tuple(shapes), op.program)
        self.blocked[layer.output] = blocked_name(layer.output, self.block)
        self.blocked_nodes.update(layer.nodes)
        return dataclasses.replace(layer, op=blocked_op, inputs=inputs, constants=constants,
                                   output=self.blocked[layer.output])

    def _relaid_input(self, layer: GeneratedLayer, name: str, shape: tuple[int, ...],
                      out: tuple[int, ...]
                      ) -> tuple[tuple[int, ...], np.ndarray | None] | None:
        """(blocked input shape, constant re-laid out or None); None when it cannot be.
        Full inputs are read blocked; per-channel ones (``(N|1, C, 1, 1)``) are a constant
        re-laid out here or an activation read through a (small) transform; scalars stay."""
        if shape == out:
            return _blocked_shape(out, self.block), None
        padded = (1,) * (4 - len(shape)) + shape
        tensor = layer.inputs.get(name)
        constant = name in layer.constants or (tensor is not None
                                                and self.index.is_constant(tensor))
        if math.prod(padded) == 1:
            return (*padded, 1), None
        if padded[2:] != (1, 1) or padded[1] != out[1] or padded[0] not in (1, out[0]):
            return None
        if not constant:
            if tensor is None:
                return None
            self.shapes[tensor] = padded  # read through a transform (see _elementwise)
            return _blocked_shape(padded, self.block), None
        value = layer.constants[name] if name in layer.constants else self.values.get(
            str(tensor))
        relaid = to_blocked(np.asarray(value, np.float32).reshape(padded), self.block)
        return relaid.shape, relaid

    # -- transforms --------------------------------------------------------------------------

    def _blocked_input(self, tensor: str) -> str:
        if tensor not in self.blocked:
            index = self.producer.get(tensor, -1)
            self.blocked[tensor] = blocked_name(tensor, self.block)
            self._add_transform(ToBlocked(self._shape(tensor), self.block), tensor,
                                self.blocked[tensor], index)
        return self.blocked[tensor]

    def _add_transform(self, op: GeneratedOp, source: str, target: str, index: int) -> None:
        self.transforms.append(GeneratedLayer(op, (f"{op.kind}:{source}",), {"x": source}, {},
                                              target, index))

    def _needs_plain(self, tensor: str) -> bool:
        if tensor in {o.name for o in self.graph.output}:
            return True
        return any(tensor in node.input and node_name(node, i) not in self.blocked_nodes
                   for i, node in enumerate(self.graph.node))

    def _shape(self, tensor: str) -> tuple[int, ...]:
        """The plain NCHW shape of a tensor a converted layer reads or writes (from its
        workload or operator, so dynamic ONNX shapes do not matter)."""
        return self.shapes[tensor]


def _blocked_workload(workload: Workload, block: int) -> Workload | None:
    if workload.op == "conv2d" or (workload.op == "depthwise_conv2d"
                                   and getattr(workload, "multiplier", 1) == 1):
        _, _, body = workload.key.partition(":")
        return parse_workload(f"{workload.op}_nchwc:{body},block={block}")
    return None


def _blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    n, c, *spatial = shape
    return (n, channel_blocks(c, block), *spatial, block)


def _pad(values: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros(length, np.float32)
    out[:values.size] = values
    return out
