"""2-D max and average pooling (ONNX MaxPool / AveragePool semantics) over NCHW.

Which taps of a window fall inside the image depends only on the output row (for kernel rows)
and the output column (for kernel columns), and all shapes are known when lowering. So output
rows are grouped into segments whose windows see the same kernel rows (the interior, and a few
border rows), and likewise columns; each (row segment, column segment) pair is a loop nest that
reads only its valid taps, with no bounds checks and, for averages, a constant divisor. Padding
therefore never wins a max, and an average divides by the in-bounds count (or the count inside
the padded frame with ``count_include_pad``). Output columns are walked as SIMD: unit-stride
loads when the column stride is 1, lane-by-lane gathers otherwise; channels are threaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import Buffer, Const, Expr, Kernel, Stmt, fmax, loop, store
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import (
    Axis,
    fconst,
    flat,
    kernel_name,
    nest,
    tree,
    vector_split,
    want_parallel,
)

#: more taps than this are folded row by row into the output instead of one expression
_MAX_TREE_TAPS = 64


@dataclasses.dataclass(frozen=True)
class _Segment:
    """Consecutive output positions whose windows see the same taps [first, last)."""

    start: int
    length: int
    first: int
    last: int
    count: int  # taps that count towards an average's divisor


def _segments(size: int, out: int, k: int, stride: int, pad_head: int, pad_tail: int,
              dilation: int, include_pad: bool) -> list[_Segment]:
    segs: list[_Segment] = []
    for o in range(out):
        pos = [o * stride - pad_head + t * dilation for t in range(k)]
        valid = [t for t, p in enumerate(pos) if 0 <= p < size]
        if not valid:
            raise GeneratedOpError(f"pool2d: output position {o} has a window entirely in the "
                                   "padding")
        framed = sum(1 for p in pos if -pad_head <= p < size + pad_tail)
        key = (valid[0], valid[-1] + 1, framed if include_pad else len(valid))
        prev = segs[-1] if segs else None
        if prev is not None and (prev.first, prev.last, prev.count) == key:
            segs[-1] = dataclasses.replace(prev, length=prev.length + 1)
        else:
            segs.append(_Segment(o, 1, *key))
    return segs


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
        self._rows()
        self._cols()

    def _rows(self) -> list[_Segment]:
        return _segments(self.shape[2], self.output_shape()[2], self.kernel[0], self.stride[0],
                         self.pads[0], self.pads[2], self.dilation[0], self.count_include_pad)

    def _cols(self) -> list[_Segment]:
        return _segments(self.shape[3], self.output_shape()[3], self.kernel[1], self.stride[1],
                         self.pads[1], self.pads[3], self.dilation[1], self.count_include_pad)

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
        x, out = flat("x", self.shape), flat("out", self.output_shape())
        rows, cols = self._rows(), self._cols()

        def channel(offsets: tuple[Expr, ...]) -> list[Stmt]:
            stmts: list[Stmt] = []
            for rs in rows:
                r, mk_r = loop("oh", rs.length)
                row = r + rs.start
                body = [s for cs in cols for s in self._window(x, out, offsets, row, rs, cs)]
                stmts.append(mk_r(body))
            return stmts

        axis = Axis(n * c, (h * w, oh * ow))
        body = nest([axis], (Const(0), Const(0)), channel,
                    parallel=want_parallel(n * c * oh * ow, n * c), name="nc")
        return Kernel(kernel_name(self.kind, self.key), (x, out), (), tuple(body))

    def _window(self, x: Buffer, out: Buffer, offsets: tuple[Expr, ...], row: Expr,
                rs: _Segment, cs: _Segment) -> list[Stmt]:
        """One output row's columns of segment ``cs``: combine the valid taps."""
        w = self.shape[3]
        ow = self.output_shape()[3]
        (sh, sw), (dh, dw), (pt, pl) = self.stride, self.dilation, self.pads[:2]
        xo, oo = offsets
        combine: Callable[[Expr, Expr], Expr] = fmax if self.mode == "max" else _add
        scale = fconst(1.0 / (rs.count * cs.count))

        def tap_row(col: Expr, i: int | Expr) -> list[Expr]:
            base = xo + (row * sh - pt + i * dh) * w + col * sw - pl
            return [x[base + j * dw] for j in range(cs.first, cs.last)]

        def finish(value: Expr) -> Expr:
            return value * scale if self.mode == "avg" else value

        def target(col: Expr) -> Expr:
            return oo + row * ow + col

        taps = (rs.last - rs.first) * (cs.last - cs.first)
        if taps <= _MAX_TREE_TAPS:
            def whole(col: Expr, _: Expr) -> list[Stmt]:
                loads = [ld for i in range(rs.first, rs.last) for ld in tap_row(col, i)]
                return [store(out[target(col)], finish(tree(loads, combine)))]

            return vector_split(cs.length, cs.start, whole)
        # a big window: fold it into the output one kernel row at a time
        stmts = vector_split(cs.length, cs.start, lambda col, _: [
            store(out[target(col)], tree(tap_row(col, rs.first), combine))])
        i, mk_i = loop("kh", rs.last - rs.first - 1)
        stmts.append(mk_i(vector_split(cs.length, cs.start, lambda col, _: [
            store(out[target(col)],
                  combine(out[target(col)], tree(tap_row(col, i + rs.first + 1), combine)))])))
        if self.mode == "avg":
            stmts += vector_split(cs.length, cs.start, lambda col, _: [
                store(out[target(col)], out[target(col)] * scale)])
        return stmts

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
