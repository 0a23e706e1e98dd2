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
computed and dropped) rounded up to whole registers; the tiles go to a workspace and the real
pixels are copied into NCHW, unless nothing is dropped (then they are stored in place). The
per-word tap offsets are a constant input computed at pack time.

Depthwise layers (one input channel per group) have a kernel of their own
(``x86_depthwise_int8``): on this nest three quarters of each word would be padding.

On small maps the dropped columns are much of the work (7x7: 64 columns for 49 pixels; 14x14
with a 3x3 window: 224 for 196), so the space has a second orientation, ``pk_tile=RxW``: rows are
the real output pixels (a pixel's word of the phased input broadcast, its address computed per
row, so no column is dropped) and columns are output channels (16 per register, the weights
packed in panels as ``dense_int8``'s), R pixels by W channels per register tile (``tile_m`` and
``tile_n`` mean nothing there and take one value, so no two valid configs are one kernel). Its
stores go one byte at a time into NCHW (a register holds 16 channels of one pixel), which pays
where each output takes many reduction words: the default takes it where that cost is below
the dropped columns' (VNNI hosts).
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
    binop,
    cast,
    loop,
    store,
)
from schedule_templates.space import ChoiceKnob, Config, ConfigSpace
from schedule_templates.templates import x86_dot_gemm
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.choose import LANES
from schedule_templates.templates.requantize import (
    OUT_DTYPES,
    ResidualBuffers,
    compensation,
    requantized,
    requantized_int,
)
from schedule_templates.templates.x86_depthwise_int8 import (
    depthwise_default,
    depthwise_kernel,
    depthwise_space,
    is_depthwise,
)
from schedule_templates.templates.x86_dot_gemm import (
    VNNI,
    DotInstruction,
    as_words,
    dot_default,
    dot_nest,
    dot_space,
    pack_panels,
    padded_k,
    partial_buffer,
    typed,
)
from schedule_templates.templates.x86_int8_phases import Geometry, phase_stage
from schedule_templates.templates.x86_int8_stages import copy_rows
from schedule_templates.workloads import Conv2dInt8, Workload

#: the ``pk_tile`` knob: ``none`` (channel rows, what the template did before) or pixel rows,
#: ``RxW``: R pixels by W output channels per register tile
PK_TILES = ("none", "6x64", "4x64", "5x64", "7x32", "8x32", "6x32", "4x32", "12x16")
#: what one pixel-row register of 16 channels costs to store into NCHW, one byte per lane, in
#: reduction words' time (the pk default weighs it against the dropped columns it saves)
PK_STORE_WORDS = 16


@register
class Conv2dInt8X86(Template):
    name = "conv2d_int8.x86"
    op = "conv2d_int8"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, Conv2dInt8)
        geo = Geometry(wl, VNNI)  # the space is the same whatever the instruction
        if is_depthwise(wl):
            return depthwise_space(geo.columns)
        plain = dot_space(wl.group_out, geo.columns, geo.reduction, VNNI)
        kg = wl.group_out

        def fits(cfg: Config) -> bool:
            tile = pk_tile(cfg)
            if tile is None:
                return plain.constraint is not None and plain.constraint(cfg)
            # pixel rows use neither tile_m nor tile_n: one value each, no duplicate kernels
            return (kg % tile[1] == 0 and cfg["tile_m"] == (kg, 1, 1)
                    and cfg["tile_n"] == (geo.columns // LANES, 1, LANES)
                    and cfg["tile_k"][2] <= x86_dot_gemm.MAX_KU)

        return ConfigSpace((*plain.knobs, ChoiceKnob("pk_tile", PK_TILES, appended=True)),
                           constraint=fits)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, Conv2dInt8)
        geo = Geometry(wl, VNNI)
        space = self.space(wl)
        if is_depthwise(wl):
            return depthwise_default(space, geo.columns)
        inst = x86_dot_gemm.int8_instruction()
        plain = dot_default(space, wl.group_out, geo.columns, geo.reduction, inst)
        pk = _pixel_rows_default(wl, geo, inst)
        if pk is None:
            return plain
        return space.from_entities({
            **{name: value for name, _, value in plain.entities},
            "tile_m": (wl.group_out, 1, 1), "tile_n": (geo.columns // LANES, 1, LANES),
            "pk_tile": pk})

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, Conv2dInt8)
        geo = Geometry(wl, x86_dot_gemm.int8_instruction())
        if is_depthwise(wl):
            layout = (geo.phase_h, geo.phase_w, geo.columns, geo.plane)
            return depthwise_kernel(wl, config, layout)
        inst, nr = geo.inst, config["tile_n"][2]
        kg = wl.group_out
        tile = pk_tile(config)
        pk = tile is not None
        width = tile[1] if tile is not None else 0
        data = Buffer("data", (wl.N, wl.C, wl.H, wl.W), dtype="uint8")
        weight = (Buffer("weight_packed", (wl.groups, kg // width, geo.words, width),
                         dtype="int32") if pk
                  else Buffer("weight_packed", (wl.groups, kg, geo.words), dtype="int32"))
        taps = Buffer("tap_offsets", (geo.words,), dtype="int32")
        data_zp = Buffer("data_zero_point", (1,), dtype="int32")
        comp = Buffer("compensation", (wl.K,), dtype="int32")
        scale = Buffer("scale", (wl.K,) if wl.scale == "channel" else (1,))
        out_zp = Buffer("out_zero_point", (1,), dtype="int32")
        fused = None if wl.residual == "none" else ResidualBuffers(wl.output_shape(),
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
                              fused.residual[n, k, at[0], at[1]])

        phased = Buffer("phased", (geo.phases * geo.channel_words * geo.plane,),
                        Scope.WORKSPACE, "int32")
        tiles = Buffer("tiles", (kg, geo.columns), Scope.WORKSPACE, OUT_DTYPES[wl.out])
        partial = partial_buffer(config, kg, geo.columns, inst)

        ng, images_loop = loop("ng", wl.N * wl.groups)
        n, g = ng // wl.groups, ng % wl.groups
        prepare = phase_stage(wl, geo, data, data_zp, phased, n, g)
        if tile is not None:
            pixels = wl.out_h * wl.out_w
            tiling = _pixel_rows_tiling(config, tile, pixels, kg)
            partial = partial_buffer(tiling, tiling["tile_m"][0] * tiling["tile_m"][2], kg,
                                     inst)

            def pixel(m: Expr) -> Expr:  # row m's column in a phase plane (last row repeated)
                q = binop("min", m, pixels - 1)
                return (q // wl.out_w) * geo.phase_w + q % wl.out_w

            def finish_pixel(acc: Expr, m: Expr, j: Expr) -> Stmt:
                at = (m // wl.out_w, m % wl.out_w)
                return store(out[n, g * kg + j, at[0], at[1]], output(acc, g * kg + j, at))

            nest = dot_nest(tiling, inst,
                            a=lambda m, w: phased[cast("int64", taps[w]) + pixel(m)],
                            b=lambda p, w, j: weight[g, p, w, j], finish=finish_pixel,
                            partial=partial, rows=pixels)
            workspaces = (phased, *(() if partial is None else (partial,)))
            return Kernel("conv2d_int8_x86", params, workspaces,
                          (images_loop(prepare, nest),))

        def finish(acc: Expr, m: Expr, q: Expr) -> Stmt:
            k = g * kg + m
            if geo.in_place:
                return store(out[n, k, 0, q], output(acc, k, (Const(0), q)))
            # the tiles hold phase-width rows (dropped columns too): the fused addition, if
            # any, is done on the copy, where each column is a real output pixel
            value = requantized(acc + comp[k], scale[k if wl.scale == "channel" else 0],
                                out_zp[0], wl.out)
            return store(tiles[m, q], value)

        nest = dot_nest(config, inst, a=lambda m, w: weight[g, m, w],
                        b=lambda p, w, j: phased[cast("int64", taps[w]) + p * nr + j],
                        finish=finish,
                        partial=partial, swap=True)
        body: list[Stmt] = [prepare, nest]
        if not geo.in_place:
            oh_count, ow_stride = wl.out_h, geo.phase_w

            def copied(row: Expr, ow: Expr) -> Expr:
                tile = tiles[row // oh_count, (row % oh_count) * ow_stride + ow]
                if fused is None:
                    return tile
                return fused.expr(tile, fused.residual[n, g * kg + row // oh_count,
                                                       row % oh_count, ow])

            body.append(copy_rows(
                copied, lambda row, ow: out[n, g * kg + row // oh_count, row % oh_count, ow],
                kg * wl.out_h, wl.out_w))
        workspaces = (phased, *(() if geo.in_place else (tiles,)),
                      *(() if partial is None else (partial,)))
        return Kernel("conv2d_int8_x86", params, workspaces, (images_loop(*body),))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, Conv2dInt8)
        geo = Geometry(wl, x86_dot_gemm.int8_instruction())
        weight = typed(inputs, "weight", np.int8)
        data_zp = typed(inputs, "data_zero_point", np.uint8).astype(np.int32).reshape(1)
        scale = np.asarray(inputs["scale"], dtype=np.float32).reshape(-1)
        args = {
            "data": typed(inputs, "data", np.uint8),
            **({"weight_taps": weight.reshape(wl.K, -1).astype(np.int32)} if is_depthwise(wl)
               else {"weight_packed": _pack_weights(wl, geo, weight, config),
                     "tap_offsets": geo.tap_offsets()}),
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
    cg = padded_k(wl.group_in, VNNI)
    values = np.zeros((wl.K, wl.R, wl.S, cg), dtype=np.int8 if geo.inst is VNNI else np.int16)
    values[..., :wl.group_in] = weight.transpose(0, 2, 3, 1)
    tile = pk_tile(config)
    if tile is not None:
        width = tile[1]
        rows = values.reshape(wl.groups, wl.group_out, -1)
        panels = np.stack([pack_panels(rows[g], width, geo.inst.per_word)
                           for g in range(wl.groups)])
        return as_words(panels).reshape(wl.groups, wl.group_out // width, geo.words, width)
    words = as_words(values).reshape(wl.groups, wl.group_out, geo.words)
    return np.ascontiguousarray(words)


def pk_tile(config: Config) -> tuple[int, int] | None:
    """(pixels, channels) of a pixel-row config's register tile; None for channel rows."""
    value = str(config["pk_tile"])
    return None if value == "none" else pk_tile_of(value)


def _pixel_rows_tiling(config: Config, tile: tuple[int, int], pixels: int, kg: int) -> Config:
    """A pixel-row config as the tiling ``dot_nest`` reads: rows are pixels (``tile[0]`` per
    register tile, the last tile's extra rows computed and not stored), columns channels."""
    rows, width = tile
    tiles = -(-pixels // rows)
    entities = {"tile_m": (tiles, 1, rows), "tile_n": (kg // width, 1, width),
                "tile_k": config["tile_k"], "outer_order": config["outer_order"],
                "inner_order": config["inner_order"], "parallel": config["parallel"]}
    return Config(config.index, tuple((name, "sp" if name.startswith("tile") else "ot", value)
                                      for name, value in entities.items()))


def _pixel_rows_default(wl: Conv2dInt8, geo: Geometry, inst: DotInstruction) -> str | None:
    """The ``pk_tile`` where pixel rows beat channel rows for ``wl``, else None: the
    columns the default orientation computes against the pixels rounded up to whole tiles,
    each output paying its lane-by-lane store on top of its reduction words."""
    kg = wl.group_out
    if inst is not VNNI or kg % LANES:
        return None
    pixels = wl.out_h * wl.out_w
    # fewest rows computed, then the most accumulators, then the widest: ResNet-50's 7x7 maps
    # (49 pixels) run best as 7 x 32, its 14x14 ones as 4 x 64 or 7 x 32 (Zen 4, int8 layers
    # timed alone: 1.11-1.29x the channel-row default)
    tiles = [(r, w) for r, w in map(pk_tile_of, PK_TILES[1:]) if kg % w == 0]
    if not tiles:
        return None
    rows, width = min(tiles, key=lambda rw: (-(-pixels // rw[0]) * rw[0], -rw[0] * rw[1],
                                             -rw[1]))
    computed = -(-pixels // rows) * rows
    if computed * (geo.words + PK_STORE_WORDS) >= 0.97 * geo.columns * geo.words:
        return None
    return f"{rows}x{width}"


def pk_tile_of(value: str) -> tuple[int, int]:
    rows, width = value.split("x")
    return int(rows), int(width)

