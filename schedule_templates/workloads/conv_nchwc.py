"""Convolutions on blocked activations: ``conv2d_nchwc`` and ``depthwise_conv2d_nchwc``.

A blocked activation ``NCHW[b]c`` is stored as ``[N][ceil(C/b)][H][W][b]``: the ``b`` channels
of one pixel are contiguous, so a kernel holding a vector of ``b`` output channels stores it with
one vector store, and reads the ``b`` input channels of a pixel from one cache line. Channel
counts that are not a multiple of ``b`` are padded up; the padded lanes of an input are ignored
(the packed weights are zero there) and the padded lanes of an output hold the epilogue of a
zero accumulator (``act(0 * scale + bias + residual)`` with the padded constants), a finite
value no consumer reads as a real channel.

``b`` is a key parameter (``block=8`` on AVX2 hosts, ``block=16`` on AVX-512 ones), and each
operator has its own name, so records of different layouts and blocks never mix with the NCHW
operators' records. Weights keep their ONNX shape (``[K][C][R][S]``, ``[C][1][R][S]``); the
per-channel epilogue constants (``scale``, ``bias``) are padded to ``ceil(K/b) * b`` and the
residual is blocked like the output.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads.base import Shape, register
from schedule_templates.workloads.conv import (
    _CONV_PARAMS,
    _EPILOGUE_PARAM,
    _WINDOW_PARAMS,
    Conv2d,
    DepthwiseConv2d,
    _Window,
)
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue

#: channel blocks a workload may name: SSE, AVX2 and AVX-512 vectors of fp32
BLOCKS = (4, 8, 16)


def channel_blocks(channels: int, block: int) -> int:
    """Blocks of ``block`` channels that hold ``channels`` (the last one padded)."""
    return -(-channels // block)


def to_blocked(x: np.ndarray, block: int) -> np.ndarray:
    """NCHW (any trailing spatial rank) -> ``[N][C/b][...][b]``, padded channels zero."""
    x = np.asarray(x, dtype=np.float32)
    n, c = x.shape[:2]
    cb = channel_blocks(c, block)
    padded = np.zeros((n, cb * block, *x.shape[2:]), dtype=np.float32)
    padded[:, :c] = x
    spatial = padded.reshape(n, cb, block, *x.shape[2:])
    return np.ascontiguousarray(np.moveaxis(spatial, 2, -1))


def from_blocked(x: np.ndarray, channels: int) -> np.ndarray:
    """``[N][C/b][...][b]`` -> NCHW with the first ``channels`` channels (padding dropped)."""
    x = np.asarray(x, dtype=np.float32)
    n, cb, block = x.shape[0], x.shape[1], x.shape[-1]
    merged = np.moveaxis(x, -1, 2).reshape(n, cb * block, *x.shape[2:-1])
    return np.ascontiguousarray(merged[:, :channels])


@dataclasses.dataclass(frozen=True)
class BlockedWindow(_Window):
    """What the blocked convolutions share: the block, shapes and the epilogue's reference."""

    block: int = 0
    epilogue: Epilogue = NO_EPILOGUE

    constant_inputs: ClassVar[tuple[str, ...]] = ("weight", "scale", "bias")

    @property
    def out_channels(self) -> int:
        """Channels of the output (before padding to whole blocks)."""
        return self.C

    @property
    def blocks_in(self) -> int:
        return channel_blocks(self.C, self.block)

    @property
    def blocks_out(self) -> int:
        return channel_blocks(self.out_channels, self.block)

    def validate(self) -> None:
        super().validate()
        if self.block not in BLOCKS:
            raise InvalidWorkloadError(
                f"{self.op}: block={self.block} is not one of "
                f"{', '.join(map(str, BLOCKS))}")

    def output_shape(self) -> Shape:
        return (self.N, self.blocks_out, self.out_h, self.out_w, self.block)

    def _epilogue_shapes(self) -> dict[str, Shape]:
        epilogue = self.epilogue
        padded = (self.N, self.blocks_out * self.block, self.out_h, self.out_w)
        shapes = epilogue.input_shapes(padded)
        if "residual" in shapes:
            shapes["residual"] = self.output_shape()
        return shapes

    def _finish(self, out: np.ndarray, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Block an NCHW result of the real channels and apply the epilogue on every lane."""
        block, epilogue = self.block, self.epilogue
        padded = from_blocked(to_blocked(out, block), self.blocks_out * block)
        extra: dict[str, np.ndarray] = {k: inputs[k] for k in ("scale", "bias") if k in inputs}
        if epilogue.residual:
            extra["residual"] = from_blocked(inputs["residual"], self.blocks_out * block)
        return to_blocked(epilogue.apply(padded, extra), block)

    @abstractmethod
    def plain(self) -> _Window:
        """The same convolution on NCHW activations, without the epilogue."""

    def flops(self) -> int:
        return self.plain().flops()

    def plain_data(self, data: np.ndarray) -> np.ndarray:
        """The NCHW activations of the ``data`` input as the kernel receives it."""
        return from_blocked(data, self.C)

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        data = self.plain_data(inputs["data"])
        out = self.plain().reference({"data": data,
                                      "weight": np.asarray(inputs["weight"], np.float32)})
        return self._finish(out, inputs)

    def _blocked_describe(self, text: str) -> str:
        """``text`` (the NCHW operator's words) with the layout named before any epilogue."""
        return f"{text} (NCHW{self.block}c){self._fused()}"


@register
@dataclasses.dataclass(frozen=True)
class Conv2dNCHWc(BlockedWindow):
    """``conv2d`` with blocked input and output: ``data [N][C/b][H][W][b]`` ->
    ``out [N][K/b][OH][OW][b]``; the weight stays ``[K][C][R][S]``."""

    K: int = 0
    #: ``nchw``: the input is plain NCHW (a layer with a fraction of a block of input channels
    #: on a feature map, ``reads_plain``): an RGB stem blocked to 16 channels would read and
    #: write 16/3 times its bytes, and its ``to_nchwc`` transform cost as much as the stem
    in_layout: str = "blocked"

    op: ClassVar[str] = "conv2d_nchwc"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        "K": ("int", None),
        **_WINDOW_PARAMS,
        "in_layout": ("choice", "blocked"),
        "block": ("int", None),
        **_EPILOGUE_PARAM,
    }
    choices: ClassVar[dict[str, tuple[str, ...]]] = {"in_layout": ("blocked", "nchw")}
    examples: ClassVar[tuple[str, ...]] = (
        "conv2d_nchwc:N=1,C=11,H=9,W=10,K=20,R=3,S=3,pad=1,block=8",
        "conv2d_nchwc:N=1,C=16,H=7,W=7,K=24,R=1,S=1,block=8",
        "conv2d_nchwc:N=2,C=5,H=13,W=11,K=12,R=3,S=3,stride=2,pad=1,block=8",
        "conv2d_nchwc:N=1,C=20,H=9,W=9,K=17,R=1,S=1,stride=2,block=16",
        "conv2d_nchwc:N=1,C=3,H=15,W=15,K=16,R=7,S=7,stride=2,pad=3,block=16",
        "conv2d_nchwc:N=1,C=3,H=17,W=16,K=20,R=3,S=3,stride=2,pad=1,in_layout=nchw,block=8",
        "conv2d_nchwc:N=2,C=2,H=9,W=11,K=16,R=3,S=2,in_layout=nchw,block=16",
    )

    @property
    def out_channels(self) -> int:
        return self.K

    def validate(self) -> None:
        super().validate()
        if self.plain_in and self.block < self.C:
            raise InvalidWorkloadError(
                f"conv2d_nchwc: in_layout=nchw needs at most one block of input channels "
                f"(C={self.C}, block={self.block})")

    @property
    def plain_in(self) -> bool:
        """Whether the kernel reads NCHW activations (``in_layout=nchw``)."""
        return self.in_layout == "nchw"

    def plain_data(self, data: np.ndarray) -> np.ndarray:
        return np.asarray(data, np.float32) if self.plain_in else from_blocked(data, self.C)

    def plain(self) -> Conv2d:
        return Conv2d(self.N, self.C, self.H, self.W, self.R, self.S, self.stride, self.pad,
                      self.dilation, self.K)

    def input_shapes(self) -> dict[str, Shape]:
        data = ((self.N, self.C, self.H, self.W) if self.plain_in
                else (self.N, self.blocks_in, self.H, self.W, self.block))
        return {"data": data,
                "weight": (self.K, self.C, self.R, self.S),
                **self._epilogue_shapes()}

    def describe(self) -> str:
        text = self.plain().describe().replace("conv2d", "blocked conv2d", 1)
        return self._blocked_describe(f"{text} from NCHW" if self.plain_in else text)


@register
@dataclasses.dataclass(frozen=True)
class DepthwiseConv2dNCHWc(BlockedWindow):
    """``depthwise_conv2d`` (multiplier 1) with blocked input and output: each lane of a pixel
    vector is one channel; the weight stays ``[C][1][R][S]``."""

    op: ClassVar[str] = "depthwise_conv2d_nchwc"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        **_WINDOW_PARAMS,
        "block": ("int", None),
        **_EPILOGUE_PARAM,
    }
    examples: ClassVar[tuple[str, ...]] = (
        "depthwise_conv2d_nchwc:N=1,C=12,H=7,W=7,R=3,S=3,pad=1,block=8",
        "depthwise_conv2d_nchwc:N=1,C=20,H=13,W=11,R=3,S=3,stride=2,pad=1,block=8",
        "depthwise_conv2d_nchwc:N=2,C=8,H=9,W=9,R=5,S=5,pad=2,block=8",
        "depthwise_conv2d_nchwc:N=1,C=24,H=10,W=9,R=3,S=3,stride=2,pad=0x1x1x0,block=16",
        "depthwise_conv2d_nchwc:N=1,C=5,H=6,W=8,R=3,S=2,dilation=2x1,block=4",
    )

    def plain(self) -> DepthwiseConv2d:
        return DepthwiseConv2d(self.N, self.C, self.H, self.W, self.R, self.S, self.stride,
                               self.pad, self.dilation)

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.blocks_in, self.H, self.W, self.block),
                "weight": (self.C, 1, self.R, self.S),
                **self._epilogue_shapes()}

    def describe(self) -> str:
        return self._blocked_describe(self.plain().describe().replace(
            "depthwise conv2d", "blocked depthwise conv2d", 1))
