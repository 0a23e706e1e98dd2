"""Layout planning: blocked activations (NCHW[b]c) between conv-family layers.

A pass over the layer plan (``fusion.plan_layers``) and the generated plan
(``generated.plan_generated``), run the same way at build and at load time:

- every ``conv2d`` layer, every ``depthwise_conv2d`` layer of multiplier 1 and every
  ``group_conv2d`` layer whose groups meet block boundaries (``group_window``) becomes its
  blocked operator (``conv2d_nchwc``, ``depthwise_conv2d_nchwc``, ``group_conv2d_nchwc``; its
  epilogue stays fused, the per-channel scale and bias padded to whole blocks, the residual
  read blocked);
- a generated elementwise chain over a 4-D activation that already exists blocked runs blocked
  too (its other full-size inputs are read blocked, per-channel constants are re-laid out at
  plan time), so a region grows from conv-family layers through the cheap ops between them;
- a transform is inserted only where a producer and a consumer disagree: ``to_nchwc`` where a
  blocked layer reads a plain tensor (a model input, a numpy step's output), ``from_nchwc``
  where a plain reader (a Flatten, a graph output) reads a blocked one; a conv with a sliver of
  a block of input channels on a large map (an RGB stem, ``reads_plain``) reads its input
  plain and writes blocked, so the model's image is never padded to a block;
- a max or average pool of a blocked tensor runs blocked (``BlockedPool2d``), as do global
  pools and channel concats of whole blocks.

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
from collections.abc import Collection, Sequence

import numpy as np
import onnx

from schedule_templates.ops.base import GeneratedOp
from schedule_templates.ops.elementwise import Elementwise
from schedule_templates.ops.layout import FromBlocked, ToBlocked
from schedule_templates.ops.movement import Concat
from schedule_templates.ops.pool import Pool2d
from schedule_templates.ops.pool_blocked import BlockedPool2d
from schedule_templates.ops.reduce import Reduce
from schedule_templates.workloads import GroupConv2d, Workload, parse_workload
from schedule_templates.workloads.conv_nchwc import channel_blocks, to_blocked
from schedule_templates.workloads.group_nchwc import group_window
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
                generated: Sequence[GeneratedLayer], block: int,
                plain: Collection[str] = ()) -> LayoutPlan:
    """Blocked layers where they fit, transforms where producers and readers disagree.
    ``plain`` names conv-family layers (by their output tensor) that stay in the plain layout
    (a per-layer choice, ``deploy.layout_mixed``)."""
    return _Planner(proto, block, frozenset(plain)).run(layers, generated)


class _Planner:
    def __init__(self, proto: onnx.ModelProto, block: int, plain: frozenset[str]) -> None:
        self.graph = proto.graph
        self.block = block
        self.plain = plain
        self.values = ConstantValues(proto.graph, default_opset(proto))
        self.index = index_graph(proto.graph)
        self.producer = {out: i for i, node in enumerate(proto.graph.node) for out in node.output}
        self.blocked: dict[str, str] = {}  # plain tensor -> its blocked name
        self.transforms: list[GeneratedLayer] = []
        self.blocked_nodes: set[str] = set()
        self.shapes: dict[str, tuple[int, ...]] = {}  # plain NCHW shapes of the tensors seen
        self.plain_reads: set[str] = set()  # tensors blocked layers read in the plain layout

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
                blocked = self._generated(planned)  # type: ignore[arg-type]
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
        workload = blocked_workload(layer.workload, self.block)
        if workload is None or layer.inputs.get("data") is None or layer.output in self.plain:
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
                if name == "data" and getattr(workload, "plain_in", False):
                    self.plain_reads.add(inputs[name])  # a blocked producer converts it back
                    continue
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

    # -- generated operators ---------------------------------------------------------------

    def _generated(self, layer: GeneratedLayer) -> GeneratedLayer | None:
        if isinstance(layer.op, Elementwise):
            return self._elementwise(layer)
        if isinstance(layer.op, Reduce):
            return self._global_pool(layer, layer.op)
        if isinstance(layer.op, Concat):
            return self._concat(layer, layer.op)
        if type(layer.op) is Pool2d:  # not BytePool2d: 8-bit tensors are never blocked
            return self._pool(layer, layer.op)
        return None

    def _pool(self, layer: GeneratedLayer, op: Pool2d) -> GeneratedLayer | None:
        """A max or average pool of a blocked tensor pools each pixel's channel block as one
        vector (``BlockedPool2d``): no transform to the plain layout and back around it."""
        tensor = layer.inputs.get("x", "")
        if tensor not in self.blocked or self.shapes.get(tensor) != op.shape:
            return None
        pooled = BlockedPool2d(op.shape, op.mode, op.kernel, op.stride, op.pads, op.dilation,
                               op.ceil_mode, op.count_include_pad, self.block)
        self.shapes[layer.output] = op.output_shape()
        return self._blocked_layer(layer, pooled, {"x": self.blocked[tensor]})

    def _global_pool(self, layer: GeneratedLayer, op: Reduce) -> GeneratedLayer | None:
        """A global pool (a reduce over every pixel of each channel) of a blocked tensor reduces
        the pixels of each channel block, ``b`` channels at a time."""
        tensor = layer.inputs.get("x", "")
        shape = self.shapes.get(tensor)
        if tensor not in self.blocked or shape is None or len(shape) != 4 or op.inner != 1 \
                or (shape[0] * shape[1], shape[2] * shape[3]) != (op.outer, op.reduced):
            return None
        blocks = channel_blocks(shape[1], self.block)
        pooled = Reduce(op.mode, shape[0] * blocks, op.reduced, self.block)
        self.shapes[layer.output] = (shape[0], shape[1], 1, 1)
        return self._blocked_layer(layer, pooled, {"x": self.blocked[tensor]})

    def _concat(self, layer: GeneratedLayer, op: Concat) -> GeneratedLayer | None:
        """A channel concat of whole blocks is the same copy on blocked buffers (each input's
        blocks land after the previous input's)."""
        tensors = [layer.inputs.get(f"x{k}", "") for k in range(len(op.widths))]
        shapes = [self.shapes.get(t) or self._graph_shape(t) for t in tensors]
        if not any(t in self.blocked for t in tensors) or any(
                s is None or len(s) != 4 or s[1] % self.block or s[0] != op.outer
                or s[1] * s[2] * s[3] != w for s, w in zip(shapes, op.widths, strict=True)):
            return None
        first = shapes[0]
        assert first is not None
        self.shapes[layer.output] = (first[0], sum(s[1] for s in shapes if s), *first[2:])
        inputs = {}
        for k, (tensor, shape) in enumerate(zip(tensors, shapes, strict=True)):
            self.shapes[tensor] = shape  # type: ignore[assignment]
            inputs[f"x{k}"] = self._blocked_input(tensor)
        return self._blocked_layer(layer, op, inputs)

    def _blocked_layer(self, layer: GeneratedLayer, op: GeneratedOp, inputs: dict[str, str]
                       ) -> GeneratedLayer:
        self.blocked[layer.output] = blocked_name(layer.output, self.block)
        self.blocked_nodes.update(layer.nodes)
        return dataclasses.replace(layer, op=op, inputs={**layer.inputs, **inputs},
                                   output=self.blocked[layer.output])

    def _graph_shape(self, tensor: str) -> tuple[int, ...] | None:
        info = self.index.tensors.get(tensor)
        if info is None or info.dims is None or not all(isinstance(d, int) for d in info.dims):
            return None
        return tuple(int(d) for d in info.dims)  # type: ignore[arg-type]

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
            elif name in inputs:
                self.plain_reads.add(inputs[name])  # a one-element activation, read plain
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
        if tensor in self.plain_reads or tensor in {o.name for o in self.graph.output}:
            return True
        return any(tensor in node.input and node_name(node, i) not in self.blocked_nodes
                   for i, node in enumerate(self.graph.node))

    def _shape(self, tensor: str) -> tuple[int, ...]:
        """The plain NCHW shape of a tensor a converted layer reads or writes (from its
        workload or operator, so dynamic ONNX shapes do not matter)."""
        return self.shapes[tensor]


def blocked_workload(workload: Workload, block: int) -> Workload | None:
    """The blocked operator a layer of ``workload`` runs in an ``nchwc`` plan with ``block``
    (its epilogue kept), or None for a layer that stays plain. Task extraction maps its tasks
    with this too, so a tuned blocked library finds records of the workloads it runs."""
    if workload.op == "conv2d" or (workload.op == "depthwise_conv2d"
                                   and getattr(workload, "multiplier", 1) == 1):
        _, _, body = workload.key.partition(":")
        plain_in = ",in_layout=nchw" if reads_plain(workload, block) else ""
        return parse_workload(f"{workload.op}_nchwc:{body}{plain_in},block={block}")
    if isinstance(workload, GroupConv2d) and group_window(
            workload.C, workload.K, workload.groups, block, 1) is not None:
        _, _, body = workload.key.partition(":")
        return parse_workload(f"group_conv2d_nchwc:{body},block={block}")
    return None


#: a conv reads its input plain when it has at most this share of a block of input channels...
_PLAIN_IN_SHARE = 4
#: ... on a feature map at least this large (not a squeeze-excite vector of 1 x 1 pixels)
_PLAIN_IN_PIXELS = 1024


def reads_plain(workload: Workload, block: int) -> bool:
    """Whether a ``conv2d`` layer's blocked twin reads NCHW activations (``in_layout=nchw``):
    an RGB stem (3 channels, 224 x 224) blocked to 16 channels moves 16/3 times its input's
    bytes twice (the ``to_nchwc`` transform writes them, the convolution's padded copy reads
    them): EfficientNet-B0's transform and stem took 0.25 + 0.66 ms against onnxruntime's
    0.39 for its stem."""
    c, h, w = (getattr(workload, name, 0) for name in ("C", "H", "W"))
    return workload.op == "conv2d" and 0 < c * _PLAIN_IN_SHARE <= block and (
        h * w >= _PLAIN_IN_PIXELS)


def _blocked_shape(shape: tuple[int, ...], block: int) -> tuple[int, ...]:
    n, c, *spatial = shape
    return (n, channel_blocks(c, block), *spatial, block)


def _pad(values: np.ndarray, length: int) -> np.ndarray:
    out = np.zeros(length, np.float32)
    out[:values.size] = values
    return out
