"""Quantized convolution: ``conv2d_int8`` (u8 activations, s8 weights, s32 accumulation).

The computation of onnxruntime's QLinearConv (and of the QDQ ``DequantizeLinear -> Conv ->
QuantizeLinear`` pattern it fuses) with uint8 activations and symmetric int8 weights, in NCHW:

    acc[n,k,oh,ow] = sum_{c in group(k), r, s} (data[n,c,ih,iw] - data_zero_point) * weight[k,c,r,s]
                     (+ bias[k], int32, when ``bias=s32``)
    out = requantize(acc): fp32 ``acc * scale``, round half to even, + out zero point, saturate

with ``ih = oh*sh + r*dh - pad_top`` (likewise ``iw``). Padding stands for the real value 0, i.e.
the activation zero point, so padded taps add nothing to ``acc``. ``scale`` is
data_scale * weight_scale / out_scale per output channel (``scale=channel``) or per tensor;
``out=f32`` keeps the dequantized ``acc * scale`` (ConvInteger followed by a cast and a multiply).
The int32 bias is QLinearConv's: quantized with scale data_scale * weight_scale and added to the
accumulator before scaling, as onnxruntime does. Weights are ``[K][C/groups][R][S]`` as in ONNX;
``groups`` = 1 is an ordinary convolution and ``groups = C`` a depthwise one (``K = C * m``).

One operator for every group count (unlike fp32's three): a quantized model's layers are few
and the key already carries ``groups``; records of int8 and fp32 convolutions never mix since
the operator name is part of every key.

Parameters (the contract the ONNX front end builds keys from):
``N, C, H, W, K, R, S`` (ints), ``stride`` (pair), ``pad`` (quad: top, left, bottom, right),
``dilation`` (pair), ``groups`` (int, default 1), ``out`` in ``u8|s8|f32`` (default u8),
``scale`` in ``channel|tensor`` (default channel), ``bias`` in ``none|s32`` (default none),
``weights`` in ``full|narrow|sat16`` (default full; narrow: every weight within [-64, 64];
sat16: pairs of byte products summed on saturating 16 bits, onnxruntime's arithmetic without
VNNI, see ``lowp``: the window's values walked tap by tap, channel by channel, in pairs, i.e.
pairs of a tap's channels where a group has an even number; an odd number, as in an RGB stem,
pairs across taps and is taken by a single group only).
Inputs, in call order: ``data`` u8 [N,C,H,W], ``weight`` s8 [K,C/groups,R,S],
``data_zero_point`` u8 [1], ``scale`` f32 [K] or [1], ``bias`` int32 [K] (``bias=s32``),
``out_zero_point`` u8/s8 [1] (not for ``out=f32``). Output [N,K,OH,OW] of the ``out`` type.

``residual=u8|s8`` (default none) fuses the quantized shortcut addition that follows the layer
in a QDQ residual block (``Int8Add`` of the layer's 8-bit output, its first operand, and a
tensor of the output's shape, without a Relu) into the output stage, in onnxruntime's own
arithmetic (``quant_add.FusedAdd``): the requantized value ``q`` and ``residual`` (the
other operand, of the type the field names, which is also the sum's) give
``fma(q, ratio_a, fma(residual, ratio_b, constant))``, rounded half to even and saturated, with
``residual_add = [ratio_a, ratio_b, constant]`` (fp32, computed by ``FusedAdd.of`` from the
addition's scales and zero points). The bytes are those of the layer followed by the addition's
own kernel. Not for ``out=f32`` or depthwise layers.

``in_layout``, ``out_layout`` and ``residual_layout`` in ``nchw|nhwc`` (default nchw) give the
activations' layouts: ``nhwc`` holds a pixel's channels side by side (``data`` [N,H,W,C], the
output or the residual [N,OH,OW,K]), so a layer whose register holds 16 output channels of one pixel
stores it whole and a 1x1 layer reads its input as it lies (``frontend.quantized_layout``
keeps activations channels-last between int8 layers). Only for one group with ``K`` a
multiple of 16, and ``C`` of 4 for a channels-last input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.quant_add import FusedAdd
from schedule_templates.workloads.base import Shape, Workload, register
from schedule_templates.workloads.conv import _CONV_PARAMS, _WINDOW_PARAMS, _Grouped
from schedule_templates.workloads.lowp import (
    QUANT_CHOICES,
    QUANT_CONSTANTS,
    QUANT_NUMPY,
    QUANT_PARAMS,
    QUANT_RANGES,
    SUMS,
    can_saturate,
    quantized_inputs,
    quantized_shapes,
    requantize,
    saturated,
)

#: the activation layouts a ``conv2d_int8`` reads and writes
LAYOUTS = ("nchw", "nhwc")
#: the fused shortcut addition's inputs (``residual``)
RESIDUAL_INPUTS = ("residual", "residual_add")


@register
@dataclasses.dataclass(frozen=True)
class Conv2dInt8(_Grouped):
    """``out[n,k,oh,ow] = requantize(sum (data - zp) * weight (+ bias))``, u8 x s8 -> s32."""

    K: int = 0
    groups: int = 1
    out: str = "u8"
    scale: str = "channel"
    bias: str = "none"
    weights: str = "full"
    residual: str = "none"
    in_layout: str = "nchw"
    out_layout: str = "nchw"
    residual_layout: str = "nchw"

    op: ClassVar[str] = "conv2d_int8"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        "K": ("int", None),
        **_WINDOW_PARAMS,
        "groups": ("int", 1),
        **QUANT_PARAMS,
        "residual": ("choice", "none"),
        "in_layout": ("choice", "nchw"),
        "out_layout": ("choice", "nchw"),
        "residual_layout": ("choice", "nchw"),
    }
    choices: ClassVar[dict[str, tuple[str, ...]]] = {**QUANT_CHOICES,
                                                     "residual": ("none", "u8", "s8"),
                                                     "in_layout": LAYOUTS,
                                                     "out_layout": LAYOUTS,
                                                     "residual_layout": LAYOUTS}
    constant_inputs: ClassVar[tuple[str, ...]] = (*QUANT_CONSTANTS, "residual_add")
    examples: ClassVar[tuple[str, ...]] = (
        "conv2d_int8:N=1,C=8,H=7,W=9,K=16,R=3,S=3,pad=1",
        "conv2d_int8:N=1,C=12,H=6,W=5,K=20,R=1,S=1,out=s8,scale=tensor,bias=s32",
        "conv2d_int8:N=2,C=6,H=9,W=8,K=10,R=3,S=3,stride=2,pad=1,out=f32",
        "conv2d_int8:N=1,C=16,H=7,W=7,K=16,R=3,S=3,pad=1,groups=16,bias=s32",
        "conv2d_int8:N=1,C=8,H=8,W=6,K=12,R=3,S=2,stride=2x1,pad=0x1x1x0,groups=4",
        "conv2d_int8:N=1,C=8,H=6,W=7,K=24,R=1,S=1,bias=s32,residual=s8",
        "conv2d_int8:N=1,C=6,H=9,W=8,K=16,R=3,S=3,stride=2,pad=1,out=s8,residual=u8",
        "conv2d_int8:N=1,C=8,H=7,W=9,K=32,R=3,S=3,pad=1,bias=s32,in_layout=nhwc,"
        "out_layout=nhwc",
        "conv2d_int8:N=1,C=12,H=6,W=5,K=16,R=1,S=1,stride=2,residual=u8,out_layout=nhwc,"
        "residual_layout=nhwc",
        "conv2d_int8:N=1,C=16,H=5,W=6,K=32,R=1,S=1,residual=s8,out=s8,in_layout=nhwc,"
        "residual_layout=nhwc",
        "conv2d_int8:N=1,C=12,H=9,W=7,K=16,R=3,S=3,stride=2,pad=1,bias=s32,weights=narrow",
        "conv2d_int8:N=1,C=12,H=9,W=7,K=16,R=3,S=3,stride=2,pad=1,groups=2,weights=sat16",
        "conv2d_int8:N=1,C=8,H=7,W=9,K=32,R=3,S=3,pad=1,in_layout=nhwc,out_layout=nhwc,"
        "weights=narrow",
    )

    def validate(self) -> None:
        super().validate()
        self._check_groups()
        if self.residual != "none" and (self.out == "f32" or (self.groups == self.C
                                                                and self.groups > 1)):
            raise InvalidWorkloadError("conv2d_int8: a fused residual addition (residual=...) "
                                       "needs an 8-bit output and a non-depthwise layer")
        if self.residual_layout == "nhwc" and self.residual == "none":
            raise InvalidWorkloadError("conv2d_int8: residual_layout=nhwc needs a fused "
                                       "residual addition (residual=u8|s8)")
        if self.channels_last and (self.groups != 1 or self.K % 16):
            raise InvalidWorkloadError("conv2d_int8: channels-last activations (a layout "
                                       "nhwc) need one group and K a multiple of 16")
        if self.weights == "sat16" and self.group_in % 2 and self.channels_last:
            raise InvalidWorkloadError("conv2d_int8: weights=sat16 with an odd channel count "
                                       "(flat words) keeps NCHW activations")
        if self.weights == "sat16" and self.group_in % 2 and self.groups > 1:
            raise InvalidWorkloadError(
                "conv2d_int8: weights=sat16 sums pairs of a tap's input channels, so grouped "
                "layers need an even number per group (onnxruntime pairs an odd count across "
                "taps, which only a single group's flat words follow)")
        if self.in_layout == "nhwc" and self.C % 4:
            raise InvalidWorkloadError("conv2d_int8: a channels-last input (in_layout=nhwc) "
                                       "needs C a multiple of 4 (whole words of channels)")

    @property
    def channels_last(self) -> bool:
        """Whether any activation is channels-last (``nhwc``)."""
        return "nhwc" in (self.in_layout, self.out_layout, self.residual_layout)

    def residual_shape(self) -> Shape:
        if self.residual_layout == "nhwc":
            return (self.N, self.out_h, self.out_w, self.K)
        return (self.N, self.K, self.out_h, self.out_w)

    def output_shape(self) -> Shape:
        if self.out_layout == "nhwc":
            return (self.N, self.out_h, self.out_w, self.K)
        return super().output_shape()

    def base_workload(self) -> Workload:
        """The convolution without the fused addition: the same search space and operations
        (the addition changes only the output stage), so the same records serve both."""
        return self if self.residual == "none" else dataclasses.replace(
            self, residual="none", residual_layout="nchw")

    def input_shapes(self) -> dict[str, Shape]:
        data = ((self.N, self.H, self.W, self.C) if self.in_layout == "nhwc"
                else (self.N, self.C, self.H, self.W))
        shapes = quantized_shapes(data,
                                  (self.K, self.group_in, self.R, self.S), self.K, self.scale,
                                  self.bias, self.out)
        if self.residual != "none":
            shapes.update(residual=self.residual_shape(), residual_add=(3,))
        return shapes

    def accumulate(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The exact int32 accumulators, bias included (fp64 sums of integers far below
        2**53 are exact), in the output's layout."""
        zp = float(np.asarray(inputs["data_zero_point"]).reshape(-1)[0])
        data = np.asarray(inputs["data"], dtype=np.float64).reshape(self.input_shapes()["data"])
        if self.in_layout == "nhwc":
            data = data.transpose(0, 3, 1, 2)
        centered = data - zp  # padding adds 0
        total = self._grouped_sum(centered, np.asarray(inputs["weight"], dtype=np.float64))
        if self.weights == "sat16":
            total = total + self._sat16_correction(centered, zp, np.asarray(inputs["weight"]))
        if self.bias == "s32":
            total = total + np.asarray(inputs["bias"], dtype=np.float64).reshape(1, self.K, 1)
        acc = total.reshape(self.N, self.K, self.out_h, self.out_w)
        if self.out_layout == "nhwc":
            acc = acc.transpose(0, 2, 3, 1)
        return np.ascontiguousarray(acc).astype(np.int32)

    def _sat16_correction(self, centered: np.ndarray, zp: float, weight: np.ndarray
                          ) -> np.ndarray:
        """(N, K, pixels): what ``weights=sat16`` takes from the exact sums. Each group's
        window is walked tap by tap, channel by channel (onnxruntime's im2col order), and its
        values 2j, 2j+1 form a pair, over the raw bytes (padding holds the zero point, as the
        kernels' and onnxruntime's do); an odd count's last pair takes a zero."""
        g, gi, go = self.groups, self.group_in, self.group_out
        pixels = self.out_h * self.out_w
        # raw[n, g, tap * gi + c, pixel] and w[g, k, tap * gi + c]: the walk's order
        raw = np.stack([np.rint(window + zp).astype(np.int64).reshape(self.N, g, gi, pixels)
                        for _, _, window in self._windows(centered)], axis=2)
        raw = raw.reshape(self.N, g, -1, pixels)
        w = (np.asarray(weight, dtype=np.int64).reshape(g, go, gi, self.R * self.S)
             .transpose(0, 1, 3, 2).reshape(g, go, -1))
        if w.shape[-1] % 2:
            raw = np.pad(raw, ((0, 0), (0, 0), (0, 1), (0, 0)))
            w = np.pad(w, ((0, 0), (0, 0), (0, 1)))
        corr = np.zeros((self.N, g, go, pixels), dtype=np.int64)
        for j in np.flatnonzero(can_saturate(w[:, :, 0::2], w[:, :, 1::2]).any(axis=(0, 1))):
            pairs = (raw[:, :, None, 2 * j, :] * w[None, :, :, 2 * j, None]
                     + raw[:, :, None, 2 * j + 1, :] * w[None, :, :, 2 * j + 1, None])
            corr += saturated(pairs)
        return corr.reshape(self.N, self.K, pixels).astype(np.float64)

    def channel_shape(self) -> Shape:
        """The shape a per-output-channel vector broadcasts against the output with."""
        return (1, 1, 1, -1) if self.out_layout == "nhwc" else (1, -1, 1, 1)

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        zp = inputs.get("out_zero_point")
        zero_point = None if zp is None else int(np.asarray(zp).reshape(-1)[0])
        scale = np.asarray(inputs["scale"], dtype=np.float32).reshape(self.channel_shape())
        result = requantize(self.accumulate(inputs), scale, zero_point, self.out)
        return result if self.residual == "none" else self.shortcut_added(result, inputs)

    def shortcut_added(self, result: np.ndarray, inputs: Mapping[str, np.ndarray]
                       ) -> np.ndarray:
        """The fused shortcut addition after the 8-bit output ``result`` (output layout),
        the shortcut read in its own layout."""
        shortcut = np.asarray(inputs["residual"]).reshape(self.residual_shape())
        if self.residual_layout != self.out_layout:
            shortcut = shortcut.transpose((0, 2, 3, 1) if self.out_layout == "nhwc"
                                          else (0, 3, 1, 2))
        return residual_added(result, {**inputs, "residual": shortcut}, self.residual)

    def make_inputs(self, rng: np.random.Generator | int = 0) -> dict[str, np.ndarray]:
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        inputs = quantized_inputs(gen, self.input_shapes()["data"],
                                  (self.K, self.group_in, self.R, self.S),
                                  self.group_in * self.R * self.S, self.K, self.scale,
                                  self.bias, self.out, self.weights)
        if self.residual != "none":  # a shortcut of its own scale, some sums saturating
            lo, hi = QUANT_RANGES[self.residual]
            inputs["residual"] = gen.integers(lo, hi + 1, size=self.residual_shape()
                                              ).astype(QUANT_NUMPY[self.residual])
            zp_a = int(np.asarray(inputs["out_zero_point"]).reshape(-1)[0])
            zp_b, zp_y = (128, 120) if self.residual == "u8" else (0, -5)
            scales = gen.uniform(0.02, 0.05, size=3)
            fused = FusedAdd.of(scales[0], zp_a, scales[1], zp_b, scales[2], zp_y)
            inputs["residual_add"] = np.array([fused.ratio_a, fused.ratio_b, fused.constant],
                                              np.float32)
        return inputs

    def describe(self) -> str:
        kind = ("depthwise " if self.groups == self.C and self.groups > 1
                else f"{self.groups}-group " if self.groups > 1 else "")
        bias = ", int32 bias" if self.bias == "s32" else ""
        added = (f", then a {self.residual} shortcut addition" if self.residual != "none"
                 else "")
        if self.channels_last:
            added += (f", {self.in_layout} -> {self.out_layout} (shortcut "
                      f"{self.residual_layout})")
        return (f"int8 {kind}conv2d {self.C}->{self.K} channels, {self.H}x{self.W} input, "
                f"{self._geometry()}" + (f", batch {self.N}" if self.N != 1 else "")
                + f" (u8 x s8 -> {SUMS[self.weights]}{bias}, {self.scale} scale, "
                  f"{self.out} out{added})")


def residual_added(q: np.ndarray, inputs: Mapping[str, np.ndarray], dtype: str) -> np.ndarray:
    """The shortcut addition after the layer's 8-bit output ``q``: onnxruntime's arithmetic
    with the fp32 ``residual_add = [ratio_a, ratio_b, constant]``."""
    ratio_a, ratio_b, constant = np.asarray(inputs["residual_add"], np.float32).reshape(3)
    fused = FusedAdd(np.float32(ratio_a), np.float32(ratio_b), np.float32(constant))
    return fused.numpy(q, inputs["residual"], np.dtype(QUANT_NUMPY[dtype]).name)
