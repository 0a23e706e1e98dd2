"""Convolution workloads in NCHW: ``conv2d`` (groups = 1), ``depthwise_conv2d`` (groups = C)
and ``group_conv2d`` (any other number of groups dividing both channel counts).

Each is its own operator, so a key names one space: ``conv2d`` keys never carry a group count
and keep their meaning and config indices. All three may fuse an epilogue (bias, folded batch
norm, residual, ReLU/clip) on their output. A 1-D convolution is a 2-D one with ``H = 1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads.base import Shape, Workload, register
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue

_CONV_PARAMS: dict[str, tuple[str, Any]] = {
    "N": ("int", None),
    "C": ("int", None),
    "H": ("int", None),
    "W": ("int", None),
}
_WINDOW_PARAMS: dict[str, tuple[str, Any]] = {
    "R": ("int", None),
    "S": ("int", None),
    "stride": ("pair", (1, 1)),
    "pad": ("quad", (0, 0, 0, 0)),
    "dilation": ("pair", (1, 1)),
}
_EPILOGUE_PARAM: dict[str, tuple[str, Any]] = {"epilogue": ("epilogue", NO_EPILOGUE)}


@dataclasses.dataclass(frozen=True)
class _Window(Workload):
    """Shared geometry of a sliding-window operator."""

    N: int
    C: int
    H: int
    W: int
    R: int
    S: int
    stride: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]

    constant_inputs: ClassVar[tuple[str, ...]] = ("weight", "scale", "bias")

    @property
    def out_h(self) -> int:
        top, _, bottom, _ = self.pad
        return (self.H + top + bottom - self.dilation[0] * (self.R - 1) - 1) // self.stride[0] + 1

    @property
    def out_w(self) -> int:
        _, left, _, right = self.pad
        return (self.W + left + right - self.dilation[1] * (self.S - 1) - 1) // self.stride[1] + 1

    def validate(self) -> None:
        if self.out_h < 1 or self.out_w < 1:
            raise InvalidWorkloadError(
                f"{self.op}: a {self.R}x{self.S} window (dilation {self.dilation}) does not fit "
                f"a {self.H}x{self.W} input padded by {self.pad}"
            )
        if max(self.pad[0], self.pad[2]) >= self.dilation[0] * (self.R - 1) + 1 + self.H or max(
            self.pad[1], self.pad[3]
        ) >= self.dilation[1] * (self.S - 1) + 1 + self.W:
            raise InvalidWorkloadError(f"{self.op}: padding {self.pad} is larger than the input")

    def _windows(self, data: np.ndarray):  # type: ignore[no-untyped-def]
        """Yield (r, s, strided input view of shape N, C, OH, OW) for each kernel tap."""
        top, left, bottom, right = self.pad
        x = np.pad(data, ((0, 0), (0, 0), (top, bottom), (left, right)))
        sh, sw = self.stride
        dh, dw = self.dilation
        for r in range(self.R):
            for s in range(self.S):
                h0, w0 = r * dh, s * dw
                rows = slice(h0, h0 + sh * (self.out_h - 1) + 1, sh)
                cols = slice(w0, w0 + sw * (self.out_w - 1) + 1, sw)
                yield r, s, x[:, :, rows, cols]

    def _fused(self) -> str:
        epilogue = self.epilogue_spec
        return f", fused {epilogue.describe()}" if epilogue else ""

    def _geometry(self) -> str:
        text = f"{self.R}x{self.S}"
        if self.stride != (1, 1):
            text += f" stride {_pretty(self.stride)}"
        if any(self.pad):
            text += f" pad {_pretty(self.pad)}"
        if self.dilation != (1, 1):
            text += f" dilation {_pretty(self.dilation)}"
        return text


def _pretty(value: tuple[int, ...]) -> str:
    return str(value[0]) if len(set(value)) == 1 else "x".join(map(str, value))


class _Grouped(_Window):
    """A convolution whose C input and K output channels form ``groups`` equal groups: output
    channel k of group ``g = k // (K/groups)`` reads input channels ``g*C/groups ..
    (g+1)*C/groups - 1``; weight ``[K][C/groups][R][S]`` as in ONNX. The subclass declares the
    ``K`` and ``groups`` fields."""

    K: int
    groups: int

    @property
    def group_in(self) -> int:
        """Input channels per group."""
        return self.C // self.groups

    @property
    def group_out(self) -> int:
        """Output channels per group."""
        return self.K // self.groups

    def _check_groups(self) -> None:
        if self.C % self.groups or self.K % self.groups:
            raise InvalidWorkloadError(
                f"{self.op}: groups={self.groups} must divide the input channels "
                f"(C={self.C}) and the output channels (K={self.K})")

    def output_shape(self) -> Shape:
        return (self.N, self.K, self.out_h, self.out_w)

    def flops(self) -> int:
        """Multiply-adds times two (an int8 convolution's integer operations count alike, so
        that throughputs compare)."""
        return 2 * self.N * self.K * self.out_h * self.out_w * self.group_in * self.R * self.S

    def _grouped_sum(self, data: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """Each output channel's sum over its group's input channels and the window taps, as
        (N, K, pixels) in ``weight``'s dtype."""
        g, pixels = self.groups, self.out_h * self.out_w
        acc = np.zeros((self.N, g, self.group_out, pixels), dtype=weight.dtype)
        for r, s, window in self._windows(data):
            taps = weight[:, :, r, s].reshape(g, self.group_out, self.group_in)
            # (G, K/g, C/g) @ (N, G, C/g, pixels) -> (N, G, K/g, pixels)
            acc += np.matmul(taps, window.reshape(self.N, g, self.group_in, pixels))
        return acc.reshape(self.N, self.K, pixels)


@register
@dataclasses.dataclass(frozen=True)
class Conv2d(_Window):
    """``out[n,k,oh,ow] = sum_{c,r,s} data[n,c,oh*sh+r*dh-pt,ow*sw+s*dw-pl] * weight[k,c,r,s]``."""

    K: int = 0
    epilogue: Epilogue = NO_EPILOGUE

    op: ClassVar[str] = "conv2d"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        "K": ("int", None),
        **_WINDOW_PARAMS,
        **_EPILOGUE_PARAM,
    }

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.C, self.H, self.W),
                "weight": (self.K, self.C, self.R, self.S),
                **self.epilogue.input_shapes(self.output_shape())}

    def output_shape(self) -> Shape:
        return (self.N, self.K, self.out_h, self.out_w)

    def flops(self) -> int:
        return 2 * self.N * self.K * self.out_h * self.out_w * self.C * self.R * self.S

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        weight = inputs["weight"]
        out = np.zeros(self.output_shape(), dtype=np.float32)
        for r, s, window in self._windows(inputs["data"]):
            # (K, C) x (N, C, OH, OW) -> (K, N, OH, OW)
            partial = np.tensordot(weight[:, :, r, s], window, axes=([1], [1]))
            out += partial.transpose(1, 0, 2, 3)
        return self.epilogue.apply(out, inputs)

    def describe(self) -> str:
        return (
            f"conv2d {self.C}->{self.K} channels, {self.H}x{self.W} input, {self._geometry()}"
            + (f", batch {self.N}" if self.N != 1 else "") + self._fused()
        )


@register
@dataclasses.dataclass(frozen=True)
class DepthwiseConv2d(_Window):
    """Grouped convolution with groups = C; output channel ``c*multiplier + m`` reads channel c."""

    multiplier: int = 1
    epilogue: Epilogue = NO_EPILOGUE

    op: ClassVar[str] = "depthwise_conv2d"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        **_WINDOW_PARAMS,
        "multiplier": ("int", 1),
        **_EPILOGUE_PARAM,
    }

    def input_shapes(self) -> dict[str, Shape]:
        return {
            "data": (self.N, self.C, self.H, self.W),
            "weight": (self.C * self.multiplier, 1, self.R, self.S),
            **self.epilogue.input_shapes(self.output_shape()),
        }

    def output_shape(self) -> Shape:
        return (self.N, self.C * self.multiplier, self.out_h, self.out_w)

    def flops(self) -> int:
        return 2 * self.N * self.C * self.multiplier * self.out_h * self.out_w * self.R * self.S

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        weight = inputs["weight"][:, 0]
        out = np.zeros(self.output_shape(), dtype=np.float32)
        for r, s, window in self._windows(inputs["data"]):
            expanded = np.repeat(window, self.multiplier, axis=1)
            out += expanded * weight[None, :, r, s, None, None]
        return self.epilogue.apply(out, inputs)

    def describe(self) -> str:
        mult = f" x{self.multiplier}" if self.multiplier != 1 else ""
        return (
            f"depthwise conv2d {self.C} channels{mult}, {self.H}x{self.W} input, {self._geometry()}"
            + (f", batch {self.N}" if self.N != 1 else "") + self._fused()
        )


@register
@dataclasses.dataclass(frozen=True)
class GroupConv2d(_Grouped):
    """Grouped convolution (see ``_Grouped`` for the channel groups).

    ``groups = 1`` is ``conv2d`` and ``groups = C`` is ``depthwise_conv2d``: both are refused
    here so that every convolution has exactly one key."""

    K: int = 0
    groups: int = 0
    epilogue: Epilogue = NO_EPILOGUE

    op: ClassVar[str] = "group_conv2d"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        "K": ("int", None),
        **_WINDOW_PARAMS,
        "groups": ("int", None),
        **_EPILOGUE_PARAM,
    }
    examples: ClassVar[tuple[str, ...]] = (
        "group_conv2d:N=1,C=16,H=10,W=10,K=32,R=3,S=3,pad=1,groups=2",
        "group_conv2d:N=1,C=32,H=13,W=11,K=32,R=3,S=3,stride=2,pad=1,groups=4",
        "group_conv2d:N=2,C=16,H=9,W=11,K=24,R=3,S=2,stride=2x1,pad=0x1x2x0,dilation=2x1,"
        "groups=8",
        "group_conv2d:N=1,C=12,H=7,W=15,K=6,R=1,S=3,pad=0x1x0x1,groups=3",
        "group_conv2d:N=1,C=64,H=1,W=19,K=64,R=1,S=5,stride=2,pad=0x2x0x2,groups=16",
    )

    def validate(self) -> None:
        super().validate()
        if self.groups == 1:
            raise InvalidWorkloadError("group_conv2d: groups=1 is an ordinary conv2d")
        self._check_groups()
        if self.groups == self.C:
            raise InvalidWorkloadError(
                f"group_conv2d: groups=C={self.C} is a depthwise_conv2d with "
                f"multiplier={self.K // self.C}")

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.C, self.H, self.W),
                "weight": (self.K, self.group_in, self.R, self.S),
                **self.epilogue.input_shapes(self.output_shape())}

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        out = self._grouped_sum(inputs["data"], np.asarray(inputs["weight"], dtype=np.float32))
        return self.epilogue.apply(out.reshape(self.output_shape()), inputs)

    def describe(self) -> str:
        return (
            f"grouped conv2d {self.C}->{self.K} channels in {self.groups} groups, "
            f"{self.H}x{self.W} input, {self._geometry()}"
            + (f", batch {self.N}" if self.N != 1 else "") + self._fused()
        )
