"""``group_conv2d_nchwc``: a grouped convolution on blocked activations (NCHW[b]c in and out).

A register tile of the blocked template holds ``kbt`` output blocks (``kbt * b`` output
channels, one vector lane each) and reduces over input channel blocks. Its output channels read
only their own groups' input channels, so a tile needs only the input blocks those groups span,
provided group boundaries meet block boundaries. ``group_window`` says when they do: either the
tile covers whole groups whose input channels fill whole blocks (RegNet's groups of 8 channels
in blocks of 16: two groups a block, one input block a tile), or a group covers whole tiles and
its input channels fill whole blocks (ResNeXt's groups of 32 or more). The packed weights hold
zeros where a tile's input block carries another group's channels, so a tile over two groups of
8 does twice the useful multiply-adds; that is still whole vectors of 16 channels stored per
pixel, where the NCHW kernel with a layout transform on each side cost RegNet-Y-400MF a fifth of
its time.

A grouped layer whose groups do not meet the blocks (groups of 24 channels in blocks of 16)
stays plain (``group_conv2d``, NCHW). Weights keep their ONNX shape ``[K][C/groups][R][S]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads.base import Shape, register
from schedule_templates.workloads.conv import (
    _CONV_PARAMS,
    _EPILOGUE_PARAM,
    _WINDOW_PARAMS,
    GroupConv2d,
)
from schedule_templates.workloads.conv_nchwc import BlockedWindow


class GroupWindow(NamedTuple):
    """The input blocks a tile of output blocks reduces over: tile ``t`` (of ``kbt`` output
    blocks) reads ``span`` blocks from block ``(t // tiles_per_step) * step``."""

    span: int
    tiles_per_step: int
    step: int

    def start(self, tile: int) -> int:
        return (tile // self.tiles_per_step) * self.step

    def redundancy(self, block: int, group_in: int) -> float:
        """Multiply-adds a tile does per useful one (zeros for other groups' channels)."""
        return self.span * block / group_in


def group_window(C: int, K: int, groups: int, block: int, kbt: int) -> GroupWindow | None:
    """Where tiles of ``kbt`` output blocks find their input channels, or None when group
    boundaries do not meet block boundaries for that tile."""
    cg, kg, tile = C // groups, K // groups, kbt * block
    blocks_in, blocks_out = -(-C // block), -(-K // block)
    if blocks_out % kbt:
        return None
    window: GroupWindow | None = None
    if tile % kg == 0 and (tile // kg * cg) % block == 0:  # a tile covers whole groups
        span = tile // kg * cg // block
        window = GroupWindow(span, 1, span)
    elif kg % tile == 0 and cg % block == 0:  # a group covers whole tiles
        window = GroupWindow(cg // block, kg // tile, cg // block)
    if window is None or window.start(blocks_out // kbt - 1) + window.span > blocks_in:
        return None
    return window


@register
@dataclasses.dataclass(frozen=True)
class GroupConv2dNCHWc(BlockedWindow):
    """``group_conv2d`` with blocked input and output: ``data [N][C/b][H][W][b]`` ->
    ``out [N][K/b][OH][OW][b]``; the weight stays ``[K][C/groups][R][S]``."""

    K: int = 0
    groups: int = 0

    op: ClassVar[str] = "group_conv2d_nchwc"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        "K": ("int", None),
        **_WINDOW_PARAMS,
        "groups": ("int", None),
        "block": ("int", None),
        **_EPILOGUE_PARAM,
    }
    examples: ClassVar[tuple[str, ...]] = (
        "group_conv2d_nchwc:N=1,C=48,H=12,W=11,K=48,R=3,S=3,stride=2,pad=1,groups=6,block=16",
        "group_conv2d_nchwc:N=1,C=24,H=9,W=9,K=24,R=3,S=3,pad=1,groups=3,block=8",
        "group_conv2d_nchwc:N=2,C=40,H=7,W=10,K=40,R=3,S=3,pad=1,groups=5,block=16",
        "group_conv2d_nchwc:N=1,C=64,H=8,W=7,K=64,R=3,S=3,pad=1,groups=2,block=16",
        "group_conv2d_nchwc:N=1,C=16,H=6,W=9,K=32,R=1,S=3,pad=0x1x0x1,groups=2,block=8",
    )

    @property
    def out_channels(self) -> int:
        return self.K

    @property
    def group_in(self) -> int:
        return self.C // self.groups

    def window(self, kbt: int) -> GroupWindow | None:
        """Input blocks of a tile of ``kbt`` output blocks (None: not aligned)."""
        return group_window(self.C, self.K, self.groups, self.block, kbt)

    def validate(self) -> None:
        super().validate()
        self.plain().validate()
        if self.window(1) is None:
            raise InvalidWorkloadError(
                f"group_conv2d_nchwc: groups of {self.group_in} input and "
                f"{self.K // self.groups} output channels do not meet blocks of {self.block} "
                "channels (the layer stays group_conv2d in NCHW)")

    def plain(self) -> GroupConv2d:
        return GroupConv2d(self.N, self.C, self.H, self.W, self.R, self.S, self.stride, self.pad,
                           self.dilation, self.K, self.groups)

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.blocks_in, self.H, self.W, self.block),
                "weight": (self.K, self.group_in, self.R, self.S),
                **self._epilogue_shapes()}

    def describe(self) -> str:
        return self._blocked_describe(self.plain().describe().replace(
            "grouped conv2d", "blocked grouped conv2d", 1))
