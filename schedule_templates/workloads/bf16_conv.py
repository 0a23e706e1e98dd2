"""bfloat16 convolution: ``conv2d_bf16`` (fp32 activations rounded to bf16 in the kernel, fp32
weights rounded once at pack time, fp32 accumulation, fp32 output), what a model built with
``--precision bf16`` runs for its convolutions.

    out[n,k,oh,ow] = epilogue(sum_{c in group(k), r, s}
                              bf16(data[n,c,ih,iw]) * bf16(weight[k,c,r,s]))

with ``ih = oh*sh + r*dh - pad_top`` (likewise ``iw``), padding standing for 0. The geometry and
the fused epilogue (bias, folded batch norm, residual, ReLU/clip, smooth activations) are
``conv2d``'s, and so are the inputs (``data`` fp32 [N,C,H,W], ``weight`` fp32
[K,C/groups,R,S], then the epilogue's); ``groups`` (default 1) divides both channel counts. The
reference rounds data and weights to bfloat16 the same way as the kernel does (nearest even), so
only the order of the fp32 sums differs. An operator of its own: its records never mix with
``conv2d``'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.workloads.base import Shape, register
from schedule_templates.workloads.conv import (
    _CONV_PARAMS,
    _EPILOGUE_PARAM,
    _WINDOW_PARAMS,
    _Grouped,
)
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue
from schedule_templates.workloads.lowp import from_bfloat16, to_bfloat16


@register
@dataclasses.dataclass(frozen=True)
class Conv2dBf16(_Grouped):
    """``conv2d`` on bfloat16 products, fp32 sums."""

    K: int = 0
    groups: int = 1
    epilogue: Epilogue = NO_EPILOGUE

    op: ClassVar[str] = "conv2d_bf16"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        **_CONV_PARAMS,
        "K": ("int", None),
        **_WINDOW_PARAMS,
        "groups": ("int", 1),
        **_EPILOGUE_PARAM,
    }
    examples: ClassVar[tuple[str, ...]] = (
        "conv2d_bf16:N=1,C=8,H=7,W=9,K=16,R=3,S=3,pad=1",
        "conv2d_bf16:N=1,C=3,H=12,W=11,K=16,R=7,S=7,stride=2,pad=3",
        "conv2d_bf16:N=2,C=5,H=6,W=6,K=12,R=1,S=1",
        "conv2d_bf16:N=1,C=6,H=4,W=8,K=16,R=1,S=1",
        "conv2d_bf16:N=1,C=4,H=9,W=9,K=16,R=3,S=3,pad=2,dilation=2",
        "conv2d_bf16:N=1,C=8,H=8,W=6,K=12,R=3,S=2,stride=2x1,pad=0x1x1x0,groups=4",
    )

    def validate(self) -> None:
        super().validate()
        self._check_groups()

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.N, self.C, self.H, self.W),
                "weight": (self.K, self.group_in, self.R, self.S),
                **self.epilogue.input_shapes(self.output_shape())}

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        data = from_bfloat16(to_bfloat16(inputs["data"])).astype(np.float64)
        weight = from_bfloat16(to_bfloat16(inputs["weight"])).astype(np.float64)
        out = self._grouped_sum(data, weight).reshape(self.output_shape()).astype(np.float32)
        return self.epilogue.apply(out, inputs)

    def describe(self) -> str:
        groups = f", {self.groups} groups" if self.groups > 1 else ""
        return (f"bf16 conv2d {self.C}->{self.K} channels, {self.H}x{self.W} input, "
                f"{self._geometry()}{groups}" + (f", batch {self.N}" if self.N != 1 else "")
                + self._fused() + " (fp32 data rounded to bf16, fp32 accumulation)")
