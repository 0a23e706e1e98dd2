"""Layout transforms between plain NCHW activations and the blocked NCHW[b]c layout.

``to_nchwc`` turns ``[N][C][spatial...]`` into ``[N][ceil(C/b)][spatial...][b]`` (the padded
channels of the last block zero); ``from_nchwc`` turns it back, dropping the padding. The
model compiler places them only where a producer and its consumer disagree on the layout (a
model input entering a blocked conv, a blocked activation reaching a Flatten or a Gemm).

Both are strided copies that walk their output in order (unit-stride vector stores) and gather
the source lane by lane: a blocked pixel's ``b`` channels are ``spatial`` apart in NCHW, and a
plain row's pixels are ``b`` apart in NCHW[b]c. Whole blocks are one nest, the partial last
block another (plus its zero lanes, for ``to_nchwc``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import Const, Kernel, Stmt, store
from schedule_templates.ops.base import GeneratedOp, GeneratedOpError, Shape, register_op
from schedule_templates.ops.loops import (
    Axis,
    Offsets,
    fconst,
    flat,
    kernel_name,
    nest,
    vector_split,
)
from schedule_templates.ops.movement import _check_dims, _copy
from schedule_templates.workloads.conv_nchwc import BLOCKS, from_blocked, to_blocked


@dataclasses.dataclass(frozen=True)
class _LayoutTransform(GeneratedOp):
    """The NCHW shape (``[N][C][spatial...]``) and the channel block ``b``."""

    shape: Shape
    block: int

    def __post_init__(self) -> None:
        _check_dims(self.kind, "shape", self.shape)
        if len(self.shape) < 2:
            raise GeneratedOpError(f"{self.kind}: shape {self.shape} has no channel axis")
        if self.block not in BLOCKS:
            raise GeneratedOpError(f"{self.kind}: block={self.block} is not one of "
                                   f"{', '.join(map(str, BLOCKS))}")

    @property
    def blocked_shape(self) -> Shape:
        n, c, *spatial = self.shape
        return (n, -(-c // self.block), *spatial, self.block)

    def _geometry(self) -> tuple[int, int, int, int, int]:
        """(images, channels, pixels per channel, whole blocks, channels in the last one)."""
        n, c, *spatial = self.shape
        whole, rest = divmod(c, self.block)
        return n, c, math.prod(spatial), whole, rest


@register_op
@dataclasses.dataclass(frozen=True)
class ToBlocked(_LayoutTransform):
    """NCHW -> NCHW[b]c, padded channels zero."""

    kind = "to_nchwc"

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": self.shape}

    def output_shape(self) -> Shape:
        return self.blocked_shape

    def lower(self) -> Kernel:
        n, c, hw, whole, rest = self._geometry()
        b, blocks = self.block, whole + (1 if rest else 0)
        x, out = flat("x", self.shape), flat("out", self.output_shape())
        image = (c * hw, blocks * hw * b)  # (src, dst) strides of one image
        body: list[Stmt] = []
        if whole:
            axes = [Axis(n, image), Axis(whole, (b * hw, hw * b)), Axis(hw, (1, b)),
                    Axis(b, (hw, 1))]
            body += _copy(x, out, axes, 0, 0, "w")
        if rest:
            axes = [Axis(n, image), Axis(hw, (1, b)), Axis(rest, (hw, 1))]
            body += _copy(x, out, axes, whole * b * hw, whole * hw * b, "p")
            lanes = b - rest

            def zeros(offsets: Offsets) -> list[Stmt]:
                return vector_split(lanes, 0, lambda pos, _: [
                    store(out[offsets[0] + pos], fconst(0.0))], name="zv")

            body += nest([Axis(n, (image[1],)), Axis(hw, (b,))],
                         (Const(whole * hw * b + rest),), zeros, parallel=False, name="z")
        return Kernel(kernel_name(self.kind, self.key), (x, out), (), tuple(body))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs["x"], np.float32).reshape(self.shape)
        return to_blocked(x, self.block)


@register_op
@dataclasses.dataclass(frozen=True)
class FromBlocked(_LayoutTransform):
    """NCHW[b]c -> NCHW, the padded channels of the last block dropped."""

    kind = "from_nchwc"

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": self.blocked_shape}

    def output_shape(self) -> Shape:
        return self.shape

    def lower(self) -> Kernel:
        n, c, hw, whole, rest = self._geometry()
        b, blocks = self.block, whole + (1 if rest else 0)
        x, out = flat("x", self.blocked_shape), flat("out", self.shape)
        image = (blocks * hw * b, c * hw)
        body: list[Stmt] = []
        if whole:
            axes = [Axis(n, image), Axis(whole, (hw * b, b * hw)), Axis(b, (1, hw)),
                    Axis(hw, (b, 1))]
            body += _copy(x, out, axes, 0, 0, "w")
        if rest:
            axes = [Axis(n, image), Axis(rest, (1, hw)), Axis(hw, (b, 1))]
            body += _copy(x, out, axes, whole * hw * b, whole * b * hw, "p")
        return Kernel(kernel_name(self.kind, self.key), (x, out), (), tuple(body))

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        x = np.asarray(inputs["x"], np.float32).reshape(self.blocked_shape)
        return from_blocked(x, self.shape[1])
