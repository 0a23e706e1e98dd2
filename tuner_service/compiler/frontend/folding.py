"""Constant arrays of a layer plan: folded batch norm and biases, transposed weights.

``ConstantValues`` computes any constant tensor of a graph (initializers, ``Constant`` nodes,
and nodes whose inputs are all constant, evaluated with onnx's reference implementation).
``materialize`` turns an anchor and its epilogue steps into the kernel's ``inputs`` (tensor
names) and ``constants`` (arrays in the kernel inputs' shapes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnx.numpy_helper

from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.graph import GraphIndex

if TYPE_CHECKING:
    from tuner_service.compiler.frontend.anchors import Anchor


@dataclasses.dataclass(frozen=True)
class Step:
    """One epilogue operation: ``add``/``sub``/``mul``/``div`` by a per-channel constant
    (times ``factor``), ``bn`` (the BatchNormalization ``node``), or ``residual``.

    A per-channel constant broadcasts onto the output the numpy way, unless ``vector``: then it
    is one value per channel by the operator's definition (a Conv bias of shape (K,)).
    """

    kind: str
    tensor: str
    factor: float = 1.0
    node: onnx.NodeProto | None = None
    vector: bool = False


@dataclasses.dataclass(frozen=True)
class WeightRecipe:
    """Kernel input ``kernel_name`` = ``factor * tensor`` (transposed if ``transpose``)."""

    kernel_name: str
    tensor: str
    transpose: bool
    factor: float


#: limits of what ``small_scalar`` evaluates
SMALL_NODES = 8
SMALL_ELEMENTS = 64


def _small(info: GraphIndex, name: str) -> bool:
    tensor = info.tensors.get(name)
    if tensor is None or tensor.dims is None:
        return False
    return all(isinstance(d, int) for d in tensor.dims) and math.prod(
        d for d in tensor.dims if isinstance(d, int)) <= SMALL_ELEMENTS


class ConstantValues:
    """Values of constant tensors, computed on first use and cached."""

    def __init__(self, graph: onnx.GraphProto, opset: int) -> None:
        self._graph = graph
        self._opset = opset
        self._values: dict[str, np.ndarray] = {}
        self._initializers = {t.name: t for t in graph.initializer}  # converted when read
        self._producer = {name: i for i, node in enumerate(graph.node) for name in node.output}

    def get(self, name: str) -> np.ndarray:
        if name not in self._values and name in self._initializers:
            self._values[name] = onnx.numpy_helper.to_array(self._initializers[name])
        if name not in self._values:
            for position in self._producers_of(name):
                self._evaluate(self._graph.node[position])
        return self._values[name]

    def small_scalar(self, name: str, info: GraphIndex) -> float | None:
        """The value of a one-element float constant computed by a few nodes on tiny tensors
        (``Cast(Constant)`` clip bounds), else None. Safe on untrusted models: nothing larger
        than ``SMALL_ELEMENTS`` elements is ever evaluated."""
        try:
            nodes = self._producers_of(name)
        except ModelError:
            return None
        tensors = {n for i in nodes for n in (*self._graph.node[i].input,
                                              *self._graph.node[i].output) if n}
        if len(nodes) > SMALL_NODES or not all(_small(info, t) for t in tensors | {name}):
            return None
        value = self.get(name)
        if value.size != 1 or value.dtype.kind != "f":
            return None
        return float(value.reshape(()))

    def _producers_of(self, name: str) -> list[int]:
        """The nodes computing ``name``, in graph (topological) order."""
        needed: set[int] = set()
        stack = [name]
        while stack:
            tensor = stack.pop()
            if tensor in self._values or tensor in self._initializers:
                continue
            position = self._producer.get(tensor)
            if position is None:
                raise ModelError(f"tensor {tensor!r} is not a constant the plan can compute")
            if position not in needed:
                needed.add(position)
                stack.extend(n for n in self._graph.node[position].input if n)
        return sorted(needed)

    def _evaluate(self, node: onnx.NodeProto) -> None:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            self._values[node.output[0]] = _constant_attribute(node)
            return
        from onnx.reference import ReferenceEvaluator

        feeds = {n: self.get(n) for n in node.input if n}
        try:
            results = ReferenceEvaluator(node, opsets={"": self._opset}).run(None, feeds)
        except Exception as e:  # onnx's evaluator raises many types; the model is at fault
            raise ModelError(f"cannot compute constant node {node.name or node.op_type!r}: "
                             f"{e}") from e
        for output, value in zip(node.output, results, strict=False):
            if output:
                self._values[output] = np.asarray(value)


def _constant_attribute(node: onnx.NodeProto) -> np.ndarray:
    for attr in node.attribute:
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, onnx.TensorProto):
            return onnx.numpy_helper.to_array(value)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(value, dtype=np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(value, dtype=np.int64)
    raise ModelError(f"Constant node {node.name!r} has a value the plan cannot read")


def scalar_constants(graph: onnx.GraphProto) -> dict[str, float]:
    """One-element float constants given directly (initializers, Constant nodes): the clip
    bounds fusion may read without evaluating anything."""
    found: dict[str, float] = {}
    tensors = [(t.name, t) for t in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attr in node.attribute:
                if attr.name == "value" and attr.HasField("t"):
                    tensors.append((node.output[0], attr.t))
                elif attr.name == "value_float":
                    found[node.output[0]] = float(attr.f)
    for name, tensor in tensors:
        if math.prod(tensor.dims) == 1 and tensor.data_type == onnx.TensorProto.FLOAT:
            found[name] = float(onnx.numpy_helper.to_array(tensor).reshape(()))
    return found


def materialize(anchor: Anchor, steps: Sequence[Step], residual: Step | None,
                values: ConstantValues, constants_names: frozenset[str]
                ) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The layer's ``inputs`` and ``constants`` (float32, in the kernel inputs' shapes)."""
    inputs = dict(anchor.inputs)
    constants: dict[str, np.ndarray] = {}
    shapes = anchor.workload.input_shapes()
    recipe = anchor.weight
    if recipe is not None:
        weight = np.asarray(values.get(recipe.tensor), dtype=np.float64)
        weight = (weight.T if recipe.transpose else weight) * recipe.factor
        constants[recipe.kernel_name] = _f32(weight, shapes[recipe.kernel_name])
    if steps:
        scale, bias = _fold(anchor, steps, values)
        kinds = {s.kind for s in steps}
        if kinds & {"mul", "div", "bn"}:
            constants["scale"] = _f32(scale, (anchor.channels,))
        if kinds & {"add", "sub", "bn"}:
            constants["bias"] = _f32(bias, (anchor.channels,))
    if residual is not None:
        if residual.tensor in constants_names:
            value = np.asarray(values.get(residual.tensor), dtype=np.float64) * residual.factor
            full = np.broadcast_to(value, anchor.out_shape)
            constants["residual"] = _f32(full, anchor.workload.output_shape())
        else:
            inputs["residual"] = residual.tensor
    return inputs, constants


def _fold(anchor: Anchor, steps: Sequence[Step], values: ConstantValues
          ) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (scale, bias) with ``epilogue(acc) = acc * scale + bias``, in float64."""
    scale = np.ones(anchor.channels)
    bias = np.zeros(anchor.channels)
    for step in steps:
        if step.kind == "bn":
            s, shift = _batch_norm(step.node, values)
            scale, bias = scale * s, bias * s + shift
            continue
        value = values.get(step.tensor)
        c = (np.asarray(value, dtype=np.float64).reshape(anchor.channels) if step.vector
             else _per_channel(anchor, value)) * step.factor
        if step.kind == "add":
            bias = bias + c
        elif step.kind == "sub":
            bias = bias - c
        elif step.kind == "mul":
            scale, bias = scale * c, bias * c
        elif step.kind == "div":
            scale, bias = scale / c, bias / c
        else:
            raise ValueError(f"unknown epilogue step {step.kind!r}")
    return scale, bias


def _batch_norm(node: onnx.NodeProto | None, values: ConstantValues
                ) -> tuple[np.ndarray, np.ndarray]:
    if node is None:
        raise ValueError("a batch-norm step carries its node")
    gamma, beta, mean, var = (np.asarray(values.get(n), dtype=np.float64) for n in node.input[1:])
    epsilon = next((float(a.f) for a in node.attribute if a.name == "epsilon"), 1e-5)
    s = gamma / np.sqrt(var + np.float64(np.float32(epsilon)))
    return s, beta - mean * s


def _per_channel(anchor: Anchor, value: np.ndarray) -> np.ndarray:
    """A constant that broadcasts per channel, as a (K,) vector."""
    array = np.asarray(value, dtype=np.float64)
    rank = len(anchor.out_shape)
    padded = array.reshape((1,) * (rank - array.ndim) + array.shape)
    axis = anchor.channel_axis or 0
    target = tuple(anchor.channels if i == axis else 1 for i in range(rank))
    return np.broadcast_to(padded, target).reshape(anchor.channels)


def _f32(value: Any, shape: tuple[int, ...]) -> np.ndarray:
    array = np.asarray(value)
    if array.size != math.prod(shape):
        raise ModelError(f"a constant of shape {array.shape} cannot feed a kernel input {shape}")
    return np.ascontiguousarray(array.reshape(shape), dtype=np.float32)
