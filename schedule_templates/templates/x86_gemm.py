"""x86 templates for ``dense`` and ``batch_matmul``: a BLIS-style blocked GEMM.

The output is computed in register tiles of ``mr`` rows by ``nr`` columns held in vector
accumulators; each step of the reduction broadcasts ``mr`` values of the left operand and loads
``nr`` contiguous values of the right one (dense: weights packed once into ``[N/nr][K][nr]``
micro-panels; batch_matmul: read in place, rows of ``y`` are already contiguous along N).
Cache blocking comes from the middle factors of the splits; the outer blocks of M and N (and
the batch) are fused into one parallel loop. A dense epilogue is applied when the last block
of the reduction stores the tile (earlier blocks store partial sums that the next one reloads).
A dense hints its weights' next reduction block into L2 while it computes on the current one:
inside a model they come from memory (``weight_hints``).

Splits must divide their axis, so an M without a useful divisor (ViT's 197 tokens is prime:
every tile was one row, 2.3x slower than 200 rows) is computed as ``padded_extent(M)`` rows:
the operands get slack the extra rows read (the runtime stages a copy with it), and the extra
rows are never stored (dense: a guarded store; batch_matmul, whose N is an activation axis
too, computes into a padded workspace and copies the real rows and columns out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    IfThen,
    Kernel,
    Load,
    LoopKind,
    Scope,
    Select,
    Stmt,
    Var,
    binop,
    loop,
    store,
)
from schedule_templates.space import ChoiceKnob, Config, ConfigSpace, SplitKnob, divisors
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.choose import (
    ACC_REGISTERS,
    AVX512,
    NARROW_ACCUMULATORS,
    RegisterFile,
    block_split,
    host_registers,
    largest_divisor,
    vregs,
)
from schedule_templates.templates.epilogue import epilogue_arguments, epilogue_stage
from schedule_templates.templates.weight_hints import row_hints
from schedule_templates.workloads import BatchMatmul, Dense, Workload

MAX_NR = 64
MAX_MR = 16
MAX_KU = 8


def padded_extent(extent: int) -> int:
    """The rows (or batch_matmul columns) a GEMM computes for an axis of ``extent``: itself when
    it is small or has a divisor in 4..16 (stored configs of such shapes keep their meaning),
    else the next multiple of 8."""
    if extent <= MAX_MR or any(extent % d == 0 for d in range(4, MAX_MR + 1)):
        return extent
    return -(-extent // 8) * 8


def gemm_space(M: int, N: int, K: int) -> ConfigSpace:
    knobs = (
        SplitKnob("tile_m", M, 3),
        SplitKnob("tile_n", N, 3),
        SplitKnob("tile_k", K, 3),
        ChoiceKnob("outer_order", ("nm", "mn")),
        ChoiceKnob("inner_order", ("nm", "mn")),
    )
    return ConfigSpace(knobs, constraint=_fits_registers)


def _fits_registers(cfg: Config) -> bool:
    mr, nr, ku = cfg["tile_m"][2], cfg["tile_n"][2], cfg["tile_k"][2]
    return mr <= MAX_MR and nr <= MAX_NR and ku <= MAX_KU and mr * vregs(nr) <= ACC_REGISTERS


#: bytes of the right operand's micro-panel (``kc x nr`` floats) the default keeps in L1
PANEL_BYTES = 32 * 1024


def register_tile(M: int, N: int, registers: RegisterFile = AVX512) -> tuple[int, int]:
    """``(mr, nr)`` dividing M and N that do the most multiply-adds per reduction step within
    the accumulator budget of ``registers`` (ties: fewer loads per step, mr broadcasts plus
    nr's vectors, then the wider nr). On BERT's 128x768 denses 8x48
    (24 zmm) ran ~10% faster than 4x64 (16 zmm), the first-fit choice it replaces. On AVX2
    hosts the budget is 14 ymm: AVX-512's 8x48 would need 48 and spill (a 1024^3 dense ran 3x
    slower with it than with 4x16). Widths of whole registers only, where N has any: ViT's
    attention scores (N = 197, computed as 200) took 2 x 50, six ymm and a 2-lane remainder,
    and ran 1.8x slower than 2 x 40 (Zen 3)."""
    best: tuple[int, int, int, int] = (0, 0, 0, 0)
    widths = [nr for nr in divisors(N) if nr <= MAX_NR]
    whole = [nr for nr in widths if nr % registers.lanes == 0]
    for nr in whole or widths:
        mr = largest_divisor(M, min(MAX_MR, registers.accumulators // registers.vregs(nr)))
        best = max(best, (mr * nr, -(mr + registers.vregs(nr)), nr, mr))
    return best[3], best[2]


#: parallel iterations the default asks for (where the shape allows): several per thread, so
#: that two or four threads get even shares
PARALLEL_TASKS = 8


def gemm_default(space: ConfigSpace, M: int, N: int, K: int, batch: int = 1) -> Config:
    registers = host_registers()
    mr, nr = register_tile(M, N, registers)
    # a tile that takes every accumulator of a 16-register file (AVX2's 7 x 16) leaves two
    # registers for the reduction step: unrolled by 4 it ran at 46-62% of the speed of 2
    # (ConvNeXt-T's 49- and 784-row denses on Zen 3; 12 accumulators were level)
    full = registers.accumulators == NARROW_ACCUMULATORS and (
        mr * registers.vregs(nr) == registers.accumulators)
    ku = largest_divisor(K, MAX_KU, prefer=(2, 4) if full else (4, 2))
    tile_m = block_split(M, mr, 96)
    # column blocks of up to 256, fewer panels each where too few parallel iterations are left
    panels = N // nr
    wanted = max(1, panels * batch * tile_m[0] // PARALLEL_TASKS)
    ni = largest_divisor(panels, max(1, min(256 // nr, wanted)))
    return space.from_entities({
        "tile_m": tile_m,
        "tile_n": (panels // ni, ni, nr),
        "tile_k": block_split(K, ku, PANEL_BYTES // (4 * nr)),
        "outer_order": "nm",
        "inner_order": "nm",
    })


OperandA = Callable[[Expr, Expr, Expr], Load]  # (batch, m, k)
OperandB = Callable[[Expr, Expr, Expr, Expr], Load]  # (batch, n-panel, k, j within panel)
OperandC = Callable[[Expr, Expr, Expr], Load]  # (batch, m, n)
Finish = Callable[[Expr, Expr, Expr, Expr], Expr]  # (accumulator, batch, m, n) -> stored value


def gemm_nest(cfg: Config, batch: int, a: OperandA, b: OperandB, c: OperandC,
              finish: Finish | None = None, rows: int | None = None,
              after: Callable[[Expr], Expr] | None = None, hint_b: bool = False) -> Stmt:
    """The loop nest shared by dense and batch_matmul; ``finish`` is the fused epilogue.
    ``hint_b``: hint the right operand's next reduction block into L2 (a dense's weights,
    which inside a model come from memory; ``_next_block_hints``).
    ``rows``: store only rows below it (the splits cover more rows than the output has).
    ``after``: a costly activation applied to the stored tile row by row once the whole
    register tile is stored (on every accumulator at once, its temporaries spilled: a GELU
    epilogue ran at a third of the speed of the same math alone)."""
    mo, mi, mr = cfg["tile_m"]
    no, ni, nr = cfg["tile_n"]
    ko, ki, ku = cfg["tile_k"]
    t, par = loop("t", batch * mo * no, LoopKind.PARALLEL)
    bb = t // (mo * no)
    rest = t % (mo * no)
    jo, io = (rest // mo, rest % mo) if cfg["outer_order"] == "nm" else (rest % no, rest // no)
    kko, k_outer = loop("k_o", ko)
    vj, vj_mk = loop("j_i", ni)
    vi, vi_mk = loop("m_i", mi)
    panel = jo * ni + vj
    m0 = (io * mi + vi) * mr
    n0 = panel * nr
    acc = Buffer("acc", (mr, nr), Scope.LOCAL)
    r, unroll_r = loop("r", mr, LoopKind.UNROLL)
    j, vec_j = loop("j", nr, LoopKind.VECTORIZE)
    k1, k_inner = loop("k_i", ki)
    k2, k_unroll = loop("k_u", ku, LoopKind.UNROLL)
    k = (kko * ki + k1) * ku + k2
    init: Expr = Const(0.0, "float32")
    if ko > 1:
        init = Select(binop("==", kko, 0), init, c(bb, m0 + r, n0 + j))
    result: Expr = acc[r, j]
    if finish is not None:
        result = finish(acc[r, j], bb, m0 + r, n0 + j)
        if ko > 1:  # only the last reduction block stores the finished value
            result = Select(binop("==", kko, ko - 1), result, acc[r, j])
    hints = _next_block_hints(b, bb, panel, k + ki * ku, nr, vi, mi) if hint_b else []
    stages: list[Stmt] = [
        unroll_r(vec_j(store(acc[r, j], init))),
        k_inner(k_unroll(*hints, unroll_r(vec_j(
            store(acc[r, j], a(bb, m0 + r, k) * b(bb, panel, k, j) + acc[r, j]))))),
        unroll_r(_guarded(m0 + r, rows, vec_j(store(c(bb, m0 + r, n0 + j), result)))),
    ]
    if after is not None:
        row, rows_loop = loop("r_a", mr)  # serial: one row's registers live at a time
        stored = c(bb, m0 + row, n0 + j)
        activation: Stmt = rows_loop(_guarded(m0 + row, rows, vec_j(store(stored,
                                                                            after(stored)))))
        stages.append(activation if ko == 1
                      else IfThen(binop("==", kko, ko - 1), (activation,)))
    tile = Allocate(acc, tuple(stages))
    inner = vj_mk(vi_mk(tile)) if cfg["inner_order"] == "nm" else vi_mk(vj_mk(tile))
    return par(k_outer(inner))


def _next_block_hints(b: OperandB, bb: Expr, panel: Expr, k_next: Expr, nr: int, vi: Var,
                      mi: int) -> list[Stmt]:
    """Hints, for one reduction step, of the right operand's row ``k_next`` of the panel (one
    reduction block ahead; past the last block that is the next panel's first), the ``mi`` row
    tiles that reuse a block taking turns. Weights cold (a cache flush before each run, as
    inside a model), BERT-base's 128x768x3072 dense: 4.94 -> 4.09 ms; warm 3.94 -> 3.78. A
    hint per line in every tile gave 4.42 flushed, and a branch to give them in the first tile
    only made the kernel 80% slower (its accumulators spilled)."""
    return row_hints(lambda j: b(bb, panel, k_next, j), nr, vi, mi)


def _guarded(row: Expr, rows: int | None, body: Stmt) -> Stmt:
    return body if rows is None else IfThen(row < rows, (body,))


@register
class DenseX86(Template):
    name = "dense.x86"
    op = "dense"
    target_kind = "llvm"
    version = 1
    fuses_epilogue = True

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, Dense)
        return gemm_space(padded_extent(wl.M), wl.N, wl.K)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, Dense)
        return gemm_default(self.space(wl), padded_extent(wl.M), wl.N, wl.K)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, Dense)
        nr = config["tile_n"][2]
        extra = padded_extent(wl.M) - wl.M  # rows computed past the output, never stored
        data = Buffer("data", (wl.M, wl.K), slack=extra * wl.K)
        packed = Buffer("weight_packed", (wl.N // nr, wl.K, nr))
        out = Buffer("out", (wl.M, wl.N), slack=extra * wl.N)  # partial sums are reloaded
        epilogue = epilogue_stage(wl)
        if extra and epilogue.residual is not None:
            epilogue = dataclasses.replace(epilogue, residual=dataclasses.replace(
                epilogue.residual, slack=extra * wl.N))
        body = gemm_nest(
            config, 1,
            a=lambda _b, m, k: data[m, k],
            b=lambda _b, p, k, j: packed[p, k, j],
            c=lambda _b, m, n: out[m, n],
            finish=(lambda v, _b, m, n: (epilogue.apply_linear if epilogue.deferred
                                          else epilogue.apply)(v, n, (m, n)))
            if wl.epilogue else None,
            rows=wl.M if extra else None,
            after=epilogue.activation if epilogue.deferred else None,
            hint_b=True,
        )
        return Kernel("dense_x86", (data, packed, *epilogue.buffers, out), (), (body,))

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        wl = _as(workload, Dense)
        nr = config["tile_n"][2]
        weight = np.asarray(inputs["weight"], dtype=np.float32)
        packed = weight.reshape(wl.N // nr, nr, wl.K).transpose(0, 2, 1)
        return {"data": inputs["data"], "weight_packed": np.ascontiguousarray(packed),
                **epilogue_arguments(wl, inputs)}


@register
class BatchMatmulX86(Template):
    name = "batch_matmul.x86"
    op = "batch_matmul"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, BatchMatmul)
        return gemm_space(padded_extent(wl.M), padded_extent(wl.N), wl.K)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, BatchMatmul)
        return gemm_default(self.space(wl), padded_extent(wl.M), padded_extent(wl.N), wl.K,
                            wl.B)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, BatchMatmul)
        nr = config["tile_n"][2]
        mp, np_ = padded_extent(wl.M), padded_extent(wl.N)
        # extra rows of x and columns of y read into the next ones (slack after the last)
        x = Buffer("x", (wl.B, wl.M, wl.K), slack=(mp - wl.M) * wl.K)
        y = Buffer("y", (wl.B, wl.K, wl.N), slack=np_ - wl.N)
        out = Buffer("out", (wl.B, wl.M, wl.N))
        if (mp, np_) == (wl.M, wl.N):
            body = gemm_nest(
                config, wl.B,
                a=lambda b, m, k: x[b, m, k],
                b=lambda b, p, k, j: y[b, k, p * nr + j],
                c=lambda b, m, n: out[b, m, n],
            )
            return Kernel("batch_matmul_x86", (x, y, out), (), (body,))
        padded = Buffer("out_padded", (wl.B, mp, np_), Scope.WORKSPACE)
        body = gemm_nest(
            config, wl.B,
            a=lambda b, m, k: x[b, m, k],
            b=lambda b, p, k, j: y[b, k, p * nr + j],
            c=lambda b, m, n: padded[b, m, n],
        )
        q, rows = loop("q", wl.B * wl.M, LoopKind.PARALLEL)
        n, vec_n = loop("n", wl.N, LoopKind.VECTORIZE)
        copy = rows(vec_n(store(out[q // wl.M, q % wl.M, n], padded[q // wl.M, q % wl.M, n])))
        return Kernel("batch_matmul_x86", (x, y, out), (padded,), (body, copy))


