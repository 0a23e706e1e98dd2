"""The elementwise glue of int8 models: ``QuantizedBinary`` for additions and products of two
8-bit tensors (a ResNet block's shortcut, a bias, BERT's GELU), ``Quantize``
and ``Dequantize`` for a lone ``QuantizeLinear`` / ``DequantizeLinear`` with a per-tensor scale
(the conversions between int8 layers and the fp32 operators a quantized model keeps: attention,
softmax, layer norm, pooling).

The model compiler rewrites ``DequantizeLinear(a) +|* DequantizeLinear(b) [-> Relu] ->
QuantizeLinear`` into one node (``frontend/quantized_glue.py``); this is its kernel, and its
bytes equal ``reference`` (and the runner's numpy step) exactly. The addition of two tensors of
one shape without a Relu (a residual block's shortcut) is onnxruntime's own fused arithmetic
(``quant_add.FusedAdd``: two FMAs on the raw bytes), what onnxruntime runs for that pattern.
Everything else does the same fp32 operations in the same order as onnx's unfused evaluation:
each operand ``(float(x) - zero_point) * scale``, their sum (kept apart from the products: see
``lower``) or product, ``max(v, 0)`` for the Relu, then ``sum / y_scale`` clamped to the output
type's range less the zero point, rounded half to even, plus the zero point.

The operands are 8-bit (``uint8`` or ``int8``), of one shape (the model compiler leaves a
broadcasting add to numpy); scales and zero points are per tensor and part of the operator, so
they are compiled in as constants. One flat walk over the elements, in 16-lane pieces, threaded
over blocks when there is enough work. ``Quantize`` and ``Dequantize`` are the same operations
alone: ``QuantizeLinear`` is fp32 ``x / scale``, clamped, rounded half to even, plus the zero
point; ``DequantizeLinear`` is ``(float(x) - zero_point) * scale``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Kernel,
    LoopKind,
    Stmt,
    cast,
    fmax,
    fmin,
    intrinsic,
    loop,
    store,
)
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import BLOCK, kernel_name, vector_split, want_parallel
from schedule_templates.quant_add import RANGES, FusedAdd


@register_op
@dataclasses.dataclass(frozen=True)
class QuantizedBinary(GeneratedOp):
    kind = "int8_binary"
    size: int
    a_dtype: str
    a_scale: float
    a_zero_point: int
    b_dtype: str
    b_scale: float
    b_zero_point: int
    out_dtype: str
    y_scale: float
    y_zero_point: int
    relu: bool = False
    #: an operand of ``period`` elements repeated along the output (a bias vector added to
    #: every row): 0 none, else which one ("a" or "b")
    broadcast: str = ""
    period: int = 0
    #: "add" or "mul"
    operation: str = "add"

    def __post_init__(self) -> None:
        _check_size(self.kind, self.size)
        if self.operation not in ("add", "mul"):
            raise GeneratedOpError(f"int8_binary: operation must be add or mul, got "
                                   f"{self.operation!r}")
        if self.broadcast not in ("", "a", "b"):
            raise GeneratedOpError(f"int8_binary: broadcast must be '', 'a' or 'b', got "
                                   f"{self.broadcast!r}")
        if self.broadcast and not (isinstance(self.period, int) and self.period > 0
                                   and self.size % self.period == 0):
            raise GeneratedOpError(f"int8_binary: a broadcast operand's period {self.period!r} "
                                   f"must divide the size {self.size}")
        for side in ("a", "b", "out"):
            _check_dtype(self.kind, side, getattr(self, f"{side}_dtype"))
        for side, dtype in (("a", self.a_dtype), ("b", self.b_dtype), ("y", self.out_dtype)):
            _check_quantization(self.kind, f"{side}_", getattr(self, f"{side}_scale"),
                                getattr(self, f"{side}_zero_point"), dtype)

    def input_shapes(self) -> dict[str, Shape]:
        return {side: (self.period if self.broadcast == side else self.size,)
                for side in ("a", "b")}

    def input_dtypes(self) -> dict[str, str]:
        return {"a": self.a_dtype, "b": self.b_dtype}

    def output_shape(self) -> Shape:
        return (self.size,)

    @property
    def fused_add(self) -> FusedAdd | None:
        """onnxruntime's arithmetic, for the addition it fuses (same shapes, no Relu)."""
        if self.operation != "add" or self.relu or self.broadcast:
            return None
        return FusedAdd.of(self.a_scale, self.a_zero_point, self.b_scale, self.b_zero_point,
                           self.y_scale, self.y_zero_point)

    def lower(self) -> Kernel:
        shapes = self.input_shapes()
        a = Buffer("a", shapes["a"], dtype=self.a_dtype)
        b = Buffer("b", shapes["b"], dtype=self.b_dtype)
        out = Buffer("out", (self.size,), dtype=self.out_dtype)
        fused = self.fused_add

        def element(index: Expr, within: Expr) -> Expr:
            """Output ``index``; ``within`` its position in the broadcast operand's period."""
            ia = within if self.broadcast == "a" else index
            ib = within if self.broadcast == "b" else index
            if fused is not None:
                return fused.expr(a[ia], b[ib], self.out_dtype)
            x = _dequantized(a[ia], self.a_zero_point, self.a_scale)
            if self.operation == "mul":
                value = x * _dequantized(b[ib], self.b_zero_point, self.b_scale)
            else:
                # x - (-y), not x + y: the code generator contracts ``p * q + r`` into an FMA,
                # which rounds once where numpy rounds twice (seen: 79.49999 became 79.5 and
                # rounded to the next output step). Negating a product is exact.
                value = x - (_f32(self.b_zero_point) - cast("float32", b[ib])) * _f32(
                    self.b_scale)
            if self.relu:
                value = fmax(value, _f32(0.0))
            return _quantized(value, self.y_scale, self.y_zero_point, self.out_dtype)

        if not self.broadcast or self.period == 1:  # the same size, or a scalar
            return _flat_kernel(self, (a, b), out, lambda i: element(
                i, Const(0) if self.broadcast else i))
        rows = self.size // self.period
        kind = LoopKind.PARALLEL if want_parallel(self.size, rows) else LoopKind.SERIAL
        row, mk = loop("row", rows, kind)

        def lanes(j: Expr, _lane: Expr) -> list[Stmt]:
            index = row * self.period + j
            return [store(out[index], element(index, j))]

        body = mk(vector_split(self.period, 0, lanes))
        return Kernel(kernel_name(self.kind, self.key), (a, b, out), (), (body,))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        fused = self.fused_add
        if fused is not None:
            return fused.numpy(np.asarray(inputs["a"]).reshape(-1),
                               np.asarray(inputs["b"]).reshape(-1), self.out_dtype)
        a = _numpy_dequantized(inputs["a"], self.a_zero_point, self.a_scale)
        b = _numpy_dequantized(inputs["b"], self.b_zero_point, self.b_scale)
        rows = (-1, self.period if self.broadcast else self.size)
        combine = np.multiply if self.operation == "mul" else np.add
        value = combine(a.reshape(rows), b.reshape(rows)).reshape(-1)
        if self.relu:
            np.maximum(value, np.float32(0), out=value)
        return _numpy_quantized(value, self.y_scale, self.y_zero_point, self.out_dtype)


@register_op
@dataclasses.dataclass(frozen=True)
class Quantize(GeneratedOp):
    """``QuantizeLinear`` with a per-tensor scale and zero point: fp32 -> uint8 / int8."""

    kind = "quantize"
    size: int
    scale: float
    zero_point: int
    out_dtype: str

    def __post_init__(self) -> None:
        _check_size(self.kind, self.size)
        _check_dtype(self.kind, "out", self.out_dtype)
        _check_quantization(self.kind, "", self.scale, self.zero_point, self.out_dtype)

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": (self.size,)}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": "float32"}

    def output_shape(self) -> Shape:
        return (self.size,)

    def lower(self) -> Kernel:
        x = Buffer("x", (self.size,))
        out = Buffer("out", (self.size,), dtype=self.out_dtype)
        return _flat_kernel(self, (x,), out, lambda i: _quantized(
            x[i], self.scale, self.zero_point, self.out_dtype))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        value = np.asarray(inputs["x"], np.float32).reshape(-1)
        return _numpy_quantized(value, self.scale, self.zero_point, self.out_dtype)


@register_op
@dataclasses.dataclass(frozen=True)
class Dequantize(GeneratedOp):
    """``DequantizeLinear`` with a per-tensor scale and zero point: uint8 / int8 -> fp32."""

    kind = "dequantize"
    size: int
    in_dtype: str
    scale: float
    zero_point: int

    def __post_init__(self) -> None:
        _check_size(self.kind, self.size)
        _check_dtype(self.kind, "in", self.in_dtype)
        _check_quantization(self.kind, "", self.scale, self.zero_point, self.in_dtype)

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": (self.size,)}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": self.in_dtype}

    def output_shape(self) -> Shape:
        return (self.size,)

    def lower(self) -> Kernel:
        x = Buffer("x", (self.size,), dtype=self.in_dtype)
        out = Buffer("out", (self.size,))
        return _flat_kernel(self, (x,), out, lambda i: _dequantized(
            x[i], self.zero_point, self.scale))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        return _numpy_dequantized(inputs["x"], self.zero_point, self.scale)


@register_op
@dataclasses.dataclass(frozen=True)
class QuantizedTable(GeneratedOp):
    """``out[i] = table[x[i]]``: an 8-bit input's 256 values mapped by a table (the model
    compiler's ``Int8Table``, a unary chain between a DequantizeLinear and a
    QuantizeLinear). The table arrives as 256 int32 values, lowest input first."""

    kind = "int8_table"
    size: int
    in_dtype: str
    out_dtype: str

    def __post_init__(self) -> None:
        _check_size(self.kind, self.size)
        _check_dtype(self.kind, "in", self.in_dtype)
        _check_dtype(self.kind, "out", self.out_dtype)

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": (self.size,), "table": (256,)}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": self.in_dtype, "table": "int32"}

    def output_shape(self) -> Shape:
        return (self.size,)

    def lower(self) -> Kernel:
        x = Buffer("x", (self.size,), dtype=self.in_dtype)
        table = Buffer("table", (256,), dtype="int32")
        out = Buffer("out", (self.size,), dtype=self.out_dtype)
        low = RANGES[self.in_dtype][0]
        return _flat_kernel(self, (x, table), out, lambda i: cast(
            self.out_dtype, table[cast("int64", x[i]) - low]))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs["x"]).reshape(-1).astype(np.int64) - RANGES[self.in_dtype][0]
        return np.asarray(inputs["table"]).reshape(-1)[x].astype(self.out_dtype)


def _flat_kernel(op: GeneratedOp, ins: tuple[Buffer, ...], out: Buffer,
                 element: Callable[[Expr], Expr]) -> Kernel:
    """``out[i] = element(i)`` over the flat buffers: threaded over BLOCK-sized blocks when
    there is enough work, 16 lanes at a time, then the tail."""
    size = out.shape[0]

    def lanes(index: Expr, _lane: Expr) -> list[Stmt]:
        return [store(out[index], element(index))]

    blocks, tail = divmod(size, BLOCK)
    body: list[Stmt] = []
    if blocks:
        kind = LoopKind.PARALLEL if want_parallel(size, blocks) else LoopKind.SERIAL
        block, mk = loop("blk", blocks, kind)
        body.append(mk(vector_split(BLOCK, block * BLOCK, lanes)))
    if tail:
        body += vector_split(tail, blocks * BLOCK, lanes, name="t")
    return Kernel(kernel_name(op.kind, op.key), (*ins, out), (), tuple(body))


def _quantized(value: Expr, scale: float, zero_point: int, dtype: str) -> Expr:
    """fp32 ``value / scale`` clamped to the range less the zero point (clamping first is the
    same as saturating after: the bounds are whole numbers), rounded half to even, plus the
    zero point."""
    lo, hi = RANGES[dtype]
    scaled = value / _f32(scale)
    clamped = fmin(fmax(scaled, _f32(lo - zero_point)), _f32(hi - zero_point))
    rounded = cast("int32", intrinsic("roundeven", clamped))
    return cast(dtype, rounded + Const(zero_point, "int32"))


def _numpy_quantized(value: np.ndarray, scale: float, zero_point: int, dtype: str
                     ) -> np.ndarray:
    value = np.rint(value / np.float32(scale)) + np.float32(zero_point)
    lo, hi = RANGES[dtype]
    return np.clip(value, lo, hi).astype(dtype)


def _check_size(kind: str, size: object) -> None:
    if not isinstance(size, int) or size < 1:
        raise GeneratedOpError(f"{kind}: size must be a positive integer, got {size!r}")


def _check_dtype(kind: str, side: str, dtype: str) -> None:
    if dtype not in RANGES:
        raise GeneratedOpError(f"{kind}: {side} must be uint8 or int8, got {dtype!r}")


def _check_quantization(kind: str, side: str, scale: float, zero_point: object, dtype: str
                        ) -> None:
    if not (np.isfinite(scale) and scale > 0):
        raise GeneratedOpError(f"{kind}: {side}scale must be positive, got {scale!r}")
    lo, hi = RANGES[dtype]
    if not isinstance(zero_point, int) or not lo <= zero_point <= hi:
        raise GeneratedOpError(f"{kind}: {side}zero_point {zero_point!r} is outside {dtype}")


def _f32(value: float) -> Expr:
    return Const(float(np.float32(value)), "float32")


def _dequantized(value: Expr, zero_point: int, scale: float) -> Expr:
    return (cast("float32", value) - _f32(zero_point)) * _f32(scale)


def _numpy_dequantized(x: np.ndarray, zero_point: int, scale: float) -> np.ndarray:
    value = np.asarray(x).reshape(-1).astype(np.float32)
    value -= np.float32(zero_point)
    value *= np.float32(scale)
    return value
