"""Elementwise ONNX nodes as fused ``Elementwise`` programs.

Each node becomes a few instructions over its inputs (a BatchNormalization in inference mode a
multiply and an add by per-channel constants, Gelu's tanh form its polynomial). Nodes then fuse
the way TVM's FuseOps fuses injective operators: a node absorbs the program that computes one of
its inputs when it is that tensor's only reader and the tensor is not a graph output, so an
intermediate never touches memory. Several inputs may be absorbed (a DAG whose edges have one
reader each, the SiLU ``x * sigmoid(x)`` excepted: ``x`` has two readers and stays an input).
A program is capped at ``MAX_INSTRUCTIONS``; past it, the producer keeps its own kernel.

Every instruction is pointwise, so a program computed at the final output's shape, each input
broadcast to it, equals the node-by-node result (broadcasting commutes with pointwise math).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import onnx

from tuner_service.compiler.frontend.generated_context import (
    GeneratedLayer,
    PlanContext,
    Refused,
    attr,
    layer_for,
    make_op,
)

MAX_INSTRUCTIONS = 32

#: an instruction operand: an ONNX tensor ("x", name), a planner constant ("c", key), an
#: earlier instruction of the same program ("t", index), or a literal
Operand = tuple[str, str] | tuple[str, int] | float
Instruction = tuple[str, list[Operand]]

_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Exp": "exp",
          "Log": "log", "Sqrt": "sqrt", "Neg": "neg", "Abs": "abs",
          "Reciprocal": "reciprocal", "Floor": "floor", "HardSwish": "hardswish"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


@dataclasses.dataclass
class Chain:
    """A fused program in the making; its result is the last instruction's."""

    nodes: list[int]
    program: list[Instruction]
    constants: dict[str, np.ndarray]
    output: str


def elementwise_node(node: onnx.NodeProto, index: int, context: PlanContext) -> Chain:
    """The node's own program over its inputs; Refused if it is not a mapped elementwise op."""
    translate = _TRANSLATE.get(node.op_type)
    if translate is None or any(node.output[1:]):
        raise Refused(f"{node.op_type} is not elementwise")
    context.shape(node.output[0])
    constants: dict[str, np.ndarray] = {}
    program = translate(node, context, constants)
    return Chain([index], program, constants, node.output[0])


def absorb(chain: Chain, pending: dict[str, Chain], context: PlanContext) -> Chain:
    """``chain`` (one node's program) with the pending programs of its single-reader inputs
    inlined, while the result stays within ``MAX_INSTRUCTIONS``."""
    program: list[Instruction] = []
    result: dict[str, Operand] = {}
    nodes, constants = list(chain.nodes), dict(chain.constants)
    size = len(chain.program)
    for operand in _tensors(chain.program):
        child = pending.get(operand)
        if child is None or operand in result or not context.single_reader(operand):
            continue
        if size + len(child.program) > MAX_INSTRUCTIONS:
            continue
        del pending[operand]
        result[operand] = ("t", len(program) + len(child.program) - 1)
        program += _shifted(child.program, len(program), {})
        nodes += child.nodes
        constants.update(child.constants)
        size += len(child.program)
    program += _shifted(chain.program, len(program), result)
    return Chain(sorted(nodes), program, constants, chain.output)


def chain_layer(chain: Chain, context: PlanContext) -> GeneratedLayer:
    """The ``Elementwise`` layer of a finished program."""
    names: dict[Operand, str] = {}
    for _, operands in chain.program:
        for operand in operands:
            if isinstance(operand, tuple) and operand[0] in ("x", "c") and operand not in names:
                names[operand] = f"x{len(names)}"
    shape = context.shape(chain.output)
    shapes: list[tuple[int, ...]] = []
    tensors: list[str] = []
    constants: dict[str, np.ndarray] = {}
    for operand, name in names.items():
        kind, ref = operand if isinstance(operand, tuple) else ("", "")
        if kind == "c":
            value = chain.constants[str(ref)]
            constants[name] = value
            shapes.append(tuple(value.shape))
            tensors.append("")
        else:
            shapes.append(context.shape(str(ref)))
            tensors.append(str(ref))
        if np.broadcast_shapes(shapes[-1], shape) != shape:
            raise Refused(f"input {ref} of shape {shapes[-1]} does not broadcast to {shape}")
    program = tuple((op, *(_render(o, names) for o in operands))
                    for op, operands in chain.program)
    op = make_op("elementwise", shape=shape, inputs=tuple(shapes), program=program)
    return layer_for(op, chain.nodes, tensors, chain.output, context, constants)


def _tensors(program: list[Instruction]) -> list[str]:
    found: list[str] = []
    for _, operands in program:
        for o in operands:
            if isinstance(o, tuple) and o[0] == "x" and str(o[1]) not in found:
                found.append(str(o[1]))
    return found


def _shifted(program: list[Instruction], offset: int, replace: dict[str, Operand]
             ) -> list[Instruction]:
    def move(o: Operand) -> Operand:
        if isinstance(o, tuple) and o[0] == "t":
            return ("t", int(o[1]) + offset)
        if isinstance(o, tuple) and o[0] == "x" and str(o[1]) in replace:
            return replace[str(o[1])]
        return o

    return [(op, [move(o) for o in operands]) for op, operands in program]


def _render(operand: Operand, names: dict[Operand, str]) -> str | float:
    if not isinstance(operand, tuple):
        return float(operand)
    if operand[0] == "t":
        return f"t{operand[1]}"
    return names[operand]


def _operand(tensor: str, context: PlanContext) -> Operand:
    """A scalar constant becomes a literal; anything else is a float32 tensor input."""
    value = context.scalar(tensor)
    if value is not None:
        return value
    context.shape(tensor)
    return ("x", tensor)


def _literal(tensor: str, context: PlanContext, what: str) -> float:
    value = context.scalar(tensor) if tensor else None
    if value is None:
        raise Refused(f"the {what} {tensor!r} is not a constant scalar")
    return value


Translate = Callable[[onnx.NodeProto, PlanContext, dict[str, np.ndarray]], list[Instruction]]


def _unary(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
           ) -> list[Instruction]:
    return [(_UNARY[node.op_type], [_operand(node.input[0], context)])]


def _binary(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
            ) -> list[Instruction]:
    if len(node.input) != 2:
        raise Refused(f"{node.op_type} with {len(node.input)} inputs")
    a, b = (_operand(n, context) for n in node.input)
    return [(_BINARY[node.op_type], [a, b])]


def _extremum(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
              ) -> list[Instruction]:
    operands = [_operand(n, context) for n in node.input if n]
    op = node.op_type.lower()
    if len(operands) == 1:
        return [("max", [operands[0], operands[0]])]
    program: list[Instruction] = [(op, operands[:2])]
    for other in operands[2:]:
        program.append((op, [("t", len(program) - 1), other]))
    return program


def _pow(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
         ) -> list[Instruction]:
    exponent = _literal(node.input[1], context, "exponent")
    return [("pow", [_operand(node.input[0], context), exponent])]


def _leaky_relu(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
                ) -> list[Instruction]:
    return [("leakyrelu", [_operand(node.input[0], context), float(attr(node, "alpha", 0.01))])]


def _hard_sigmoid(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
                  ) -> list[Instruction]:
    return [("hardsigmoid", [_operand(node.input[0], context), float(attr(node, "alpha", 0.2)),
                             float(attr(node, "beta", 0.5))])]


def _clip(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
          ) -> list[Instruction]:
    if context.opset < 11:
        low, high = float(attr(node, "min", -math.inf)), float(attr(node, "max", math.inf))
    else:
        names = [*node.input[1:3], "", ""]
        low = _literal(names[0], context, "lower bound") if names[0] else -math.inf
        high = _literal(names[1], context, "upper bound") if names[1] else math.inf
    return [("clip", [_operand(node.input[0], context), low, high])]


def _gelu(node: onnx.NodeProto, context: PlanContext, _: dict[str, np.ndarray]
          ) -> list[Instruction]:
    x = _operand(node.input[0], context)
    if attr(node, "approximate", "none") == "none":
        return [("gelu", [x])]
    if attr(node, "approximate") != "tanh":
        raise Refused(f"Gelu approximate={attr(node, 'approximate')!r}")
    # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    return [("pow", [x, 3.0]), ("mul", [("t", 0), 0.044715]), ("add", [x, ("t", 1)]),
            ("mul", [("t", 2), math.sqrt(2.0 / math.pi)]), ("tanh", [("t", 3)]),
            ("add", [("t", 4), 1.0]), ("mul", [x, ("t", 5)]), ("mul", [("t", 6), 0.5])]


def _batch_norm(node: onnx.NodeProto, context: PlanContext, constants: dict[str, np.ndarray]
                ) -> list[Instruction]:
    """Inference batch norm: ``x * s + (beta - mean * s)``, ``s = gamma / sqrt(var + eps)``."""
    if len(node.input) != 5 or attr(node, "training_mode", 0) or any(node.output[1:]):
        raise Refused("a training-mode BatchNormalization")
    shape = context.shape(node.input[0])
    if len(shape) < 2:
        raise Refused("BatchNormalization of a rank-1 tensor")
    params = node.input[1:]
    if not all(context.is_constant(p) and context.shape(p) == (shape[1],) for p in params):
        raise Refused("BatchNormalization parameters are not constant per-channel vectors")
    gamma, beta, mean, var = (np.asarray(context.values.get(p), dtype=np.float64)
                              for p in params)
    epsilon = np.float64(np.float32(attr(node, "epsilon", 1e-5)))
    scale = gamma / np.sqrt(var + epsilon)
    broadcast = (shape[1],) + (1,) * (len(shape) - 2)
    key = node.output[0]
    constants[f"{key}:scale"] = (scale.astype(np.float32)).reshape(broadcast)
    constants[f"{key}:shift"] = ((beta - mean * scale).astype(np.float32)).reshape(broadcast)
    return [("mul", [_operand(node.input[0], context), ("c", f"{key}:scale")]),
            ("add", [("t", 0), ("c", f"{key}:shift")])]


_TRANSLATE: dict[str, Translate] = {
    **{op: _unary for op in _UNARY}, **{op: _binary for op in _BINARY},
    "Max": _extremum, "Min": _extremum, "Pow": _pow, "LeakyRelu": _leaky_relu,
    "HardSigmoid": _hard_sigmoid, "Clip": _clip, "Gelu": _gelu,
    "BatchNormalization": _batch_norm,
}
