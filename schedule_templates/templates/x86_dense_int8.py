"""x86 template for ``dense_int8``: int8 register tiles with requantization fused.

On hosts with AVX-512 VNNI each step of the reduction broadcasts 4 bytes of an activation row
as one 32-bit word and ``vpdpbusd`` multiplies them with 16 columns' 4 packed weight bytes,
adding into int32 lanes (the loop nest is ``x86_dot_gemm``'s). Elsewhere (AVX2) the same step is
two ``vpmaddwd`` on 16-bit pairs: the activations are first widened into a workspace of words
of two 16-bit values, the weights packed as such pairs; the arithmetic stays exact. The space
is the same on both, so a config means one tiling everywhere (``int8_instruction``).

The activation zero point is folded in at pack time: ``sum((a - zp) * w) = sum(a * w) -
zp * sum(w)``, the second term (plus the int32 bias, if any) one int32 per column, so the hot
loop sees raw bytes. N is computed padded to whole 16-lane registers and K to groups of 4 (zero
weights); with padded columns the tiles go to a workspace and only the real ones are copied out.
The output stage converts to fp32, scales, clamps to the output range less its zero point,
rounds half to even, adds the zero point and narrows: onnxruntime's QLinearMatMul rounding
(clamping before rounding gives the same integers as after, since the bounds are integers)
without an integer overflow on the way. With ``add`` (a quantized addition of a per-column
constant fused after the product, ``DenseInt8``), the 8-bit value is not stored: it is
dequantized, the constant added and the sum quantized again in registers, in the fp32 operations
of the unfused glue kernel (``ops.quant.QuantizedBinary``), so the bytes are the same.

On hosts with AMX (``x86_amx_gemm.host_amx``) the same config lowers to tile instructions
(``tdpbusd``: 16 rows x 64 bytes x 16 columns a step) with the same output stage; the weights
are packed in panels of 16 columns with K padded to whole 64-byte tile steps.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Expr,
    Kernel,
    Scope,
    Stmt,
    cast,
    store,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.requantize import (
    OUT_DTYPES,
    AddBuffers,
    compensation,
    pad_to,
    requantized,
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
    padded_n,
    partial_buffer,
    typed,
)
from schedule_templates.templates.x86_int8_stages import copy_rows, word_rows
from schedule_templates.workloads import DenseInt8, Workload
from schedule_templates.workloads.lowp import check_weights


@register
class DenseInt8X86(Template):
    name = "dense_int8.x86"
    op = "dense_int8"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, DenseInt8)
        return dot_space(wl.M, padded_n(wl.N), padded_k(wl.K, VNNI), VNNI)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, DenseInt8)
        return dot_default(self.space(wl), wl.M, padded_n(wl.N), padded_k(wl.K, VNNI),
                           x86_dot_gemm.workload_instruction(wl))

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, DenseInt8)
        inst = x86_dot_gemm.workload_instruction(wl)
        plan = x86_amx_gemm.amx_blocking(config, wl.M, wl.N) if _on_tiles(wl) else None
        if plan is None:
            nr = config["tile_n"][2]
            n_pad, rows_m = padded_n(wl.N), wl.M
            words = padded_k(wl.K, inst) // inst.per_word
            in_place = _reads_data_in_place(wl, inst)
        else:  # rows padded to whole register blocks, K to whole tile steps (zero past K)
            nr, n_pad, rows_m = 16, plan.N, plan.M
            words = x86_amx_gemm.padded_words(wl.K)
            in_place = _amx_in_place(wl, plan)
        stages: list[Stmt] = []
        workspaces: list[Buffer] = []
        if in_place:
            data = Buffer("data", (wl.M, words), dtype="int32")  # 4 u8 per word
            rows = data
        else:
            data = Buffer("data", (wl.M, wl.K), dtype="uint8")
            rows = Buffer("data_words", (rows_m, words), Scope.WORKSPACE, "int32")
            workspaces.append(rows)
            stages.append(word_rows(lambda m, w: rows[m, w],
                                    lambda m, k: cast("int32", data[m, k]),
                                    wl.M, wl.K, words, inst))
        packed = Buffer("weight_packed", (n_pad // nr, words, nr), dtype="int32")
        compensation = Buffer("compensation", (n_pad,), dtype="int32")
        scale = Buffer("scale", (n_pad,) if wl.scale == "channel" else (1,))
        zero_point = Buffer("out_zero_point", (1,), dtype="int32")
        added = AddBuffers(n_pad) if wl.add != "none" else None
        out = Buffer("out", (wl.M, wl.N), dtype=OUT_DTYPES[wl.add if added else wl.out])
        tiles = out if n_pad == wl.N else Buffer("out_padded", (wl.M, n_pad), Scope.WORKSPACE,
                                                  out.dtype)

        def finish(acc: Expr, m: Expr, n: Expr) -> Stmt:
            value = requantized(acc + compensation[n],
                                scale[n if wl.scale == "channel" else 0], zero_point[0], wl.out)
            if added is not None:
                value = added.expr(value, n, wl.add)
            return store(tiles[m, n], value)

        partial = None if plan is not None else partial_buffer(config, wl.M, n_pad, inst)
        if plan is None:
            stages.append(dot_nest(config, inst, a=lambda m, w: rows[m, w],
                                   b=lambda p, w, j: packed[p, w, j], finish=finish,
                                   partial=partial, hint_b=True))
        else:
            operands = x86_amx_gemm.dense_operands("tdpbusd", rows, packed, words)
            stages.append(x86_amx_gemm.amx_nest(plan, operands, "int32", finish, wl.M))
        if tiles is not out:
            workspaces.append(tiles)
            stages.append(copy_rows(tiles, lambda m, n: out[m, n], wl.M, wl.N))
        if partial is not None:
            workspaces.append(partial)
        params = (data, packed, compensation, scale,
                  *(() if wl.out == "f32" else (zero_point,)),
                  *(added.params if added else ()), out)
        name = "dense_int8_x86" if plan is None else "dense_int8_amx"
        return Kernel(name, params, tuple(workspaces), tuple(stages))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, DenseInt8)
        inst = x86_dot_gemm.workload_instruction(wl)
        weight = typed(inputs, "weight", np.int8)
        check_weights(wl, weight)
        data = typed(inputs, "data", np.uint8)
        data_zp = int(typed(inputs, "data_zero_point", np.uint8).reshape(-1)[0])
        scale = np.asarray(inputs["scale"], dtype=np.float32).reshape(-1)
        if _on_tiles(wl):
            plan = x86_amx_gemm.amx_blocking(config, wl.M, wl.N)
            n_pad, in_place = plan.N, _amx_in_place(wl, plan)
            packed = pack_amx_panels(weight, n_pad)
        else:
            n_pad, in_place = padded_n(wl.N), _reads_data_in_place(wl, inst)
            packed = pack_int8_panels(weight, n_pad, config["tile_n"][2], inst)
        args = {
            # activations are only reinterpreted (the same bytes as words), not transformed
            "data": as_words(data) if in_place else data,
            "weight_packed": packed,
            "compensation": pad_to(compensation(wl.bias, inputs, weight, data_zp), n_pad),
            "scale": pad_to(scale, n_pad) if wl.scale == "channel" else scale,
        }
        if wl.out != "f32":
            zp_type = np.uint8 if wl.out == "u8" else np.int8
            args["out_zero_point"] = typed(inputs, "out_zero_point", zp_type).astype(np.int32)
        if wl.add != "none":
            args.update(AddBuffers.pack(inputs, n_pad))
        return args


def _on_tiles(wl: DenseInt8) -> bool:
    """AMX where the host has it (every such CPU has VNNI: a test forcing another instruction,
    or a key of another arithmetic, ``weights=sat16``, takes the vector kernel)."""
    return (x86_dot_gemm.workload_instruction(wl) is VNNI
            and x86_amx_gemm.host_amx("tdpbusd"))


def _amx_in_place(wl: DenseInt8, plan: x86_amx_gemm.AmxBlocking) -> bool:
    """Tiles read the activations as they are when every tile row lies inside them."""
    return wl.M == plan.M and wl.K % x86_amx_gemm.TILE_K == 0


def pack_amx_panels(weight: np.ndarray, columns: int) -> np.ndarray:
    """s8 ``weight[N, K]`` -> int32 words ``[columns/16][K'/4][16]``, K padded with zero
    weights to whole tile steps (64 bytes), zero columns up to ``columns``."""
    n, k = weight.shape
    words = x86_amx_gemm.padded_words(k)
    values = np.zeros((columns, 4 * words), dtype=np.int8)
    values[:n, :k] = weight
    return as_words(pack_panels(values, 16, 4)).reshape(columns // 16, words, 16)


def _reads_data_in_place(wl: DenseInt8, inst: DotInstruction) -> bool:
    """Byte words (VNNI, pmaddubsw) read rows of whole 4-byte words as they are; 16-bit words
    are repacked."""
    return inst.per_word == 4 and wl.K % inst.group == 0


def pack_int8_panels(weight: np.ndarray, columns: int, nr: int, inst: DotInstruction
                     ) -> np.ndarray:
    """s8 ``weight[N, K]`` -> int32 words ``[columns/nr][K'/per_word][nr]``: zero rows up to
    ``columns``, K zero-padded to whole groups, each word ``per_word`` values of one column
    (bytes for VNNI, 16-bit values for vpmaddwd)."""
    n, k = weight.shape
    k_pad = padded_k(k, inst)
    values = np.zeros((columns, k_pad), dtype=np.int8 if inst.per_word == 4 else np.int16)
    values[:n, :k] = weight
    words = as_words(pack_panels(values, nr, inst.per_word))
    return words.reshape(columns // nr, k_pad // inst.per_word, nr)
