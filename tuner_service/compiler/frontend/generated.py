"""The generated-kernel plan: the nodes no tuned layer covers, as generated operators.

``plan_generated`` runs after ``fusion.plan_layers`` on what its layers leave: elementwise
nodes fuse into ``Elementwise`` programs (``generated_elementwise``), reductions, pooling,
softmax, layer norm and data movement map one node to one operator (``generated_ops``), and
the layer norm torch exports as nine nodes (ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt,
Div [, Mul gamma, Add beta]) becomes one ``LayerNorm``. Reshape, Flatten, Squeeze and Unsqueeze
stay numpy: they are views there and cost nothing.

The planner never fails a model. A node it refuses (dynamic or non-float32 shapes, an operator
class that does not exist, an attribute it does not map) stays a numpy step, as it would
without the planner; the reason is logged at debug level. Nodes whose outputs are constant are
left alone too: the runner folds them at load time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from functools import partial

import onnx

from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.folding import ConstantValues
from tuner_service.compiler.frontend.fusion import Layer, default_opset, node_name
from tuner_service.compiler.frontend.generated_context import (
    GeneratedLayer,
    PlanContext,
    Refused,
    attr,
    layer_for,
    make_op,
)
from tuner_service.compiler.frontend.generated_elementwise import (
    Chain,
    absorb,
    chain_layer,
    elementwise_node,
)
from tuner_service.compiler.frontend.generated_ops import MAPPERS
from tuner_service.compiler.frontend.graph import index_graph

logger = logging.getLogger(__name__)

__all__ = ["GeneratedLayer", "plan_generated"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


def plan_generated(proto: onnx.ModelProto, layers: Sequence[Layer]) -> list[GeneratedLayer]:
    """Generated layers for the nodes of a loaded (shape-inferred) model that ``layers`` do
    not cover, ordered by the graph position where each can run (its last node)."""
    graph = proto.graph
    opset = default_opset(proto)
    context = PlanContext(proto, index_graph(graph), ConstantValues(graph, opset), opset)
    covered = {name for layer in layers for name in layer.nodes}
    free = {i for i, node in enumerate(graph.node) if _plannable(node, i, covered, context)}
    planned = _layer_norms(context, free)
    pending: dict[str, Chain] = {}
    for index in sorted(free):
        node = graph.node[index]
        mapper = MAPPERS.get(node.op_type)
        if mapper is not None:
            planned += _try(partial(mapper, node, index, context), index, context)
            continue
        try:
            chain = elementwise_node(node, index, context)
        except Refused as e:
            logger.debug("node %s stays numpy: %s", context.name(index), e)
            continue
        chain = absorb(chain, pending, context)
        pending[chain.output] = chain
    for chain in pending.values():
        planned += _try(partial(_one, chain_layer, chain, context), chain.nodes[-1], context)
    return sorted(planned, key=lambda layer: layer.last_index)


def _layer_norms(context: PlanContext, free: set[int]) -> list[GeneratedLayer]:
    """Decomposed layer norms, matched from their first ReduceMean; their nodes leave ``free``."""
    found = []
    for index in sorted(free):
        if context.graph.node[index].op_type != "ReduceMean" or index not in free:
            continue
        try:
            layer = decomposed_layer_norm(index, context, free)
        except (Refused, ModelError, ValueError) as e:
            logger.debug("no layer norm from %s: %s", context.name(index), e)
            continue
        names = set(layer.nodes)
        free -= {i for i in free if context.name(i) in names}
        found.append(layer)
    return found


def _one(plan: Callable[[Chain, PlanContext], GeneratedLayer], chain: Chain,
         context: PlanContext) -> list[GeneratedLayer]:
    return [plan(chain, context)]


def _try(plan: Callable[[], list[GeneratedLayer]], index: int, context: PlanContext
         ) -> list[GeneratedLayer]:
    try:
        return plan()
    except (Refused, ModelError, ValueError) as e:
        logger.debug("node %s stays numpy: %s", context.name(index), e)
        return []


def _plannable(node: onnx.NodeProto, index: int, covered: set[str],
               context: PlanContext) -> bool:
    """Not a tuned layer's, in the default domain, computing something at run time."""
    return (node.domain in _DEFAULT_DOMAINS and node_name(node, index) not in covered
            and bool(node.output) and bool(node.output[0])
            and not context.is_constant(node.output[0])
            and any(n and not context.is_constant(n) for n in node.input))


def decomposed_layer_norm(index: int, context: PlanContext, free: set[int]) -> GeneratedLayer:
    """The LayerNorm whose mean is the ReduceMean at ``index``, matched node by node."""
    graph = context.graph
    first = graph.node[index]
    x = first.input[0]
    shape = context.shape(x)
    _last_axis_mean(first, shape, context)
    walk = _Walk(context, free, [index])
    sub = walk.only(first.output[0], "Sub", lambda n: list(n.input) == [x, first.output[0]])
    centred = sub.output[0]
    readers = walk.readers(centred)
    if len(readers) != 2 or context.readers.get(centred) != 2 or centred in context.outputs:
        raise Refused("the centred tensor is not read by exactly Pow and Div")
    pows = [i for i in readers if graph.node[i].op_type == "Pow"]
    if len(pows) != 1 or context.scalar(graph.node[pows[0]].input[1]) != 2.0:
        raise Refused("no Pow 2 of the centred tensor")
    square = walk.take(pows[0])
    second = walk.only(square.output[0], "ReduceMean", lambda n: True)
    _last_axis_mean(second, shape, context)
    add = walk.only(second.output[0], "Add", lambda n: n.input[0] == second.output[0])
    eps = context.scalar(add.input[1])
    root = walk.only(add.output[0], "Sqrt", lambda n: True)
    div = walk.only(root.output[0], "Div", lambda n: list(n.input) == [centred, root.output[0]])
    if eps is None or eps < 0:
        raise Refused("the epsilon is not a constant scalar")
    out, params = div.output[0], []
    for kind in ("Mul", "Add"):
        nxt = walk.maybe(out, kind, partial(_has_param, tensor=out, width=shape[-1],
                                            context=context))
        if nxt is None:
            break
        params.append(_param_of(nxt, out, shape[-1], context))
        out = nxt.output[0]
    if len(params) == 0:
        raise Refused("a layer norm without scale")  # LayerNorm's scale input is required
    op = make_op("layernorm", rows=math.prod(shape[:-1]), cols=shape[-1], eps=float(eps),
                 scale=True, bias=len(params) == 2)
    return layer_for(op, walk.nodes, [x, *params], out, context)


def _last_axis_mean(node: onnx.NodeProto, shape: tuple[int, ...], context: PlanContext
                    ) -> None:
    axes = context.ints(node, 1, "axes")
    if axes is None or [a % len(shape) for a in axes] != [len(shape) - 1] or not attr(
            node, "keepdims", 1):
        raise Refused("not a ReduceMean over the last axis with keepdims")


def _has_param(node: onnx.NodeProto, tensor: str, width: int, context: PlanContext) -> bool:
    return bool(_param_of(node, tensor, width, context))


def _param_of(node: onnx.NodeProto, tensor: str, width: int, context: PlanContext) -> str:
    """The constant of ``node`` (a Mul / Add of ``tensor``) when it is ``width`` values."""
    others = [n for n in node.input if n != tensor]
    if len(node.input) != 2 or len(others) != 1 or not context.is_constant(others[0]):
        return ""
    shape = context.shape(others[0])
    return others[0] if shape[-1:] == (width,) and math.prod(shape) == width else ""


class _Walk:
    """Follows single-reader edges through free nodes, collecting their indices."""

    def __init__(self, context: PlanContext, free: set[int], nodes: list[int]) -> None:
        self.context, self.free, self.nodes = context, free, nodes

    def readers(self, tensor: str) -> list[int]:
        return [i for i, n in enumerate(self.context.graph.node) if tensor in n.input]

    def take(self, index: int) -> onnx.NodeProto:
        if index not in self.free:
            raise Refused(f"node {self.context.name(index)} is not free")
        self.nodes.append(index)
        return self.context.graph.node[index]

    def maybe(self, tensor: str, op: str, check: Callable[[onnx.NodeProto], bool]
              ) -> onnx.NodeProto | None:
        if not self.context.single_reader(tensor):
            return None
        (index,) = self.readers(tensor)
        node = self.context.graph.node[index]
        if node.op_type != op or index not in self.free or not check(node):
            return None
        return self.take(index)

    def only(self, tensor: str, op: str, check: Callable[[onnx.NodeProto], bool]
             ) -> onnx.NodeProto:
        node = self.maybe(tensor, op, check)
        if node is None:
            raise Refused(f"{tensor} is not read only by a matching {op}")
        return node
