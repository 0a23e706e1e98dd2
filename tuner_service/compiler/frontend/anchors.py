"""Anchors of the layer plan: a Conv, Gemm or MatMul node as a kernel call.

An ``Anchor`` says which workload computes the node, which ONNX tensors feed the kernel's
inputs as they are, which input must be computed (a transposed or scaled weight), and what the
node itself adds to the epilogue (a Conv bias, a Gemm's ``beta * C``). It also answers the
shape questions fusion asks about the anchor's output.
"""

from __future__ import annotations

import dataclasses

import onnx

from schedule_templates.workloads import Workload
from tuner_service.compiler.frontend.attributes import attr_float, attr_int
from tuner_service.compiler.frontend.conv import map_conv
from tuner_service.compiler.frontend.errors import UnmappableNode
from tuner_service.compiler.frontend.folding import Step, WeightRecipe
from tuner_service.compiler.frontend.graph import GraphIndex
from tuner_service.compiler.frontend.matmul import map_gemm, map_matmul


@dataclasses.dataclass
class Anchor:
    workload: Workload
    #: kernel input name -> ONNX tensor feeding it unchanged (up to a reshape)
    inputs: dict[str, str]
    #: a kernel input computed from a constant (transposed and/or scaled)
    weight: WeightRecipe | None
    #: the ONNX shape of the anchor's output and its channel axis (None: no epilogue possible)
    out_shape: tuple[int, ...]
    channel_axis: int | None
    steps: list[Step] = dataclasses.field(default_factory=list)
    residual: Step | None = None

    @property
    def fusable(self) -> bool:
        return self.channel_axis is not None and "epilogue" in type(self.workload).params

    @property
    def channels(self) -> int:
        return self.out_shape[self.channel_axis or 0]

    def _shape(self, name: str, info: GraphIndex) -> tuple[int, ...] | None:
        try:
            info.require_float32(name, "operand")
            return info.static_shape(name, "operand")
        except UnmappableNode:
            return None

    def per_channel(self, name: str, info: GraphIndex, exact: bool = False) -> bool:
        """``name`` broadcasts onto the output as one value per channel (``exact``: is (K,))."""
        shape = self._shape(name, info)
        if shape is None or self.channel_axis is None:
            return False
        if exact:
            return shape == (self.channels,)
        if len(shape) > len(self.out_shape):
            return False
        padded = (1,) * (len(self.out_shape) - len(shape)) + shape
        return all(d == 1 or (axis == self.channel_axis and d == self.channels)
                   for axis, d in enumerate(padded))

    def broadcasts(self, name: str, info: GraphIndex) -> bool:
        """``name`` broadcasts onto the output without changing its shape."""
        shape = self._shape(name, info)
        if shape is None or len(shape) > len(self.out_shape):
            return False
        padded = (1,) * (len(self.out_shape) - len(shape)) + shape
        return all(d in (1, o) for d, o in zip(padded, self.out_shape, strict=True))

    def same_shape(self, name: str, info: GraphIndex) -> bool:
        return self._shape(name, info) == self.out_shape


def map_anchor(node: onnx.NodeProto, position: int, info: GraphIndex) -> Anchor | None:
    """The anchor for a Conv, Gemm or MatMul node; None for other operators.

    Raises UnmappableNode (or InvalidWorkloadError) when no kernel computes the node exactly.
    """
    builder = {"Conv": _conv, "Gemm": _gemm, "MatMul": _matmul}.get(node.op_type)
    return builder(node, info) if builder else None


def _output_shape(node: onnx.NodeProto, info: GraphIndex) -> tuple[int, ...]:
    return info.static_shape(node.output[0], "output")


def _weight(name: str, kernel_name: str, info: GraphIndex, transpose: bool = False,
            factor: float = 1.0) -> tuple[dict[str, str], WeightRecipe | None]:
    """Feed a weight as it is when possible, else a recipe that computes it at plan time."""
    if not transpose and factor == 1.0:
        return {kernel_name: name}, None
    if not info.is_constant(name):
        raise UnmappableNode(f"weight {name!r} would need a transpose at run time")
    return {}, WeightRecipe(kernel_name, name, transpose, factor)


def _conv(node: onnx.NodeProto, info: GraphIndex) -> Anchor:
    workload = map_conv(node, info)
    inputs, recipe = _weight(node.input[1], "weight", info)
    anchor = Anchor(workload, {"data": node.input[0], **inputs}, recipe,
                    _output_shape(node, info), channel_axis=1)
    bias = node.input[2] if len(node.input) > 2 else ""
    if bias:
        if not (info.is_constant(bias) and anchor.per_channel(bias, info, exact=True)):
            raise UnmappableNode(f"Conv bias {bias!r} is not a constant of one value per channel")
        anchor.steps.append(Step("add", bias, vector=True))
    return anchor


def _gemm(node: onnx.NodeProto, info: GraphIndex) -> Anchor:
    workload = map_gemm(node, info)
    a, b = node.input[0], node.input[1]
    c = node.input[2] if len(node.input) > 2 else ""
    beta = attr_float(node, "beta", 1.0)
    out_shape = _output_shape(node, info)
    if workload.op != "dense":
        if c and beta != 0.0:
            raise UnmappableNode("Gemm of two activations with a bias has no fused kernel")
        return Anchor(workload, {"x": a, "y": b}, None, out_shape, channel_axis=None)
    transpose = not attr_int(node, "transB", 0)
    inputs, recipe = _weight(b, "weight", info, transpose, attr_float(node, "alpha", 1.0))
    anchor = Anchor(workload, {"data": a, **inputs}, recipe, out_shape, channel_axis=1)
    if c and beta != 0.0:
        _gemm_bias(anchor, c, beta, info)
    return anchor


def _gemm_bias(anchor: Anchor, c: str, beta: float, info: GraphIndex) -> None:
    """``beta * C``: a per-column constant is a bias, anything else of the output's shape (or
    a constant broadcasting to it) is a residual."""
    if info.is_constant(c) and anchor.per_channel(c, info):
        anchor.steps.append(Step("add", c, factor=beta))
    elif info.is_constant(c) and anchor.broadcasts(c, info):
        anchor.residual = Step("residual", c, factor=beta)
    elif beta == 1.0 and anchor.same_shape(c, info):
        anchor.residual = Step("residual", c)
    else:
        raise UnmappableNode(f"Gemm input C {c!r} needs a broadcast the kernel does not do")


def _matmul(node: onnx.NodeProto, info: GraphIndex) -> Anchor:
    workload = map_matmul(node, info)
    a, b = node.input[0], node.input[1]
    out_shape = _output_shape(node, info)
    if workload.op != "dense":
        return Anchor(workload, {"x": a, "y": b}, None, out_shape, channel_axis=None)
    b_rank = len(info.static_shape(b, "input B"))
    if b_rank == 1:  # a matrix-vector product: the weight (K,) is already (1, K)
        return Anchor(workload, {"data": a, "weight": b}, None, out_shape, channel_axis=None)
    inputs, recipe = _weight(b, "weight", info, transpose=True)
    return Anchor(workload, {"data": a, **inputs}, recipe, out_shape,
                  channel_axis=len(out_shape) - 1)
