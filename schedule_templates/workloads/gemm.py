"""Matrix-multiply workloads: ``dense`` (Gemm with transB=1) and ``batch_matmul`` (MatMul).

``dense`` may fuse an epilogue on its output (per-column bias and scale, residual, ReLU/clip).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from schedule_templates.workloads.base import Shape, Workload, register
from schedule_templates.workloads.epilogue import NO_EPILOGUE, Epilogue


@register
@dataclasses.dataclass(frozen=True)
class Dense(Workload):
    """``out[M,N] = data[M,K] . weight[N,K]^T``, then the epilogue (channels are columns)."""

    M: int
    N: int
    K: int
    epilogue: Epilogue = NO_EPILOGUE

    op: ClassVar[str] = "dense"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        "M": ("int", None),
        "N": ("int", None),
        "K": ("int", None),
        "epilogue": ("epilogue", NO_EPILOGUE),
    }
    constant_inputs: ClassVar[tuple[str, ...]] = ("weight", "scale", "bias")

    def input_shapes(self) -> dict[str, Shape]:
        return {"data": (self.M, self.K), "weight": (self.N, self.K),
                **self.epilogue.input_shapes(self.output_shape())}

    def output_shape(self) -> Shape:
        return (self.M, self.N)

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        out = np.asarray(inputs["data"] @ inputs["weight"].T, dtype=np.float32)
        return self.epilogue.apply(out, inputs)

    def describe(self) -> str:
        fused = f", fused {self.epilogue.describe()}" if self.epilogue else ""
        return f"dense {self.M}x{self.K} by {self.K}x{self.N} (weights {self.N}x{self.K}){fused}"


@register
@dataclasses.dataclass(frozen=True)
class BatchMatmul(Workload):
    """``out[b,M,N] = x[b,M,K] . y[b,K,N]``."""

    B: int
    M: int
    N: int
    K: int

    op: ClassVar[str] = "batch_matmul"
    params: ClassVar[dict[str, tuple[str, Any]]] = {
        "B": ("int", None),
        "M": ("int", None),
        "N": ("int", None),
        "K": ("int", None),
    }

    def input_shapes(self) -> dict[str, Shape]:
        return {"x": (self.B, self.M, self.K), "y": (self.B, self.K, self.N)}

    def output_shape(self) -> Shape:
        return (self.B, self.M, self.N)

    def flops(self) -> int:
        return 2 * self.B * self.M * self.N * self.K

    def reference(self, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.asarray(np.matmul(inputs["x"], inputs["y"]), dtype=np.float32)

    def describe(self) -> str:
        return f"batch matmul {self.B} x ({self.M}x{self.K} by {self.K}x{self.N})"
