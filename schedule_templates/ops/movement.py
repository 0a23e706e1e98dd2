"""Data movement: concat, strided slice and transpose as generated copy kernels.

All three are one strided copy: walk the output in order (so every store is unit-stride SIMD)
and read the source at per-axis strides: the concat offset, ``stride * step`` for a slice, the
permuted stride for a transpose. Axes that stay contiguous in both are merged first, so a
channel concat is a single long run per input, and a slice of whole rows is a block copy. Where
the source's innermost stride is 1 the loads are vector loads; otherwise (a transpose that
moves the last axis, a stepped slice) the generator gathers lane by lane; a transpose that
moves it walks the output in tiles of 16 lanes (``transpose_tiles``) so that the source lines it
gathers from stay in L1 (ConvNeXt's 56 x 56 x 96 NHWC -> NCHW: 0.227 -> 0.115 ms, the whole
model 44.28 -> 43.29 ms at one thread, Zen 5, paired). Outer loops (or blocks of a long run,
when the outer loops are too few) are shared among threads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from schedule_templates.ir.nodes import Buffer, Const, Expr, Kernel, Stmt, store
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import (
    Axis,
    collapse,
    flat,
    kernel_name,
    nest,
    row_major,
    split_long_inner,
    vector_split,
    want_parallel,
)


def _copy(src: Buffer, dst: Buffer, axes: list[Axis], src_base: int, dst_base: int,
          name: str) -> list[Stmt]:
    """dst[dst_base + sum(i * dst_stride)] = src[src_base + sum(i * src_stride)] over ``axes``
    (outermost first, strides as (src, dst))."""
    merged = collapse(axes) or [Axis(1, (0, 0))]
    outer, inner, tail = split_long_inner(merged[:-1], merged[-1])
    s_in, s_out = inner.strides
    bases = (Const(src_base), Const(dst_base))

    def walk(extent: int, start: int) -> Callable[[tuple[Expr, ...]], list[Stmt]]:
        def body(offsets: tuple[Expr, ...]) -> list[Stmt]:
            return vector_split(extent, start, lambda pos, _: [
                store(dst[offsets[1] + pos * s_out], src[offsets[0] + pos * s_in])],
                name=f"{name}v")

        return body

    work = math.prod(a.extent for a in merged)
    stmts = nest(outer, bases, walk(inner.extent, 0),
                 parallel=want_parallel(work, math.prod(a.extent for a in outer)), name=name)
    if tail is not None:
        stmts += nest(outer[:-1], bases, walk(tail[1], tail[0]), parallel=False,
                      name=f"{name}t")
    return stmts


#: output elements a transpose tile writes along its innermost axis (one vector of fp32)
TILE = 16


def transpose_tiles(axes: list[Axis]) -> list[Axis] | None:
    """A transpose that moves the source's contiguous axis (``axes`` collapsed, strides as
    (src, dst)), reordered into tiles: ``TILE`` outputs along the output's innermost axis,
    gathered from ``TILE`` source rows, for every step of the source's contiguous axis before
    the next tile. Walking whole output rows instead reads each source line once per output row
    (ConvNeXt's 56 x 56 x 96 NHWC -> NCHW: 3136 lines apart, out of L1). None where the copy is
    not such a transpose, or its inner extent is not a whole number of tiles."""
    if len(axes) < 2 or axes[-1].strides[0] == 1 or axes[-1].extent % TILE:
        return None
    inner = axes[-1]
    found = [i for i, ax in enumerate(axes[:-1]) if ax.strides[0] == 1]
    if not found or axes[found[0]].extent < 4:
        return None
    contiguous = found[0]
    others = [ax for i, ax in enumerate(axes[:-1]) if i != contiguous]
    tiles = Axis(inner.extent // TILE, tuple(s * TILE for s in inner.strides))
    return [*others, tiles, axes[contiguous], Axis(TILE, inner.strides)]


def _tiled_copy(src: Buffer, dst: Buffer, axes: list[Axis]) -> list[Stmt]:
    """The copy over ``transpose_tiles``' axes: one vector of ``TILE`` lanes innermost."""
    outer, inner = axes[:-1], axes[-1]
    s_in, s_out = inner.strides

    def body(offsets: tuple[Expr, ...]) -> list[Stmt]:
        return vector_split(inner.extent, 0, lambda pos, _: [
            store(dst[offsets[1] + pos * s_out], src[offsets[0] + pos * s_in])], name="tv")

    work = math.prod(a.extent for a in axes)
    return nest(outer, (Const(0), Const(0)), body,
                parallel=want_parallel(work, math.prod(a.extent for a in outer)), name="tt")


def _check_dims(kind: str, what: str, value: object, minimum: int = 1,
                length: int | None = None) -> None:
    if not isinstance(value, tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in value):
        raise GeneratedOpError(f"{kind}: {what} must be a tuple of ints >= {minimum}, "
                               f"got {value!r}")
    if length is not None and len(value) != length:
        raise GeneratedOpError(f"{kind}: {what} needs {length} entries, got {len(value)}")


@register_op
@dataclasses.dataclass(frozen=True)
class Concat(GeneratedOp):
    """Input k is (outer, widths[k]); the output (outer, sum(widths)) lays them side by side."""

    kind = "concat"
    outer: int
    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_dims(self.kind, "outer", (self.outer,))
        _check_dims(self.kind, "widths", self.widths)
        if not self.widths:
            raise GeneratedOpError("concat: at least one input is needed")

    def input_shapes(self) -> dict[str, Shape]:
        return {f"x{k}": (self.outer, w) for k, w in enumerate(self.widths)}

    def output_shape(self) -> Shape:
        return (self.outer, sum(self.widths))

    def lower(self) -> Kernel:
        total = sum(self.widths)
        ins = [flat(f"x{k}", (self.outer, w)) for k, w in enumerate(self.widths)]
        out = flat("out", self.output_shape())
        body: list[Stmt] = []
        offset = 0
        for k, (x, w) in enumerate(zip(ins, self.widths, strict=True)):
            axes = [Axis(self.outer, (w, total)), Axis(w, (1, 1))]
            body += _copy(x, out, axes, 0, offset, f"c{k}_")
            offset += w
        return Kernel(kernel_name(self.kind, self.key), (*ins, out), (), tuple(body))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        parts = [np.asarray(inputs[f"x{k}"], np.float32) for k in range(len(self.widths))]
        return np.concatenate(parts, axis=1)


@register_op
@dataclasses.dataclass(frozen=True)
class Slice(GeneratedOp):
    """output[i] = input[starts + i * steps] along every axis (steps >= 1)."""

    kind = "slice"
    shape: Shape
    starts: tuple[int, ...]
    steps: tuple[int, ...]
    out: Shape

    def __post_init__(self) -> None:
        _check_dims(self.kind, "shape", self.shape)
        rank = len(self.shape)
        _check_dims(self.kind, "starts", self.starts, 0, rank)
        _check_dims(self.kind, "steps", self.steps, 1, rank)
        _check_dims(self.kind, "out", self.out, 1, rank)
        for a, (d, s, st, o) in enumerate(zip(self.shape, self.starts, self.steps, self.out,
                                              strict=True)):
            if s + (o - 1) * st >= d:
                raise GeneratedOpError(f"slice: axis {a} reads index {s + (o - 1) * st} of "
                                       f"an axis of {d}")

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": self.shape}

    def output_shape(self) -> Shape:
        return self.out

    def lower(self) -> Kernel:
        x, out = flat("x", self.shape), flat("out", self.out)
        src, dst = row_major(self.shape), row_major(self.out)
        axes = [Axis(o, (s * st, d)) for o, s, st, d in zip(self.out, src, self.steps, dst,
                                                           strict=True)]
        base = sum(b * s for b, s in zip(self.starts, src, strict=True))
        return Kernel(kernel_name(self.kind, self.key), (x, out), (),
                      tuple(_copy(x, out, axes, base, 0, "s")))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs["x"], np.float32).reshape(self.shape)
        index = tuple(slice(s, s + (o - 1) * st + 1, st)
                      for s, st, o in zip(self.starts, self.steps, self.out, strict=True))
        return np.ascontiguousarray(x[index])


@register_op
@dataclasses.dataclass(frozen=True)
class Transpose(GeneratedOp):
    """output = input.transpose(perm), of fp32 or of an 8-bit or int32 type (``dtype``: a
    quantized model moves its uint8 activations, BERT's attention heads)."""

    kind = "transpose"
    shape: Shape
    perm: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        _check_dims(self.kind, "shape", self.shape)
        _check_dims(self.kind, "perm", self.perm, 0, len(self.shape))
        if sorted(self.perm) != list(range(len(self.shape))):
            raise GeneratedOpError(f"transpose: perm {self.perm} is not a permutation of "
                                   f"0..{len(self.shape) - 1}")
        if self.dtype not in _MOVED_TYPES:
            raise GeneratedOpError(f"transpose: dtype must be one of {', '.join(_MOVED_TYPES)}"
                                   f", got {self.dtype!r}")

    def to_json(self) -> dict[str, Any]:
        """Without ``dtype`` when it is fp32: the keys (and kernel names) of fp32 transposes
        stay what they were before the field existed."""
        data = super().to_json()
        if self.dtype == "float32":
            del data["dtype"]
        return data

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": self.shape}

    def input_dtypes(self) -> dict[str, str]:
        return {"x": self.dtype}

    def output_shape(self) -> Shape:
        return tuple(self.shape[p] for p in self.perm)

    def lower(self) -> Kernel:
        x = Buffer("x", (math.prod(self.shape),), dtype=self.dtype)
        out = Buffer("out", (math.prod(self.shape),), dtype=self.dtype)
        src, dst = row_major(self.shape), row_major(self.output_shape())
        axes = [Axis(self.shape[p], (src[p], d)) for p, d in zip(self.perm, dst, strict=True)]
        tiles = transpose_tiles(collapse(axes))
        body = _copy(x, out, axes, 0, 0, "t") if tiles is None else _tiled_copy(x, out, tiles)
        return Kernel(kernel_name(self.kind, self.key), (x, out), (), tuple(body))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs["x"], self.dtype).reshape(self.shape)
        return np.ascontiguousarray(x.transpose(self.perm))


#: element types a transpose moves (a copy: any type, byte-exact)
_MOVED_TYPES = ("float32", "uint8", "int8", "int32")
