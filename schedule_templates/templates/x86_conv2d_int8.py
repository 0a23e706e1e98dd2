"""x86 template for ``conv2d_int8``: a direct convolution on ``x86_dot_gemm``'s int8 nest.

For each image and group, one GEMM: rows are the group's output channels (their weights
broadcast, 4 bytes or two 16-bit values per word), columns are output pixels (activations
loaded 16 at a time), the reduction runs over taps and input channels. Before it, the group's
input is rewritten once into words of consecutive channels, padded with the activation zero
point (so that padded taps cancel in the compensation ``-zp * sum(w)``, as in ``dense_int8``)
and split into ``stride_h * stride_w`` phases (every ``stride``-th row and column): tap
``(r, s)`` then reads one phase at a fixed offset from the output pixel, so the 16 lanes of a
load are 16 consecutive words whatever the stride or dilation.

Columns are pixels of a phase-width row (``Wh`` per output row: the ``Wh - OW`` extra ones are
computed and dropped) rounded up for register tiles 32 to 64 lanes wide (``Geometry.columns``;
version 2: version 1 rounded to 16 lanes, so its configs split other column counts); the tiles
go to a workspace and the real pixels are copied into NCHW, unless nothing is dropped (then they
are stored in place). The per-word tap offsets are a constant input computed at pack time.

Depthwise layers (one input channel per group) have a kernel of their own
(``x86_depthwise_int8``): on this nest three quarters of each word would be padding.

On small maps the dropped columns are much of the work (7x7: 64 columns for 49 pixels), so the
space has a second orientation, pixel rows (``pk_tile=RxW``, ``x86_pixel_rows``): rows are the
real output pixels and columns output channels, stored one byte at a time into NCHW; the
default takes it where that beats the dropped columns (5 x 16 on AVX2, whose registers are fewer).

On hosts with AMX, a layer whose groups have a multiple of 64 input channels (one tile step,
64 bytes, stays inside one tap) runs the GEMM on tiles (``x86_amx_gemm``): ``tdpbsud`` with
the signed weights as the tile rows and 16 pixels' channel words of one reduction step as a
tile of the other operand (a phase plane apart), so the orientation and the output stage stay
these; the columns are rounded to whole 32-pixel register blocks instead (``TileGeometry``).
One group of fewer channels (an RGB stem) takes tiles too, through a plane per reduction word
(``x86_expanded``, version 3). Channels-last layers take tiles the other way round, the
activations as the tile rows (``x86_amx_channels_last``, version 4).
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
    loop,
    prefetch,
    store,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.requantize import (
    OUT_DTYPES,
    ResidualBuffers,
    compensation,
    requantized,
    requantized_int,
)
from schedule_templates.templates.x86_amx_channels_last import (
    TileMap,
    on_tiles,
    tiles_nest,
)
from schedule_templates.templates.x86_amx_channels_last import (
    blocking as channels_last_blocking,
)
from schedule_templates.templates.x86_amx_channels_last import (
    pack_weights as pack_channels_last_tiles,
)
from schedule_templates.templates.x86_amx_gemm import TILE_COLS
from schedule_templates.templates.x86_channels_last import ChannelsLast
from schedule_templates.templates.x86_depthwise_int8 import (
    depthwise_default,
    depthwise_kernel,
    depthwise_space,
    is_depthwise,
)
from schedule_templates.templates.x86_dot_gemm import (
    VNNI,
    as_words,
    dot_default,
    dot_space,
    padded_k,
    partial_buffer,
    typed,
)
from schedule_templates.templates.x86_expanded import (
    ExpandedGeometry,
    expands,
    gemm_pixels,
    padded_words,
)
from schedule_templates.templates.x86_int8_flat import (
    FlatGeometry,
    flat_stage,
    flat_weight_words,
    is_flat,
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
from schedule_templates.workloads import Conv2dInt8, Workload
from schedule_templates.workloads.lowp import check_weights

#: On tiles, a layer whose output is stored in place with the shortcut added (ResNet's 1x1
#: layers that end a block) reads the shortcut 32 pixels of 32 channel rows a register block,
#: rows a map apart: too many streams for the hardware prefetcher, so every line was a demand
#: miss. Each row hints its next line (64 bytes on) into L2. Emerald Rapids, 1 thread:
#: 56x56 64 -> 256 alone 0.65 -> 0.46 ms (slow phase), int8 ResNet-50 3% faster (paired runs).
RESIDUAL_AHEAD = 64
RESIDUAL_LOCALITY = 2


@register
class Conv2dInt8X86(Template):
    name = "conv2d_int8.x86"
    op = "conv2d_int8"
    target_kind = "llvm"
    #: 3: on AMX hosts one group of fewer than 64 channels runs on tiles through expanded
    #: planes (``x86_expanded``), with other arguments and workspaces than version 2's vector
    #: kernel for the same config, so a library or a record of version 2 must not stand for it;
    #: 4: on AMX hosts channels-last layers run on tiles (``x86_amx_channels_last``), where
    #: version 3 ran the same configs as vector pixel rows
    version = 4

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, Conv2dInt8)
        geo = _space_geometry(wl)  # the space is the same whatever the instruction
        if is_depthwise(wl):
            return depthwise_space(geo.columns)
        plain = dot_space(wl.group_out, geo.columns, geo.reduction, VNNI)
        if is_flat(wl):  # channel rows over the flat words' planes
            return plain
        return with_pixel_rows(plain, wl.group_out, geo.columns, only=wl.channels_last)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, Conv2dInt8)
        geo = _space_geometry(wl)
        space = self.space(wl)
        if is_depthwise(wl):
            return depthwise_default(space, geo.columns)
        inst = x86_dot_gemm.workload_instruction(wl)
        if is_flat(wl):
            return dot_default(space, wl.group_out, geo.columns, geo.reduction, inst)
        # channels-last spaces hold pixel rows only: the channel-row default it turns into
        # pixel rows comes from the plain space
        rows_space = (dot_space(wl.group_out, geo.columns, geo.reduction, VNNI)
                      if wl.channels_last else space)
        plain = dot_default(rows_space, wl.group_out, geo.columns, geo.reduction, inst)
        return default_with_pixel_rows(space, plain, geo, inst, forced=wl.channels_last)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, Conv2dInt8)
        geo = _geometry(wl)
        if is_depthwise(wl):
            layout = (geo.phase_h, geo.phase_w, geo.columns, geo.plane)
            return depthwise_kernel(wl, config, layout)
        inst = geo.inst
        kg = wl.group_out
        columns, in_place, words = geo.gemm_columns, geo.gemm_in_place, geo.gemm_words
        plan = (x86_amx_gemm.amx_blocking(config, kg, columns)
                if isinstance(geo, TileGeometry) else None)
        tile = None if plan is not None else pk_tile(config)
        pk = tile is not None
        width = tile[1] if tile is not None else 0
        nhwc_in = (ChannelsLast(wl, inst.per_word) if wl.in_layout == "nhwc" else None)
        cl_tiles = TileMap(wl) if _channels_last_tiles(wl) else None
        data = (nhwc_in.data_buffer() if nhwc_in is not None
                else Buffer("data", (wl.N, wl.C, wl.H, wl.W), dtype="uint8"))
        if cl_tiles is not None:
            cl_plan = channels_last_blocking(config, cl_tiles)
            data = cl_tiles.data_buffer(cl_plan)
            weight = Buffer("weight_packed", (cl_plan.N // TILE_COLS, geo.words, TILE_COLS),
                            dtype="int32")
        elif plan is not None:
            weight = x86_amx_gemm.weight_tiles(wl.groups, plan.M, words)
        elif pk:
            weight = Buffer("weight_packed", (wl.groups, kg // width, geo.words, width),
                            dtype="int32")
        else:
            weight = Buffer("weight_packed", (wl.groups, kg, geo.words), dtype="int32")
        taps = Buffer("tap_offsets", (words,), dtype="int32")
        data_zp = Buffer("data_zero_point", (1,), dtype="int32")
        comp = Buffer("compensation", (wl.K,), dtype="int32")
        scale = Buffer("scale", (wl.K,) if wl.scale == "channel" else (1,))
        out_zp = Buffer("out_zero_point", (1,), dtype="int32")
        fused = None if wl.residual == "none" else ResidualBuffers(wl.residual_shape(),
                                                                    wl.residual)
        out = Buffer("out", wl.output_shape(),
                     dtype=OUT_DTYPES[wl.out] if fused is None else fused.dtype)
        params = (data, weight, taps, data_zp, comp, scale,
                  *(() if wl.out == "f32" else (out_zp,)),
                  *(() if fused is None else fused.params), out)

        def output(acc: Expr, k: Expr, at: tuple[Expr, Expr]) -> Expr:
            """Output channel k's value at (row, column) of image n: requantized, plus the
            shortcut's element there when the addition is fused."""
            s = scale[k if wl.scale == "channel" else 0]
            if fused is None:
                return requantized(acc + comp[k], s, out_zp[0], wl.out)
            return fused.expr(requantized_int(acc + comp[k], s, out_zp[0], wl.out),
                              fused.residual[output_index(k, at, wl.residual_layout)])

        def output_index(k: Expr, at: tuple[Expr, Expr], layout: str = wl.out_layout
                         ) -> tuple[Expr, ...]:
            """Output channel k's element at (row, column) of image n, in ``layout``."""
            return (n, at[0], at[1], k) if layout == "nhwc" else (n, k, at[0], at[1])

        if cl_tiles is not None:
            image, images = loop("img", wl.N)
            n: Expr = image  # the image ``output_index`` stores into

            def store_tile(acc: Expr, k: Expr, at: tuple[Expr, Expr]) -> Stmt:
                return store(out[output_index(k, at)], output(acc, k, at))

            stmts, spaces = tiles_nest(config, cl_tiles, data, weight, taps, data_zp[0], n,
                                       store_tile)
            return Kernel("conv2d_int8_amx", params, tuple(spaces), (images(*stmts),))
        frame = image_groups(geo, config)
        tiles = Buffer("tiles", (frame.slots, kg, columns), Scope.WORKSPACE, OUT_DTYPES[wl.out])
        partial = None if plan is not None else partial_buffer(config, kg, geo.columns, inst)

        n, g, slot, phased, base = frame.n, frame.g, frame.slot, frame.phased, frame.base
        if tile is not None:
            def finish_pixel(acc: Expr, j: Expr, at: tuple[Expr, Expr]) -> Stmt:
                return store(out[output_index(g * kg + j, at)], output(acc, g * kg + j, at))

            stages: list[Stmt] = []
            if nhwc_in is None:
                source, pixel_at = phased, None
                stages.append(phase_stage(wl, geo, data, data_zp[0], phased, n, g, base=base))
            elif nhwc_in.staged:
                source = nhwc_in.padded_buffer(frame.slots)
                base = frame.slot * nhwc_in.map_words
                pixel_at = nhwc_in.pixel_offset
                stages.append(nhwc_in.pad_stage(data, data_zp[0], source, n, base))
            else:  # the input's words as they lie
                source, pixel_at = data, nhwc_in.pixel_offset
                base = n * nhwc_in.image_words
            nest, partial = pixel_rows_nest(config, geo, inst, source, taps, weight, g,
                                            finish_pixel, base=base, pixel_at=pixel_at)
            workspaces = tuple(b for b in (source, partial)
                               if b is not None and b.scope is Scope.WORKSPACE)
            return Kernel("conv2d_int8_x86", params, workspaces,
                          (frame.loop(*stages, nest),))
        prepare = (flat_stage(geo, data, data_zp[0], phased, n, base)
                   if isinstance(geo, FlatGeometry)
                   else phase_stage(wl, geo, data, data_zp[0], phased, n, g, base=base))

        def finish(acc: Expr, m: Expr, q: Expr) -> Stmt:
            k = g * kg + m
            if in_place:
                return store(out[n, k, 0, q], output(acc, k, (Const(0), q)))
            # the tiles hold phase-width rows (dropped columns too): the fused addition, if
            # any, is done on the copy, where each column is a real output pixel
            value = requantized(acc + comp[k], scale[k if wl.scale == "channel" else 0],
                                out_zp[0], wl.out)
            return store(tiles[slot, m, q], value)

        row_hint = None
        if fused is not None and in_place and plan is not None:
            def row_hint(m: Expr, q: Expr) -> list[Stmt]:
                """The shortcut's next line of this output channel's row, into L2."""
                return [prefetch(fused.residual[n, g * kg + m, 0, q + RESIDUAL_AHEAD],
                                 RESIDUAL_LOCALITY)]

        px = gemm_pixels(geo, frame)  # columns from px.column0 on (a band of expanded planes)
        banded_hint = (None if row_hint is None
                       else lambda m, q: row_hint(m, px.column0 + q))
        gemm = conv_gemm(geo, config, plan, weight, g, px.buffer, px.base, taps,
                         lambda acc, m, q: finish(acc, m, px.column0 + q), partial, banded_hint)
        body: list[Stmt] = [prepare, *px.bands([*px.stages, gemm])]
        if not in_place:
            def copied(tile: Expr, k: Expr, oh: Expr, ow: Expr) -> Expr:
                return tile if fused is None else fused.expr(tile, fused.residual[n, k, oh, ow])

            body.append(copy_out(geo, lambda m, q: tiles[slot, m, q], out, n, g, copied))
        workspaces = (phased, *((px.buffer,) if px.buffer is not phased else ()),
                      *(() if in_place else (tiles,)),
                      *(() if partial is None else (partial,)))
        return Kernel("conv2d_int8_x86", params, workspaces, (frame.loop(*body),))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, Conv2dInt8)
        geo = _geometry(wl)
        weight = typed(inputs, "weight", np.int8)
        check_weights(wl, weight)
        data_zp = typed(inputs, "data_zero_point", np.uint8).astype(np.int32).reshape(1)
        scale = np.asarray(inputs["scale"], dtype=np.float32).reshape(-1)
        args = {
            "data": _packed_data(wl, geo, typed(inputs, "data", np.uint8)),
            **({"weight_taps": weight.reshape(wl.K, -1).astype(np.int32)} if is_depthwise(wl)
               else {"weight_packed": pack_channels_last_tiles(wl, config, weight),
                     "tap_offsets": TileMap(wl).tap_offsets()} if _channels_last_tiles(wl)
               else {"weight_packed": _pack_weights(wl, geo, weight, config),
                     "tap_offsets": (ChannelsLast(wl, geo.inst.per_word).tap_offsets()
                                     if wl.in_layout == "nhwc" else geo.gemm_offsets())}),
            "data_zero_point": data_zp,
            "compensation": compensation(wl.bias, inputs, weight, int(data_zp[0])),
            "scale": scale,
        }
        if wl.out != "f32":
            zp_type = np.uint8 if wl.out == "u8" else np.int8
            args["out_zero_point"] = typed(inputs, "out_zero_point", zp_type).astype(np.int32)
        return {**args, **ResidualBuffers.pack(inputs, wl.residual)}


def _pack_weights(wl: Conv2dInt8, geo: Geometry, weight: np.ndarray, config: Config
                  ) -> np.ndarray:
    """s8 ``[K][C/groups][R][S]`` -> int32 words ``[groups][K/groups][taps x channel words]``
    in the reduction's order, channels zero-padded (bytes for VNNI, 16-bit values else); for
    pixel rows, panels ``[groups][K/groups/width][words][width]`` (16 channels' words of one
    reduction step side by side, as one register loads them)."""
    if isinstance(geo, FlatGeometry):
        return flat_weight_words(weight, geo)
    cg = padded_k(wl.group_in, VNNI)
    values = np.zeros((wl.K, wl.R, wl.S, cg), dtype=np.int8 if geo.inst.per_word == 4 else np.int16)
    values[..., :wl.group_in] = weight.transpose(0, 2, 3, 1)
    tile = None if isinstance(geo, TileGeometry) else pk_tile(config)
    if tile is not None:
        return pack_pixel_row_weights(values, wl.groups, tile[1], geo.inst)
    words = as_words(values).reshape(wl.groups, wl.group_out, geo.words)
    if isinstance(geo, TileGeometry):  # zero weights for an expanded geometry's padding planes
        rows = x86_amx_gemm.amx_blocking(config, wl.group_out, geo.gemm_columns).M
        return x86_amx_gemm.pack_row_tiles(padded_words(words, geo), rows)
    return np.ascontiguousarray(words)


def _packed_data(wl: Conv2dInt8, geo: Geometry, data: np.ndarray) -> np.ndarray:
    """The u8 input as the kernel reads it: NCHW bytes, or a channels-last input's words
    (its bytes where the kernel widens them: ``x86_channels_last``)."""
    if wl.in_layout != "nhwc" or geo.inst.per_word != 4:
        return data
    return np.ascontiguousarray(data).reshape(-1).view(np.int32)


def _channels_last_tiles(wl: Conv2dInt8) -> bool:
    """Whether a channels-last layer runs on AMX tiles here (``x86_amx_channels_last``)."""
    return (x86_dot_gemm.workload_instruction(wl) is VNNI and not is_depthwise(wl)
            and on_tiles(wl) and x86_amx_gemm.host_amx("tdpbusd"))


def _space_geometry(wl: Conv2dInt8) -> Geometry:
    """The geometry a key's space and default are defined on (VNNI's, whatever the host's)."""
    return FlatGeometry(wl, VNNI) if is_flat(wl) else Geometry(wl, VNNI)


def _geometry(wl: Conv2dInt8) -> Geometry:
    """AMX tiles where the host has them and a tile step (64 bytes: 64 channels) stays inside
    one tap, or expanded planes for one group of fewer channels (``x86_expanded``); the
    vector instruction of the host else (and for channels-last layers, which run as pixel
    rows: ``x86_channels_last``)."""
    inst = x86_dot_gemm.workload_instruction(wl)
    if is_flat(wl):
        return FlatGeometry(wl, inst)
    if inst is VNNI and not is_depthwise(wl) and not wl.channels_last \
            and x86_amx_gemm.host_amx("tdpbsud"):
        if wl.group_in % x86_amx_gemm.TILE_K == 0:
            return TileGeometry(wl, inst)
        if expands(wl, inst.per_word):
            return ExpandedGeometry(wl, inst)
    return Geometry(wl, inst)


