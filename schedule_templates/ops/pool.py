"""2-D max and average pooling (ONNX MaxPool / AveragePool semantics) over NCHW.

Most output positions have their whole window inside the image; shapes are known when
lowering, so the rows and columns where that holds are computed then, and that interior is a
loop nest with every tap, no bounds checks, a constant divisor and SIMD along output columns
(unit-stride loads when the column stride is 1, lane-by-lane gathers otherwise). The thin
border around it is scalar code that checks each tap against the image, so padding never wins
a max, and counts the taps that make an average's divisor (the in-bounds ones, or with
``count_include_pad`` those inside the padded frame; a ceil-mode overhang beyond the frame
never counts). Channels are shared among threads.

``BytePool2d`` is the max pooling of an 8-bit tensor (a quantized model's MaxPool between a
DequantizeLinear and a QuantizeLinear of the same parameters runs on the bytes themselves: the
maximum commutes with a monotone dequantization, and quantizing a dequantized byte gives it
back): the same nest on uint8 or int8 values, compared in int32.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    IfThen,
    Kernel,
    Load,
    Scope,
    Stmt,
    binop,
    cast,
    fmax,
    loop,
    store,
)
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import (
    Axis,
    fconst,
    flat,
    kernel_name,
    local,
    nest,
    tree,
    vector_split,
    want_parallel,
)

#: more taps than this are folded row by row into the output instead of one expression
_MAX_TREE_TAPS = 64
_LOWEST = -3.4028234663852886e38  # -FLT_MAX: every window has a real tap, so it never wins


def _interior(size: int, out: int, k: int, stride: int, pad_head: int,
              dilation: int) -> tuple[int, int]:
    """Output positions [lo, hi) whose whole window lies inside the input (may be empty)."""
    lo = -(-pad_head // stride)
    hi = (size - 1 + pad_head - (k - 1) * dilation) // stride + 1
    lo, hi = min(lo, out), max(0, min(hi, out))
    return (lo, hi) if lo < hi else (0, 0)


def _check_windows(size: int, out: int, k: int, stride: int, pad_head: int,
                   dilation: int) -> None:
    for o in range(out):
        if not any(0 <= o * stride - pad_head + t * dilation < size for t in range(k)):
            raise GeneratedOpError(f"pool2d: output position {o} has a window entirely in the "
                                   "padding")


def _out_size(size: int, k: int, stride: int, head: int, tail: int, dilation: int,
              ceil_mode: bool) -> int:
    span = size + head + tail - ((k - 1) * dilation + 1)
    if span < 0:
        return 0
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + head:
        out -= 1  # the last window would start in the tail padding: dropped (ONNX, PyTorch)
    return out


def _ints(value: object, what: str, count: int, minimum: int) -> None:
    if not (isinstance(value, tuple) and len(value) == count and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value)):
        raise GeneratedOpError(f"pool2d: {what} must be {count} ints >= {minimum}, "
                               f"got {value!r}")


@register_op
@dataclasses.dataclass(frozen=True)
class Pool2d(GeneratedOp):
    kind = "pool2d"
    shape: Shape
    mode: str
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool

    def __post_init__(self) -> None:
        _ints(self.shape, "shape (NCHW)", 4, 1)
        if self.mode not in ("max", "avg"):
            raise GeneratedOpError(f"pool2d: mode must be 'max' or 'avg', got {self.mode!r}")
        _ints(self.kernel, "kernel", 2, 1)
        _ints(self.stride, "stride", 2, 1)
        _ints(self.pads, "pads", 4, 0)
        _ints(self.dilation, "dilation", 2, 1)
        if not isinstance(self.ceil_mode, bool) or not isinstance(self.count_include_pad, bool):
            raise GeneratedOpError("pool2d: ceil_mode and count_include_pad must be booleans")
        oh, ow = self.output_shape()[2:]
        if oh < 1 or ow < 1:
            raise GeneratedOpError(f"pool2d: a {self.kernel} window does not fit in "
                                   f"{self.shape} with pads {self.pads}")
        for axis in (0, 1):
            _check_windows(self.shape[2 + axis], (oh, ow)[axis], self.kernel[axis],
                           self.stride[axis], self.pads[axis], self.dilation[axis])

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": self.shape}

    def output_shape(self) -> Shape:
        n, c, h, w = self.shape
        return (n, c,
                _out_size(h, self.kernel[0], self.stride[0], self.pads[0], self.pads[2],
                          self.dilation[0], self.ceil_mode),
                _out_size(w, self.kernel[1], self.stride[1], self.pads[1], self.pads[3],
                          self.dilation[1], self.ceil_mode))

    def lower(self) -> Kernel:
        n, c, h, w = self.shape
        oh, ow = self.output_shape()[2:]
        x, out = self._flat("x", self.shape), self._flat("out", self.output_shape())
        rows = _interior(h, oh, self.kernel[0], self.stride[0], self.pads[0], self.dilation[0])
        cols = _interior(w, ow, self.kernel[1], self.stride[1], self.pads[1], self.dilation[1])

        def channel(offsets: tuple[Expr, ...]) -> list[Stmt]:
            xo, oo = offsets
            # an empty interior is (0, 0): then the bottom border is every row (column)
            stmts = self._border(x, out, xo, oo, (0, rows[0]), (0, ow))
            if rows[1] > rows[0]:
                r, mk_r = loop("oh", rows[1] - rows[0])
                row = r + rows[0]
                stmts.append(mk_r(
                    self._border(x, out, xo, oo, row, (0, cols[0])),
                    self._interior(x, out, xo, oo, row, cols),
                    self._border(x, out, xo, oo, row, (cols[1], ow))))
            stmts += self._border(x, out, xo, oo, (rows[1], oh), (0, ow))
            return stmts

        axis = Axis(n * c, (h * w, oh * ow))
        body = nest([axis], (Const(0), Const(0)), channel,
                    parallel=want_parallel(n * c * oh * ow, n * c), name="nc")
        return Kernel(kernel_name(self.kind, self.key), (x, out), (), tuple(body))

    def _combine(self) -> Callable[[Expr, Expr], Expr]:
        return fmax if self.mode == "max" else _add

    # hooks of the element type (BytePool2d: 8-bit values compared in int32)
    def _flat(self, name: str, shape: Shape) -> Buffer:
        return flat(name, shape)

    def _value(self, load: Expr) -> Expr:
        """A loaded element as the window combines it."""
        return load

    def _stored(self, value: Expr) -> Expr:
        """A window's result as the output holds it."""
        return value

    def _accumulator(self) -> tuple[Buffer, Expr]:
        """The border's running value and its start (below any element, for max)."""
        return local("acc", 1), fconst(_LOWEST if self.mode == "max" else 0.0)

    def _interior(self, x: Buffer, out: Buffer, xo: Expr, oo: Expr, row: Expr,
                  cols: tuple[int, int]) -> list[Stmt]:
        """Columns whose windows are wholly inside: every tap, no checks, SIMD along columns."""
        if cols[1] <= cols[0]:
            return []
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        w, ow = self.shape[3], self.output_shape()[3]
        combine = self._combine()
        scale = fconst(1.0 / (kh * kw))

        def tap_row(col: Expr, i: int | Expr) -> list[Expr]:
            base = xo + (row * sh - self.pads[0] + i * dh) * w + col * sw - self.pads[1]
            return [self._value(x[base + j * dw]) for j in range(kw)]

        def finish(value: Expr) -> Expr:
            return value * scale if self.mode == "avg" else self._stored(value)

        def target(col: Expr) -> Load:
            return out[oo + row * ow + col]

        start, length = cols[0], cols[1] - cols[0]
        if kh * kw <= _MAX_TREE_TAPS:
            return vector_split(length, start, lambda col, _: [store(target(col), finish(
                tree([ld for i in range(kh) for ld in tap_row(col, i)], combine)))])
        # a big window: fold it into the output one kernel row at a time
        stmts = vector_split(length, start, lambda col, _: [
            store(target(col), self._stored(tree(tap_row(col, 0), combine)))])
        i, mk_i = loop("kh", kh - 1)
        stmts.append(mk_i(vector_split(length, start, lambda col, _: [
            store(target(col), self._stored(combine(self._value(target(col)),
                                                    tree(tap_row(col, i + 1), combine))))])))
        if self.mode == "avg":
            stmts += vector_split(length, start, lambda col, _: [
                store(target(col), target(col) * scale)])
        return stmts

    def _border(self, x: Buffer, out: Buffer, xo: Expr, oo: Expr,
                rows: tuple[int, int] | Expr, cols: tuple[int, int]) -> list[Stmt]:
        """Output positions near the edges (``rows``: a range, or one row's index), one at a
        time, each tap checked against the image (and, for count_include_pad, the padded
        frame, for the divisor)."""
        if cols[1] <= cols[0] or (isinstance(rows, tuple) and rows[1] <= rows[0]):
            return []
        h, w = self.shape[2:]
        ow = self.output_shape()[3]
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        pt, pl, pb, pr = self.pads
        (acc, start), count = self._accumulator(), local("count", 1)
        if isinstance(rows, tuple):
            r, mk_r = loop("bh", rows[1] - rows[0])
            row = r + rows[0]
        else:
            row, mk_r = rows, None
        col_var, mk_c = loop("bw", cols[1] - cols[0])
        col = col_var + cols[0]
        i, mk_i = loop("ki", kh)
        j, mk_j = loop("kj", kw)
        ih, iw = row * sh - pt + i * dh, col * sw - pl + j * dw
        inside = _all(ih >= 0, ih < h, iw >= 0, iw < w)
        framed = _all(ih >= -pt, ih < h + pb, iw >= -pl, iw < w + pr)
        taps = [IfThen(inside, (store(acc[0], self._combine()(
            acc[0], self._value(x[xo + ih * w + iw]))),))]
        if self.mode == "avg":
            counted = framed if self.count_include_pad else inside
            taps.append(IfThen(counted, (store(count[0], count[0] + fconst(1.0)),)))
        result = acc[0] / count[0] if self.mode == "avg" else self._stored(acc[0])
        window = [store(acc[0], start),
                  store(count[0], fconst(0.0)), mk_i(mk_j(taps)),
                  store(out[oo + row * ow + col], result)]
        nest_: Stmt = mk_c(Allocate(acc, (Allocate(count, tuple(window)),)))
        return [mk_r(nest_) if mk_r is not None else nest_]

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs["x"], np.float64).reshape(self.shape)
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        pt, pl, pb, pr = self.pads
        h, w = self.shape[2:]
        oh, ow = self.output_shape()[2:]
        need_h = max(h + pt + pb, (oh - 1) * sh + (kh - 1) * dh + 1)
        need_w = max(w + pl + pr, (ow - 1) * sw + (kw - 1) * dw + 1)
        fill = -np.inf if self.mode == "max" else 0.0
        padded = np.full((*self.shape[:2], need_h, need_w), fill)
        padded[:, :, pt:pt + h, pl:pl + w] = x
        inside = np.zeros((need_h, need_w))
        if self.count_include_pad:
            inside[: h + pt + pb, : w + pl + pr] = 1.0
        else:
            inside[pt:pt + h, pl:pl + w] = 1.0
        acc = np.full((*self.shape[:2], oh, ow), fill)
        count = np.zeros((oh, ow))
        for i in range(kh):
            for j in range(kw):
                rows = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
                cols = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
                window = padded[:, :, rows, cols]
                acc = np.maximum(acc, window) if self.mode == "max" else acc + window
                count += inside[rows, cols]
        return (acc if self.mode == "max" else acc / count).astype(np.float32)


def _add(a: Expr, b: Expr) -> Expr:
    return a + b


def _all(*conditions: Expr) -> Expr:
    out = conditions[0]
    for cond in conditions[1:]:
        out = binop("and", out, cond)
    return out


@register_op
@dataclasses.dataclass(frozen=True)
class BytePool2d(Pool2d):
    """MaxPool of a uint8 or int8 tensor (``mode`` max, ``count_include_pad`` False)."""

    kind = "byte_pool2d"
    dtype: str = "uint8"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode != "max" or self.count_include_pad:
            raise GeneratedOpError("byte_pool2d: only max pooling of 8-bit values")
        if self.dtype not in ("uint8", "int8"):
            raise GeneratedOpError(f"byte_pool2d: dtype must be uint8 or int8, got "
                                   f"{self.dtype!r}")

    def input_dtypes(self) -> dict[str, str]:
        return {"x": self.dtype}

    def _flat(self, name: str, shape: Shape) -> Buffer:
        return Buffer(name, (max(1, math.prod(shape)),), dtype=self.dtype)

    def _value(self, load: Expr) -> Expr:
        return cast("int32", load)  # the IR compares integers signed: widen unsigned bytes

    def _stored(self, value: Expr) -> Expr:
        return cast(self.dtype, value)

    def _accumulator(self) -> tuple[Buffer, Expr]:
        return Buffer("acc", (1,), Scope.LOCAL, "int32"), Const(-129, "int32")

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        pooled = super().reference({"x": np.asarray(inputs["x"]).astype(np.float32)})
        return pooled.astype(self.dtype)
