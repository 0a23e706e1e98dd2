"""2-D max and average pooling of a blocked activation (NCHW[b]c), ``blocked_pool2d``.

The plain ``Pool2d`` walks output columns as SIMD; in the blocked layout the ``b`` channels of
one pixel are contiguous, so every tap of a window is one vector load of ``b`` lanes and a
window is a tree of vector maxima (or sums) whatever the stride. The window semantics are
``Pool2d``'s (the op holds one and checks its attributes there): padding never wins a max, an
average divides by the taps inside the image (or the padded frame with ``count_include_pad``).
Windows wholly inside the image take every tap unchecked; the others check each tap (a test on
the pixel, the same for every lane). Threads share (image, channel block, output row).

The padded lanes of the last channel block are pooled like the others: finite in, finite out
(``frontend.layout`` keeps them finite), so the output is a blocked tensor like any other.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Expr,
    IfThen,
    Kernel,
    LoopKind,
    Scope,
    Stmt,
    binop,
    fmax,
    loop,
    store,
)
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import fconst, flat, kernel_name, tree, want_parallel
from schedule_templates.ops.pool import (
    _LOWEST,
    _MAX_TREE_TAPS,
    Pool2d,
    _add,
    _all,
    _interior,
)
from schedule_templates.workloads.conv_nchwc import channel_blocks, from_blocked, to_blocked


@register_op
@dataclasses.dataclass(frozen=True)
class BlockedPool2d(GeneratedOp):
    """``Pool2d`` of the plain NCHW ``shape``, on its blocked layout ``[N][C/b][H][W][b]``."""

    kind = "blocked_pool2d"
    shape: Shape
    mode: str
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool
    block: int

    def __post_init__(self) -> None:
        if not isinstance(self.block, int) or isinstance(self.block, bool) or not (
                1 <= self.block <= 16):
            raise GeneratedOpError(f"blocked_pool2d: block must be 1 to 16 lanes, got "
                                   f"{self.block!r}")
        self.plain  # noqa: B018 (Pool2d checks the shape and the window attributes)

    @functools.cached_property
    def plain(self) -> Pool2d:
        return Pool2d(self.shape, self.mode, self.kernel, self.stride, self.pads,
                      self.dilation, self.ceil_mode, self.count_include_pad)

    def _blocked(self, shape: Shape) -> Shape:
        n, c, h, w = shape
        return (n, channel_blocks(c, self.block), h, w, self.block)

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": self._blocked(self.shape)}

    def output_shape(self) -> Shape:
        return self._blocked(self.plain.output_shape())

    def lower(self) -> Kernel:
        n, cb, h, w, b = self.input_shapes()["x"]
        oh, ow = self.output_shape()[2:4]
        x, out = flat("x", (n, cb, h, w, b)), flat("out", self.output_shape())
        rows = _interior(h, oh, self.kernel[0], self.stride[0], self.pads[0], self.dilation[0])
        cols = _interior(w, ow, self.kernel[1], self.stride[1], self.pads[1], self.dilation[1])
        work = n * cb * oh * ow * b
        i, rows_loop = loop("nco", n * cb * oh, LoopKind.PARALLEL if want_parallel(
            work, n * cb * oh) else LoopKind.SERIAL)
        plane, row = i // oh, i % oh
        xo, oo = plane * (h * w * b), plane * (oh * ow * b)
        fast = self.kernel[0] * self.kernel[1] <= _MAX_TREE_TAPS and cols[1] > cols[0]
        if not fast or rows[1] <= rows[0]:
            return self._kernel(x, out, rows_loop(self._checked(x, out, xo, oo, row, (0, ow))))
        interior = binop("and", row >= rows[0], row < rows[1])
        inside_row = [*self._checked(x, out, xo, oo, row, (0, cols[0])),
                      *self._unchecked(x, out, xo, oo, row, cols),
                      *self._checked(x, out, xo, oo, row, (cols[1], ow))]
        edge_row = self._checked(x, out, xo, oo, row, (0, ow))
        return self._kernel(x, out, rows_loop(IfThen(interior, tuple(inside_row)),
                                              IfThen(binop("==", interior, 0),
                                                     tuple(edge_row))))

    def _kernel(self, x: Buffer, out: Buffer, body: Stmt) -> Kernel:
        return Kernel(kernel_name(self.kind, self.key), (x, out), (), (body,))

    def _combine(self) -> Callable[[Expr, Expr], Expr]:
        return fmax if self.mode == "max" else _add

    def _tap(self, x: Buffer, xo: Expr, row: Expr, col: Expr, i: Expr | int, j: Expr | int,
             lane: Expr) -> tuple[Expr, Expr, Expr]:
        """(input row, input column, the tap's lane) of window (row, col)'s tap (i, j)."""
        (sh, sw), (dh, dw) = self.stride, self.dilation
        w, b = self.shape[3], self.block
        ih, iw = row * sh - self.pads[0] + i * dh, col * sw - self.pads[1] + j * dw
        return ih, iw, x[xo + (ih * w + iw) * b + lane]

    def _unchecked(self, x: Buffer, out: Buffer, xo: Expr, oo: Expr, row: Expr,
                   cols: tuple[int, int]) -> list[Stmt]:
        """Windows wholly inside the image: every tap, one vector of lanes each."""
        (kh, kw), b, ow = self.kernel, self.block, self.output_shape()[3]
        c, cols_loop = loop("pc", cols[1] - cols[0])
        col = c + cols[0]
        lane, lanes = loop("pl", b, LoopKind.VECTORIZE)
        value = tree([self._tap(x, xo, row, col, ti, tj, lane)[2]
                      for ti in range(kh) for tj in range(kw)], self._combine())
        if self.mode == "avg":
            value = value * fconst(1.0 / (kh * kw))
        return [cols_loop(lanes(store(out[oo + (row * ow + col) * b + lane], value)))]

    def _checked(self, x: Buffer, out: Buffer, xo: Expr, oo: Expr, row: Expr,
                 cols: tuple[int, int]) -> list[Stmt]:
        """Windows that may reach past the image: each tap tested (per pixel, not per lane),
        the average's divisor counted as ``Pool2d`` counts it."""
        if cols[1] <= cols[0]:
            return []
        h, w = self.shape[2:]
        (kh, kw), b, ow = self.kernel, self.block, self.output_shape()[3]
        pt, pl, pb, pr = self.pads
        acc = Buffer("acc", (b,), Scope.LOCAL)
        count = Buffer("count", (1,), Scope.LOCAL)
        c, cols_loop = loop("bc", cols[1] - cols[0])
        col = c + cols[0]
        ti, taps_i = loop("ki", kh)
        tj, taps_j = loop("kj", kw)
        lane, lanes = loop("bl", b, LoopKind.VECTORIZE)
        ih, iw, value = self._tap(x, xo, row, col, ti, tj, lane)
        inside = _all(ih >= 0, ih < h, iw >= 0, iw < w)
        taps: list[Stmt] = [IfThen(inside, (lanes(store(acc[lane], self._combine()(
            acc[lane], value))),))]
        if self.mode == "avg":
            framed = _all(ih >= -pt, ih < h + pb, iw >= -pl, iw < w + pr)
            counted = framed if self.count_include_pad else inside
            taps.append(IfThen(counted, (store(count[0], count[0] + fconst(1.0)),)))
        start = fconst(_LOWEST if self.mode == "max" else 0.0)
        result = acc[lane] / count[0] if self.mode == "avg" else acc[lane]
        window = (lanes(store(acc[lane], start)), store(count[0], fconst(0.0)),
                  taps_i(taps_j(*taps)),
                  lanes(store(out[oo + (row * ow + col) * b + lane], result)))
        return [cols_loop(Allocate(acc, (Allocate(count, window),)))]

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """``Pool2d``'s reference over every lane (the padded ones too), blocked again."""
        x = np.asarray(inputs["x"], np.float32).reshape(self.input_shapes()["x"])
        n, cb, h, w, b = x.shape
        lanes = dataclasses.replace(self.plain, shape=(n, cb * b, h, w))
        pooled = lanes.reference({"x": from_blocked(x, cb * b)})
        return to_blocked(pooled, b)
