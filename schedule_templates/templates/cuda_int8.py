"""CUDA templates for ``dense_int8`` and ``conv2d_int8`` on words of four bytes: dense on the
tensor cores (``cuda_mma``: warp-wide ``mma.sync.m16n8k32``, u8 x s8 -> s32), conv2d on the tiled
SIMT GEMM of ``cuda_tiling``, each step of its reduction one ``dp4a`` (PTX ``dp4a.u32.s32``: four
products of unsigned activation bytes with signed weight bytes, added to an int32 accumulator).

The reduction runs over words: ``K`` bytes are ``ceil(K / 4)`` words, the weights packed at
build time into ``[rows][words]`` with zero bytes past ``K`` (so whatever bytes the
activations hold there add nothing). The activation zero point and the int32 bias are folded
into one per-channel compensation (``requantize.compensation``), so the inner loop sees raw
bytes; the output stage is the x86 templates' requantization (onnxruntime's rounding),
applied to the accumulators as they are stored.

dense: activation rows whose length divides by 4 are read in place as words (vector loads
along the row); other rows gather four bytes per word (``bytes4``). conv2d: an implicit GEMM
like ``conv2d.cuda`` (rows = a group's output channels, columns = output pixels, groups on
``blockIdx.z``) whose right operand gathers four ``(c, r, s)`` taps per word on the fly, padding
taps reading the activation zero point (they add ``zp * w``, which the compensation takes back,
exactly as for real taps).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Kernel,
    Load,
    binop,
    cast,
    intrinsic,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, as_workload, register
from schedule_templates.templates.cuda_conv2d import im2col
from schedule_templates.templates.cuda_mma import (
    MmaOperand,
    MmaTiles,
    mma_default,
    mma_nest,
    mma_space,
)
from schedule_templates.templates.cuda_tiling import (
    GemmProblem,
    GemmTiles,
    Operand,
    ceil_div,
    gemm_nest,
    gemm_space,
    small_grid_default,
    vector_width,
)
from schedule_templates.templates.requantize import (
    OUT_DTYPES,
    AddBuffers,
    ResidualBuffers,
    compensation,
    requantized,
    requantized_int,
)
from schedule_templates.templates.x86_dot_gemm import as_words, typed
from schedule_templates.workloads import Conv2dInt8, DenseInt8, Workload

BYTES_PER_WORD = 4


def dp4a(acc: Expr, a: Expr, b: Expr) -> Expr:
    """One reduction step of a GEMM whose ``a`` words hold the unsigned bytes."""
    return intrinsic("dp4a", acc, a, b)


def weight_words(weight: np.ndarray) -> np.ndarray:
    """s8 weights, one row per output channel (any trailing shape) -> int32 words
    ``[rows][ceil(taps / 4)]``, zero bytes past the row's end."""
    rows = weight.reshape(weight.shape[0], -1)
    words = ceil_div(rows.shape[1], BYTES_PER_WORD)
    padded = np.zeros((rows.shape[0], BYTES_PER_WORD * words), dtype=np.int8)
    padded[:, :rows.shape[1]] = rows
    return as_words(padded)


class _Requantize:
    """The int8 output stage's buffers for ``channels`` output channels, and its expression."""

    def __init__(self, channels: int, scale: str, out: str, add: str = "none") -> None:
        self.out, self.add, self.per_channel = out, add, scale == "channel"
        self.compensation = Buffer("compensation", (channels,), dtype="int32")
        self.scale = Buffer("scale", (channels,) if self.per_channel else (1,))
        self.zero_point = Buffer("out_zero_point", (1,), dtype="int32")
        self.added = AddBuffers(channels) if add != "none" else None
        self.params = (self.compensation, self.scale,
                       *(() if out == "f32" else (self.zero_point,)),
                       *(self.added.params if self.added else ()))

    @property
    def dtype(self) -> str:
        return OUT_DTYPES[self.add if self.added else self.out]

    def int_value(self, acc: Expr, channel: Expr) -> Expr:
        """The u8/s8 output as an int32 of its range (before any fused addition)."""
        return requantized_int(acc + self.compensation[channel],
                               self.scale[channel if self.per_channel else 0],
                               self.zero_point[0], self.out)

    def apply(self, acc: Expr, channel: Expr, column: Expr) -> Expr:
        value = requantized(acc + self.compensation[channel],
                            self.scale[channel if self.per_channel else 0],
                            self.zero_point[0], self.out)
        return value if self.added is None else self.added.expr(value, column, self.add)

    def pack(self, inputs: Mapping[str, np.ndarray], weight: np.ndarray, bias: str
             ) -> dict[str, np.ndarray]:
        data_zp = int(typed(inputs, "data_zero_point", np.uint8).reshape(-1)[0])
        args = {"compensation": compensation(bias, inputs, weight, data_zp),
                "scale": np.asarray(inputs["scale"], dtype=np.float32).reshape(-1)}
        if self.out != "f32":
            zp_type = np.uint8 if self.out == "u8" else np.int8
            args["out_zero_point"] = typed(inputs, "out_zero_point", zp_type).astype(np.int32)
        if self.added is not None:
            args.update(AddBuffers.pack(inputs, self.compensation.shape[0]))
        return args


def _exact_sums_only(name: str, wl: DenseInt8 | Conv2dInt8) -> None:
    """``weights=sat16`` is onnxruntime's x86 arithmetic without VNNI; dp4a and the tensor
    cores sum exactly."""
    if wl.weights == "sat16":
        raise InvalidWorkloadError(f"{name}: weights=sat16 (saturating 16-bit pairs) is an x86 "
                                   "arithmetic; the CUDA kernels sum exactly")


@register
class DenseInt8Cuda(Template):
    name = "dense_int8.cuda"
    op = "dense_int8"
    target_kind = "cuda"
    version = 2  # 1 was the dp4a SIMT GEMM (docs/cuda.md has its figures)

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, DenseInt8)
        _exact_sums_only(self.name, wl)
        return mma_space(wl.M, wl.N, ceil_div(wl.K, BYTES_PER_WORD), device)

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, DenseInt8)
        return mma_default(self.space(wl), wl.M, wl.N)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, DenseInt8)
        words = ceil_div(wl.K, BYTES_PER_WORD)
        data: Buffer
        if _in_place(wl):
            data = Buffer("data", (wl.M, words), dtype="int32")  # the row's bytes as words
            left = MmaOperand(wl.M, vector_width(words), lambda m, w: data[m, w])
        else:
            data = Buffer("data", (wl.M, wl.K), dtype="uint8")
            left = MmaOperand(wl.M, 1, lambda m, w: gathered_word(
                lambda k: cast("int32", data[m, binop("min", k, wl.K - 1)]), w))
        weight = Buffer("weight_words", (wl.N, words), dtype="int32")
        stage = _Requantize(wl.N, wl.scale, wl.out, wl.add)
        out = Buffer("out", (wl.M, wl.N), dtype=stage.dtype)
        body = mma_nest(MmaTiles.of(config), wl.M, wl.N, words, left,
                        MmaOperand(wl.N, vector_width(words), lambda n, w: weight[n, w]),
                        lambda m, n: out[m, n], lambda acc, _m, n: stage.apply(acc, n, n))
        return Kernel("dense_int8_cuda", (data, weight, *stage.params, out), (), (body,))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, DenseInt8)
        data = typed(inputs, "data", np.uint8)
        weight = typed(inputs, "weight", np.int8)
        stage = _Requantize(wl.N, wl.scale, wl.out, wl.add)
        return {"data": as_words(data) if _in_place(wl) else data,
                "weight_words": weight_words(weight), **stage.pack(inputs, weight, wl.bias)}


def _in_place(wl: DenseInt8) -> bool:
    return wl.K % BYTES_PER_WORD == 0


def gathered_word(byte: Callable[[Expr], Expr], word: Expr) -> Expr:
    """Word ``word`` of a reduction built from its four bytes: ``byte(k)`` is reduction
    element ``k`` as an int32 (only its low 8 bits count)."""
    return intrinsic("bytes4", *(byte(word * BYTES_PER_WORD + j)
                                 for j in range(BYTES_PER_WORD)))


@register
class Conv2dInt8Cuda(Template):
    name = "conv2d_int8.cuda"
    op = "conv2d_int8"
    target_kind = "cuda"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = as_workload(workload, Conv2dInt8)
        _exact_sums_only(self.name, wl)
        if wl.channels_last:
            raise InvalidWorkloadError(f"{self.name}: channels-last activations (nhwc) are "
                                       "an x86 layout; the CUDA kernel reads and writes NCHW")
        rows, columns, words = _conv_gemm(wl)
        return gemm_space(wl.groups, rows, columns, words, device)

    def default_config(self, workload: Workload) -> Config:
        wl = as_workload(workload, Conv2dInt8)
        rows, columns, _ = _conv_gemm(wl)
        return small_grid_default(self.space(wl), rows, columns)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = as_workload(workload, Conv2dInt8)
        rows, columns, words = _conv_gemm(wl)
        pixels = wl.out_h * wl.out_w
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W), dtype="uint8")
        data_zp = Buffer("data_zero_point", (1,), dtype="int32")
        weight = Buffer("weight_words", (wl.K, words), dtype="int32")
        stage = _Requantize(wl.K, wl.scale, wl.out)
        fused = (None if wl.residual == "none"
                 else ResidualBuffers((wl.N, wl.K, pixels), wl.residual))
        out = Buffer("out", (wl.N, wl.K, pixels),
                     dtype=stage.dtype if fused is None else fused.dtype)

        def pixel(p: Expr) -> tuple[Expr, Expr]:
            return (Const(0), p) if wl.N == 1 else (p // pixels, p % pixels)

        def tap(g: Expr, p: Expr, crs: Expr) -> Expr:
            """Reduction element ``crs`` of output pixel ``p`` in group ``g``, as int32."""
            taps = wl.group_in * wl.R * wl.S
            crs = binop("min", crs, taps - 1) if taps % BYTES_PER_WORD else crs
            return im2col(wl, data, p, crs, g * wl.group_in,
                          lambda byte: cast("int32", byte), data_zp[0])

        def channel(g: Expr, m: Expr) -> Expr:
            return m if wl.groups == 1 else g * rows + m

        def target(g: Expr, m: Expr, p: Expr) -> Load:
            n, q = pixel(p)
            return out[n, channel(g, m), q]

        def finish(acc: Expr, k: Expr, p: Expr) -> Expr:
            if fused is None:
                return stage.apply(acc, k, k)
            n, q = pixel(p)
            return fused.expr(stage.int_value(acc, k), fused.residual[n, k, q])

        problem = GemmProblem(
            wl.groups, rows, columns, words,
            a=Operand(rows, "k", vector_width(words),
                      lambda g, m, w: weight[channel(g, m), w]),
            # the pixels' words are gathered: dp4a's unsigned operand, hence ``madd`` below
            b=Operand(columns, "mn", 1,
                      lambda g, p, w: gathered_word(lambda k: tap(g, p, k), w)),
            out=target,
            finish=lambda acc, g, m, p: finish(acc, channel(g, m), p),
            dtype="int32", madd=lambda acc, weights, activations: dp4a(acc, activations,
                                                                        weights),
        )
        body = gemm_nest(GemmTiles.of(config), problem)
        return Kernel("conv2d_int8_cuda", (data, data_zp, weight, *stage.params,
                                           *(() if fused is None else fused.params), out), (),
                      (body,))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = as_workload(workload, Conv2dInt8)
        weight = typed(inputs, "weight", np.int8)
        zp = typed(inputs, "data_zero_point", np.uint8).reshape(-1)[:1].astype(np.int32)
        stage = _Requantize(wl.K, wl.scale, wl.out)
        return {"data": typed(inputs, "data", np.uint8), "data_zero_point": zp,
                "weight_words": weight_words(weight), **stage.pack(inputs, weight, wl.bias),
                **ResidualBuffers.pack(inputs, wl.residual)}


def _conv_gemm(wl: Conv2dInt8) -> tuple[int, int, int]:
    """(rows, columns, reduction words) of one group's implicit GEMM."""
    taps = wl.group_in * wl.R * wl.S
    return wl.K // wl.groups, wl.N * wl.out_h * wl.out_w, ceil_div(taps, BYTES_PER_WORD)
