"""Activations a fused epilogue can absorb: single ONNX nodes and the multi-node forms
exporters write for SiLU and GELU.

Single nodes: ``Sigmoid``, ``HardSigmoid`` (its alpha and beta become part of the key),
``HardSwish``, ``Tanh`` and ``Gelu`` (opset 20, erf form only). Patterns, on a tensor ``x``
that the epilogue chain produced:

    SiLU:  s = Sigmoid(x); y = Mul(x, s)
    GELU:  d = Div(x, 1.41421) | Mul(x, 0.70711); e = Erf(d); a = Add(e, 1);
           y = Mul(Mul(x, a), 0.5) | Mul(Mul(x, 0.5), a)

Mul and Add operands may come in either order; constants are checked to 1e-4. Every tensor
inside a pattern must be read only by the pattern's own nodes and be no graph output, and ``x``
must be read by exactly the pattern's two entry nodes: the fused kernel writes ``y`` alone.
Decisions use node types, attributes and scalar constants only (the graph is untrusted).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import onnx

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads.epilogue import Activation

_TOLERANCE = 1e-4
_SIMPLE = {"Sigmoid": "sigmoid", "HardSwish": "hardswish", "Tanh": "tanh"}

#: the readers of a tensor (node positions), or None when it has other uses (a graph output,
#: a read from a subgraph) that a fused kernel would not feed
Readers = Callable[[str], list[int] | None]
#: a one-element float constant's value, or None
Scalar = Callable[[str], float | None]


@dataclasses.dataclass(frozen=True)
class ActivationMatch:
    activation: Activation
    nodes: tuple[int, ...]  # in graph order
    output: str


def single_node(node: onnx.NodeProto, opset: int) -> Activation | None:
    """The activation one node computes on its first input, or None."""
    op = node.op_type
    if len(node.input) != 1:
        return None
    if op in _SIMPLE:
        return Activation(_SIMPLE[op])
    if op == "HardSigmoid":
        attrs = {a.name: float(a.f) for a in node.attribute if a.name in ("alpha", "beta")}
        try:
            return Activation("hardsigmoid", (attrs.get("alpha", 0.2), attrs.get("beta", 0.5)))
        except InvalidWorkloadError:
            return None
    if op == "Gelu" and opset >= 20:
        approximate = next((a.s.decode() for a in node.attribute if a.name == "approximate"),
                           "none")
        return Activation("gelu") if approximate == "none" else None
    return None


def multi_node(x: str, graph: onnx.GraphProto, readers: Readers, scalar: Scalar
               ) -> ActivationMatch | None:
    """SiLU or GELU applied to ``x`` (which must have exactly the pattern's two readers)."""
    entry = readers(x)
    if entry is None or len(entry) != 2:
        return None
    return _silu(x, entry, graph, readers) or _gelu(x, entry, graph, readers, scalar)


def _silu(x: str, entry: list[int], graph: onnx.GraphProto, readers: Readers
          ) -> ActivationMatch | None:
    for s, m in (entry, entry[::-1]):
        sig, mul = graph.node[s], graph.node[m]
        if not (_is(sig, "Sigmoid", 1) and _is(mul, "Mul", 2)):
            continue
        if (sig.input[0] == x and sorted(mul.input) == sorted([x, sig.output[0]])
                and readers(sig.output[0]) == [m]):
            return ActivationMatch(Activation("silu"), tuple(sorted((s, m))), mul.output[0])
    return None


def _gelu(x: str, entry: list[int], graph: onnx.GraphProto, readers: Readers, scalar: Scalar
          ) -> ActivationMatch | None:
    """``x * (1 + erf(x / sqrt 2))`` then ``* 0.5``, or ``(x * 0.5) * (1 + erf(...))``."""
    for d, m in (entry, entry[::-1]):
        head = _erf_plus_one(x, d, graph, readers, scalar)
        if head is None:
            continue
        add = graph.node[head[-1]].output[0]
        mul = graph.node[m]
        if not _is(mul, "Mul", 2):
            continue
        if sorted(mul.input) == sorted([x, add]) and readers(add) == [m]:
            half = _only_reader(mul, graph, readers, "Mul", 2)
            if half is not None and _other_is(graph.node[half], mul.output[0], 0.5, scalar):
                return ActivationMatch(Activation("gelu"), tuple(sorted([*head, m, half])),
                                       graph.node[half].output[0])
        elif _other_is(mul, x, 0.5, scalar):  # the half taken first
            last = _only_reader(mul, graph, readers, "Mul", 2)
            if (last is not None and readers(add) == [last]
                    and sorted(graph.node[last].input) == sorted([mul.output[0], add])):
                return ActivationMatch(Activation("gelu"), tuple(sorted([*head, m, last])),
                                       graph.node[last].output[0])
    return None


def _erf_plus_one(x: str, d: int, graph: onnx.GraphProto, readers: Readers, scalar: Scalar
                  ) -> list[int] | None:
    """Nodes ``d`` (x / sqrt 2), Erf, Add(., 1) in a private chain; None if not that."""
    if not _scales_by_inverse_sqrt2(graph.node[d], x, scalar):
        return None
    erf = _only_reader(graph.node[d], graph, readers, "Erf", 1)
    if erf is None:
        return None
    add = _only_reader(graph.node[erf], graph, readers, "Add", 2)
    if add is None or not _other_is(graph.node[add], graph.node[erf].output[0], 1.0, scalar):
        return None
    return [d, erf, add]


def _scales_by_inverse_sqrt2(node: onnx.NodeProto, x: str, scalar: Scalar) -> bool:
    if _is(node, "Div", 2):
        return node.input[0] == x and _near(scalar(node.input[1]), math.sqrt(2.0))
    if _is(node, "Mul", 2):
        return _other_is(node, x, math.sqrt(0.5), scalar)
    return False


def _only_reader(node: onnx.NodeProto, graph: onnx.GraphProto, readers: Readers, op: str,
                 arity: int) -> int | None:
    found = readers(node.output[0])
    if found is None or len(found) != 1 or not _is(graph.node[found[0]], op, arity):
        return None
    return found[0]


def _other_is(node: onnx.NodeProto, operand: str, value: float, scalar: Scalar) -> bool:
    """``node`` takes ``operand`` once and a constant equal to ``value`` as its other input."""
    if list(node.input).count(operand) != 1:
        return False
    other = node.input[1] if node.input[0] == operand else node.input[0]
    return _near(scalar(other), value)


def _near(found: float | None, value: float) -> bool:
    return found is not None and abs(found - value) <= _TOLERANCE


def _is(node: onnx.NodeProto, op: str, arity: int) -> bool:
    return (node.op_type == op and node.domain in ("", "ai.onnx") and len(node.input) == arity
            and len(node.output) == 1 and bool(node.output[0]))
