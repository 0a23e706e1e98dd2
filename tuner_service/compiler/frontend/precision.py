"""Compute precision of a model's tunable layers: ``fp32`` (as exported) or ``bf16``.

With ``bf16`` every ``dense`` layer (a Gemm or MatMul with a constant weight) whose shape the
bfloat16 template takes (N a multiple of 16, K even) becomes ``dense_bf16`` with ``data=f32``,
and every ``conv2d`` layer becomes ``conv2d_bf16`` except where this host's fp32 default is a
Winograd kernel (3x3, stride 1, enough tiles: it does a quarter to a half of the multiplies,
which beats twice the multiply rate; ResNet-50's 3x3 layers at 56x56 and 28x28 ran 1.5-1.8x
faster so, Zen 4) on a map of at least 28x28 (``_BF16_WINOGRAD_MIN_PIXELS``): the same
inputs, fused epilogue and fp32 output, the products on bfloat16 values summed in fp32
(weights rounded once at pack time, activations inside the kernel).
A ``batch_matmul`` of two activations (attention's products) becomes ``batch_matmul_bf16``,
which rounds both inside the kernel, unless it is too small to pay for that. Grouped
convolutions become ``conv2d_bf16`` with their groups; depthwise ones keep fp32 (``tuner build
--json`` reports ``bf16_layers``). Tensors between layers stay fp32, so nothing else in the
plan changes. It is a choice of the user's (``tuner build --precision bf16``): the error it
brings (about 3 significant digits per product) is what bf16 inference accepts, and whether it
is faster depends on the CPU (``schedule_templates/templates/x86_dense_bf16.py``).

On a host that grants AMX-BF16 tiles (Sapphire Rapids and later Xeons) a layer takes bf16 only
where it runs on tiles: convolutions whose groups have whole steps of 32 channels (then even
over fp32 Winograd: ResNet-50's 56x56 3x3 layer 1.04 -> 0.36 ms) or that take expanded planes
(one group of fewer channels, an RGB stem: ResNet-50's 2.01 ms in fp32, 1.23 on tiles, 4.65 on
``vdpbf16ps``), denses of whole 32-column blocks. The rest keeps fp32, since these cores issue
``vdpbf16ps`` at half their FMAs' rate, and so do attention's ``batch_matmul``s, which have no
tile form yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from schedule_templates.templates.choose import host_registers
from schedule_templates.templates.x86_amx_gemm import BF16_TILE_CHANNELS, host_amx
from schedule_templates.templates.x86_dot_gemm import BF16
from schedule_templates.templates.x86_expanded import expands
from schedule_templates.templates.x86_winograd import default_winograd
from schedule_templates.workloads import (
    BatchMatmul,
    BatchMatmulBf16,
    Conv2d,
    Conv2dBf16,
    DenseBf16,
    GroupConv2d,
    Workload,
)
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.fusion import Layer

PRECISIONS = ("fp32", "bf16")
_LANES = 16  # the bf16 template's register width in columns
#: below this many products a bf16 batch_matmul's two packing passes cost more than its faster
#: products save (B=3, M=5, N=40, K=9: 2.0 us against fp32's 0.5; attention's 12 x 128 x 128 x
#: 64 runs 1.75x faster, Zen 4)
_BF16_MIN_PRODUCTS = 1 << 20
#: fp32 Winograd is kept only on maps of at least this many output pixels: on smaller ones its
#: transformed weights (36 fp32 values per 3x3 tap set, 9.4 MB for 256 -> 256 channels) are
#: read once per call for few tiles and come from memory inside a model. ResNet-50's 14x14
#: 3x3 layers, Zen 5, 1 thread: Winograd 0.452 ms alone but 0.57 in the model, conv2d_bf16
#: 0.490 alone; at 28x28 Winograd stays ahead (0.29 alone, 0.41 in the model, bf16 0.49)
_BF16_WINOGRAD_MIN_PIXELS = 28 * 28


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}; expected one of "
                         f"{', '.join(PRECISIONS)}")


def at_precision(workload: Workload, precision: str) -> Workload:
    """The workload that computes ``workload``'s layer at ``precision`` (itself where that
    precision has no template for it)."""
    check_precision(precision)
    if precision == "fp32":
        return workload
    tiles = host_amx("tdpbf16ps")
    if isinstance(workload, Conv2d):
        fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(Conv2d)}
        on_tiles = tiles and (workload.C % BF16_TILE_CHANNELS == 0
                              or expands(Conv2dBf16(**fields), BF16.per_word))
        if tiles and not on_tiles:
            return workload  # vdpbf16ps: half the FMAs' rate on these Xeons
        if (default_winograd(workload, host_registers()) is not None
                and workload.out_h * workload.out_w >= _BF16_WINOGRAD_MIN_PIXELS
                and not on_tiles):
            return workload
        return Conv2dBf16(**fields)
    if isinstance(workload, GroupConv2d):
        if tiles and (workload.C // workload.groups) % BF16_TILE_CHANNELS:
            return workload
        fields = {f.name: getattr(workload, f.name) for f in dataclasses.fields(GroupConv2d)}
        return Conv2dBf16(**fields)
    if isinstance(workload, BatchMatmul):
        if tiles or workload.B * workload.M * workload.N * workload.K < _BF16_MIN_PRODUCTS:
            return workload  # batch_matmul_bf16 has no tile form: vdpbf16ps
        return BatchMatmulBf16(B=workload.B, M=workload.M, N=workload.N, K=workload.K)
    if workload.op != "dense":
        return workload
    m, n, k = (getattr(workload, name) for name in ("M", "N", "K"))
    if n % (2 * _LANES if tiles else _LANES) or k % 2:  # tiles take whole 32-column blocks
        return workload
    return DenseBf16(M=m, N=n, K=k, data="f32", epilogue=workload.epilogue_spec)


def apply_precision(layers: Sequence[Layer], precision: str) -> list[Layer]:
    """``layers`` with each workload at ``precision`` (``at_precision``)."""
    return [dataclasses.replace(layer, workload=at_precision(layer.workload, precision))
            for layer in layers]
