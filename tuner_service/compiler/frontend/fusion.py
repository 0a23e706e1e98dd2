"""The layer plan: which ONNX nodes one tuned kernel computes, and what feeds its inputs.

Each tunable anchor (Conv, Gemm, MatMul) becomes one ``Layer``. When the workload can fuse an
epilogue, the anchor absorbs the elementwise nodes that follow it while the ONNX graph allows:

    Conv | Gemm | MatMul  [-> BatchNormalization] [-> Add/Sub/Mul/Div by a per-channel constant]
                          [-> Add (residual)] [-> Relu | Clip | an activation]

where an activation is one node (Sigmoid, HardSigmoid, HardSwish, Tanh, Gelu) or the SiLU and
erf-GELU patterns exporters write (``activation_patterns``).

A node is absorbed only when the tensor between it and the chain has exactly one consumer and
is not a graph output. Multiplications (and batch norms) must come before the residual add; a
residual is an activation of the output's exact shape produced *before the anchor* (or a graph
input), so a layer may run at its anchor's position or at its last node's, whichever a runtime
prefers. Batch-norm parameters, per-channel constants and clip bounds must be constants.

Key decisions are taken from shapes and constant-ness only (``extract_tasks`` runs them on
untrusted uploads); ``plan_layers`` then computes the constant arrays (folded scale and bias,
transposed weights) with ``folding``.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import onnx

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import Workload
from schedule_templates.workloads.epilogue import Activation, Epilogue
from tuner_service.compiler.frontend.activation_patterns import multi_node, single_node
from tuner_service.compiler.frontend.anchors import Anchor, map_anchor
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.folding import (
    ConstantValues,
    Step,
    materialize,
    scalar_constants,
)
from tuner_service.compiler.frontend.graph import GraphIndex, index_graph
from tuner_service.compiler.frontend.loading import load_model

logger = logging.getLogger(__name__)

_DEFAULT_DOMAINS = ("", "ai.onnx")
_FLT_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One kernel call standing for ``nodes`` of the model.

    ``inputs`` maps a kernel input name (as in ``workload.input_shapes()``) to the ONNX tensor
    that feeds it; that tensor has the kernel input's element count and order, so a reshape
    binds it (``dense`` data of shape (1, 128, 768) feeds (128, 768)). ``constants`` holds the
    inputs computed at plan time (folded batch norm, transposed weights, reshaped biases), in
    the kernel input's exact shape, float32; they take precedence over ``inputs``. The kernel
    output, reshaped, is the ONNX tensor ``output``.
    """

    workload: Workload
    nodes: tuple[str, ...]
    inputs: dict[str, str]
    constants: dict[str, np.ndarray]
    output: str
    #: index in ``graph.node`` of the anchor and of the last fused node
    anchor_index: int = -1
    last_index: int = -1


@dataclasses.dataclass
class Match:
    """A planned layer before its constant arrays are computed."""

    anchor: Anchor
    nodes: list[int]
    output: str
    steps: list[Step]
    residual: Step | None = None
    clip: tuple[float, float] | None = None
    activation: Activation | None = None

    @property
    def epilogue(self) -> Epilogue:
        kinds = {s.kind for s in self.steps}
        return Epilogue(scale=bool(kinds & {"mul", "div", "bn"}),
                        bias=bool(kinds & {"add", "sub", "bn"}),
                        residual=self.residual is not None, clip=self.clip,
                        activation=self.activation)

    @property
    def workload(self) -> Workload:
        epilogue = self.epilogue
        if not epilogue:
            return self.anchor.workload
        return self.anchor.workload.with_epilogue(epilogue)


def node_name(node: onnx.NodeProto, index: int) -> str:
    """The name a node is known by in plans and errors (ONNX node names are optional)."""
    return node.name or f"{node.op_type}_{index}"


def plan_layers(model: bytes | bytearray | memoryview | onnx.ModelProto) -> list[Layer]:
    """One layer per tunable anchor node, in graph order of the anchors.

    Raises ModelError for a model ``extract_tasks`` would refuse, or when a constant the plan
    needs cannot be computed. Anchors that no kernel can reproduce exactly (a Gemm of two
    activations with a bias, a grouped convolution, ...) get no layer: a runtime computes them
    like any other node.
    """
    proto = load_model(model)
    graph = proto.graph
    info = index_graph(graph)
    values = ConstantValues(graph, default_opset(proto))
    layers = []
    for match in match_layers(proto, info):
        names = tuple(node_name(graph.node[i], i) for i in match.nodes)
        inputs, constants = materialize(match.anchor, match.steps, match.residual, values,
                                        info.constants)
        layers.append(Layer(match.workload, names, inputs, constants, match.output,
                            match.nodes[0], match.nodes[-1]))
    return layers


def fused_workloads(proto: onnx.ModelProto, index: GraphIndex | None = None
                    ) -> dict[int, Workload]:
    """Anchor node index -> its fused workload, for a loaded model (no constant is computed)."""
    return {m.nodes[0]: m.workload for m in match_layers(proto, index)}


def default_opset(proto: onnx.ModelProto) -> int:
    for entry in proto.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return int(entry.version)
    return 1


@dataclasses.dataclass(frozen=True)
class _Context:
    graph: onnx.GraphProto
    info: GraphIndex
    users: _Users
    scalars: dict[str, float]
    opset: int
    values: ConstantValues

    def scalar(self, name: str) -> float | None:
        """A constant clip bound: given directly, or computed from tiny constants."""
        if name in self.scalars:
            return self.scalars[name]
        if not self.info.is_constant(name):
            return None
        return self.values.small_scalar(name, self.info)


def match_layers(proto: onnx.ModelProto, index: GraphIndex | None = None) -> list[Match]:
    """Anchors and the nodes each absorbs, decided from shapes and constant-ness alone."""
    graph = proto.graph
    info = index or index_graph(graph)
    opset = default_opset(proto)
    context = _Context(graph, info, _Users(graph), scalar_constants(graph), opset,
                       ConstantValues(graph, opset))
    claimed: set[int] = set()
    matches = []
    for position, node in enumerate(graph.node):
        if node.domain not in _DEFAULT_DOMAINS or position in claimed:
            continue
        try:
            anchor = map_anchor(node, position, info)
        except (UnmappableNode, InvalidWorkloadError) as e:
            logger.debug("node %s is not a layer: %s", node_name(node, position), e)
            continue
        if anchor is None:
            continue
        match = Match(anchor, [position], node.output[0], list(anchor.steps),
                      residual=anchor.residual)
        if anchor.fusable:
            _extend(match, context, claimed)
        claimed.update(match.nodes)
        matches.append(match)
    return matches


class _Users:
    """How often each tensor is read (subgraph reads count) and who produces it."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.count: dict[str, int] = {}
        self.reader: dict[str, int] = {}
        self.readers: dict[str, list[int]] = {}
        self.producer: dict[str, int] = {}
        self.graph_inputs = {v.name for v in graph.input}
        self.outputs = {v.name for v in graph.output}
        for position, node in enumerate(graph.node):
            for name in node.input:
                if name:
                    self.count[name] = self.count.get(name, 0) + 1
                    self.reader[name] = position
                    self.readers.setdefault(name, []).append(position)
            for name in subgraph_reads(node):
                self.count[name] = self.count.get(name, 0) + 1
            for name in node.output:
                self.producer[name] = position

    def only_reader(self, name: str) -> int | None:
        if name in self.outputs or self.count.get(name) != 1:
            return None
        return self.reader.get(name)

    def all_readers(self, name: str) -> list[int] | None:
        """The nodes reading ``name``, in graph order; None when it is also a graph output, is
        read inside a subgraph, or one node reads it twice."""
        found = self.readers.get(name, [])
        if name in self.outputs or self.count.get(name, 0) != len(found):
            return None
        return sorted(set(found)) if len(set(found)) == len(found) else None

    def ready_before(self, name: str, position: int) -> bool:
        """True when ``name`` exists before node ``position`` runs."""
        if name in self.graph_inputs and name not in self.producer:
            return True
        return self.producer.get(name, position) < position


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Tensors a node's subgraphs (If/Loop/Scan bodies) read, at any depth."""
    names: set[str] = set()
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            for inner in sub.node:
                names.update(n for n in inner.input if n)
                names |= subgraph_reads(inner)
    return names


def _extend(match: Match, context: _Context, claimed: set[int]) -> None:
    """Absorb following nodes while each one is a legal epilogue step."""
    while match.clip is None and match.activation is None:
        pattern = multi_node(match.output, context.graph, context.users.all_readers,
                             context.scalar)
        if pattern is not None and not claimed.intersection(pattern.nodes):
            match.activation = pattern.activation
            match.nodes.extend(pattern.nodes)
            match.output = pattern.output
            return
        nxt = context.users.only_reader(match.output)
        if nxt is None or nxt in claimed:
            return
        node = context.graph.node[nxt]
        if (node.domain not in _DEFAULT_DOMAINS or not node.output[0]
                or any(node.output[1:])):
            return
        if not _absorb(match, node, context):
            return
        match.nodes.append(nxt)
        match.output = node.output[0]


def _absorb(match: Match, node: onnx.NodeProto, context: _Context) -> bool:
    """Add ``node`` to the match's epilogue if it fits; False (and no change) if not."""
    t, op, info = match.output, node.op_type, context.info
    activation = single_node(node, context.opset)
    if activation is not None:
        if node.input[0] != t:
            return False
        match.activation = activation
        return True
    if op in ("Relu", "Clip"):
        if node.input[0] != t:
            return False
        bounds = (0.0, np.inf) if op == "Relu" else _clip_bounds(node, context)
        return bounds is not None and _set_clip(match, bounds)
    if op == "BatchNormalization":
        if match.residual is not None or not _batch_norm_ok(node, match, info):
            return False
        match.steps.append(Step("bn", node.input[0], node=node))
        return True
    if op not in ("Add", "Sub", "Mul", "Div") or len(node.input) != 2:
        return False
    first = node.input[0] == t
    other = node.input[1] if first else node.input[0]
    if op in ("Sub", "Div") and not first:
        return False
    if info.is_constant(other) and match.anchor.per_channel(other, info):
        if op in ("Mul", "Div") and match.residual is not None:
            return False  # scaling after the residual would scale it too
        match.steps.append(Step({"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}[op],
                                other))
        return True
    if op != "Add" or match.residual is not None:
        return False
    if info.is_constant(other):
        if not match.anchor.broadcasts(other, info):
            return False
    elif not (match.anchor.same_shape(other, info)
              and context.users.ready_before(other, match.nodes[0])):
        return False
    match.residual = Step("residual", other)
    return True


def _set_clip(match: Match, bounds: tuple[float, float]) -> bool:
    low, high = (-np.inf if v <= -_FLT_MAX else np.inf if v >= _FLT_MAX else v for v in bounds)
    try:
        Epilogue(clip=(low, high))
    except InvalidWorkloadError:
        return False
    match.clip = (float(low), float(high))
    return True


def _clip_bounds(node: onnx.NodeProto, context: _Context) -> tuple[float, float] | None:
    if context.opset < 11:
        bounds = {a.name: float(a.f) for a in node.attribute if a.name in ("min", "max")}
        return bounds.get("min", -np.inf), bounds.get("max", np.inf)
    found = []
    for position, default in ((1, -np.inf), (2, np.inf)):
        name = node.input[position] if len(node.input) > position else ""
        value = context.scalar(name) if name else default
        if value is None:
            return None  # a bound computed at run time
        found.append(value)
    return found[0], found[1]


def _batch_norm_ok(node: onnx.NodeProto, match: Match, info: GraphIndex) -> bool:
    if len(node.input) != 5 or node.input[0] != match.output:
        return False
    if any(a.name == "training_mode" and a.i for a in node.attribute):
        return False
    return match.anchor.channel_axis == 1 and all(
        info.is_constant(p) and match.anchor.per_channel(p, info, exact=True)
        for p in node.input[1:])
