"""x86 template for ``conv2d_bf16``: a direct convolution on ``x86_dot_gemm``'s bf16 nest.

The int8 convolution's scheme (``x86_conv2d_int8``) with ``vdpbf16ps`` for ``vpdpbusd``: for
each image and group one GEMM whose rows are the group's output channels (their weights, rounded
to bfloat16 at pack time, two consecutive input channels per 32-bit word, broadcast) and whose
columns are output pixels (16 words of the phased input per load), reduced over taps and
channel pairs into fp32 sums. The phase stage rounds the fp32 input to bfloat16 as it packs it
(``x86_int8_phases.phase_stage``; padding is 0.0), so the data is read once at fp32 and the
nest moves half the bytes. Columns are phase-width rows rounded up for wide tiles (version 2;
see ``Geometry.columns``): where that computes more pixels than the output has, the tiles go
to a workspace and the fused epilogue is applied on the copy of the real pixels into NCHW;
otherwise it is applied in the register tile and stored in place. On small maps (7x7: 64
columns for 49 pixels) the space's second orientation, pixel rows (``x86_pixel_rows``),
computes only the real pixels.

Against fp32 FMAs each instruction does twice the multiplies, so a layer whose fp32 kernel runs
near the FMA peak can run up to twice as fast on CPUs whose BF16 unit issues like their FMAs
(AMD Zen 4/5); see ``x86_dense_bf16`` for the others. On hosts with AMX-BF16, groups of a
multiple of 32 input channels run the GEMM on tiles (``x86_amx_gemm``, ``tdpbf16ps``), as the
int8 convolution does.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Kernel,
    Scope,
    Stmt,
    cast,
    store,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates import x86_amx_gemm
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.epilogue import epilogue_arguments, epilogue_stage
from schedule_templates.templates.x86_dot_gemm import (
    BF16,
    as_words,
    dot_default,
    dot_space,
    padded_k,
    partial_buffer,
)
from schedule_templates.templates.x86_expanded import (
    ExpandedGeometry,
    expands,
    gemm_pixels,
    padded_words,
)
from schedule_templates.templates.x86_int8_phases import (
    Geometry,
    TileGeometry,
    conv_gemm,
    copy_out,
    image_groups,
    phase_stage,
)
from schedule_templates.templates.x86_pixel_rows import (
    default_with_pixel_rows,
    pack_pixel_row_weights,
    pixel_rows_nest,
    pk_tile,
    with_pixel_rows,
)
from schedule_templates.workloads import Conv2dBf16, Workload
from schedule_templates.workloads.lowp import to_bfloat16


@register
class Conv2dBf16X86(Template):
    name = "conv2d_bf16.x86"
    op = "conv2d_bf16"
    target_kind = "llvm"
    #: 3: on AMX hosts one group of fewer than 32 channels runs on tiles through expanded
    #: planes (``x86_expanded``), with other arguments and workspaces than version 2's vector
    #: kernel for the same config, so a library or a record of version 2 must not stand for it
    version = 3
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, Conv2dBf16)
        geo = Geometry(wl, BF16)
        plain = dot_space(wl.group_out, geo.columns, geo.reduction, BF16)
        return with_pixel_rows(plain, wl.group_out, geo.columns)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, Conv2dBf16)
        geo = Geometry(wl, BF16)
        space = self.space(wl)
        plain = dot_default(space, wl.group_out, geo.columns, geo.reduction, BF16)
        return default_with_pixel_rows(space, plain, geo, BF16)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, Conv2dBf16)
        geo = _geometry(wl)
        kg = wl.group_out
        columns, in_place = geo.gemm_columns, geo.gemm_in_place
        plan = (x86_amx_gemm.amx_blocking(config, kg, columns)
                if isinstance(geo, TileGeometry) else None)
        tile = None if plan is not None else pk_tile(config)
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
        if plan is not None:
            weight = x86_amx_gemm.weight_tiles(wl.groups, plan.M, geo.gemm_words)
        elif tile is not None:
            weight = Buffer("weight_packed", (wl.groups, kg // tile[1], geo.words, tile[1]),
                            dtype="int32")
        else:
            weight = Buffer("weight_packed", (wl.groups, kg, geo.words), dtype="int32")
        taps = Buffer("tap_offsets", (geo.gemm_words,), dtype="int32")
        out = Buffer("out", wl.output_shape())
        epilogue = epilogue_stage(wl)
        frame = image_groups(geo, config)
        tiles = Buffer("tiles", (frame.slots, kg, columns), Scope.WORKSPACE)
        partial = None if plan is not None else partial_buffer(config, kg, geo.columns, BF16)

        n, g, slot, phased, base = frame.n, frame.g, frame.slot, frame.phased, frame.base
        prepare = phase_stage(wl, geo, data, Const(0, "int32"), phased, n, g,
                              encode=lambda value: cast("int32", cast("bfloat16", value)),
                              base=base)
        params = (data, weight, taps, *epilogue.buffers, out)
        if tile is not None:
            def finish_pixel(acc: Expr, j: Expr, at: tuple[Expr, Expr]) -> Stmt:
                index = (n, g * kg + j, at[0], at[1])
                return store(out[index], epilogue.apply(acc, g * kg + j, index)
                             if wl.epilogue else acc)

            nest, partial = pixel_rows_nest(config, geo, BF16, phased, taps, weight, g,
                                            finish_pixel, base=base)
            return Kernel("conv2d_bf16_x86", params,
                          (phased, *(() if partial is None else (partial,))),
                          (frame.loop(prepare, nest),))

        def finish(acc: Expr, m: Expr, q: Expr) -> Stmt:
            k = g * kg + m
            if in_place:
                at = (n, k, Const(0), q)
                return store(out[at], epilogue.apply(acc, k, at) if wl.epilogue else acc)
            return store(tiles[slot, m, q], acc)  # the epilogue runs on the copy (real pixels only)

        px = gemm_pixels(geo, frame)  # columns from px.column0 on (a band of expanded planes)
        nest = conv_gemm(geo, config, plan, weight, g, px.buffer, px.base, taps,
                         lambda acc, m, q: finish(acc, m, px.column0 + q), partial)
        body: list[Stmt] = [prepare, *px.bands([*px.stages, nest])]
        if not in_place:
            def copied(tile: Expr, k: Expr, oh: Expr, ow: Expr) -> Expr:
                return epilogue.apply(tile, k, (n, k, oh, ow)) if wl.epilogue else tile

            body.append(copy_out(geo, lambda m, q: tiles[slot, m, q], out, n, g, copied))
        workspaces = (phased, *((px.buffer,) if px.buffer is not phased else ()),
                      *(() if in_place else (tiles,)),
                      *(() if partial is None else (partial,)))
        return Kernel("conv2d_bf16_x86", params, workspaces, (frame.loop(*body),))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, Conv2dBf16)
        geo = _geometry(wl)
        weight = np.asarray(inputs["weight"], dtype=np.float32)
        # [K][R][S][channels padded to pairs] of bf16 bits: the reduction's order, 2 per word
        values = np.zeros((wl.K, wl.R, wl.S, padded_k(wl.group_in, BF16)), dtype=np.uint16)
        values[..., :wl.group_in] = to_bfloat16(weight.transpose(0, 2, 3, 1))
        tile = None if isinstance(geo, TileGeometry) else pk_tile(config)
        packed = (pack_pixel_row_weights(values, wl.groups, tile[1], BF16) if tile is not None
                  else as_words(values).reshape(wl.groups, wl.group_out, geo.words))
        if isinstance(geo, TileGeometry):  # zero weights for expanded planes' padding
            rows = x86_amx_gemm.amx_blocking(config, wl.group_out, geo.gemm_columns).M
            packed = x86_amx_gemm.pack_row_tiles(padded_words(packed, geo), rows)
        return {"data": np.asarray(inputs["data"], dtype=np.float32),
                "weight_packed": np.ascontiguousarray(packed),
                "tap_offsets": geo.gemm_offsets(), **epilogue_arguments(wl, inputs)}


def _geometry(wl: Conv2dBf16) -> Geometry:
    """AMX tiles where the host has AMX-BF16 and a tile step (32 channels) stays inside one
    tap, or expanded planes for one group of fewer channels (an RGB stem); ``vdpbf16ps``
    else."""
    if x86_amx_gemm.host_amx("tdpbf16ps"):
        if wl.group_in % x86_amx_gemm.BF16_TILE_CHANNELS == 0:
            return TileGeometry(wl, BF16)
        if expands(wl, BF16.per_word):
            return ExpandedGeometry(wl, BF16)
    return Geometry(wl, BF16)
