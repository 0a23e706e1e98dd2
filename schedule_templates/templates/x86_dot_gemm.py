"""The blocked GEMM of x86 dot-product instructions, shared by the int8 and bf16 dense templates.

AVX-512 VNNI (``vpdpbusd``: 4 u8 x s8 products per 32-bit lane) and AVX-512 BF16
(``vdpbf16ps``: 2 bf16 products per fp32 lane) both reduce a small group of K elements into one
lane. So K is walked in groups: the left operand's ``group`` consecutive values of a row are read
as one 32-bit word and broadcast, and the weights are packed into ``[N/nr][K/group][nr][group]``
micro-panels, so one 64-byte load gives 16 lanes of their own group each. Register tiles, the
fused parallel loop over M and N blocks and the K blocking follow ``x86_gemm``; when K is split
into blocks, partial sums go to a workspace of accumulators and only the last block applies the
output stage (the output type may be too narrow to hold a partial sum).

The plain fp32 template's space would not do: the panel width must be a whole number of
16-lane registers (an instruction exists only at that width), and the reduction is in groups.

Hosts without VNNI (AVX2, or AVX-512 without VNNI) run int8 on ``vpmaddwd`` (``PMADDWD``):
u8 and s8 widened to 16 bits, two products per 32-bit lane, exact. Its space is VNNI's (groups
of 4 K values, each taken as two instructions on 16-bit pairs), so one template, one space and
one config mean the same tiling on every host; ``int8_instruction`` picks the instruction of the
host that lowers, and records never mix since a device class names its ISA level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.errors import InvalidConfigError, InvalidWorkloadError
from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    IfThen,
    Load,
    LoopKind,
    Scope,
    Select,
    Stmt,
    binop,
    intrinsic,
    loop,
    store,
)
from schedule_templates.space import ChoiceKnob, Config, ConfigSpace, SplitKnob
from schedule_templates.templates.choose import ACC_REGISTERS, LANES, largest_divisor, three_way
from schedule_templates.templates.weight_hints import row_hints

MAX_NR = 64
MAX_MR = 16
MAX_KU = 8


@dataclasses.dataclass(frozen=True)
class DotInstruction:
    """One dot-product instruction: its IR intrinsic, the K elements a step of the reduction
    takes per lane (``steps`` instructions, each on one 32-bit word of ``group / steps``
    values), the accumulator type, and how many 16-lane accumulators fit in registers."""

    intrinsic: str
    group: int
    acc_dtype: str
    steps: int = 1
    acc_vectors: int = ACC_REGISTERS

    @property
    def per_word(self) -> int:
        """K values in one 32-bit word of an operand."""
        return self.group // self.steps

    @property
    def zero(self) -> Const:
        return Const(0.0, "float32") if self.acc_dtype == "float32" else Const(0, "int32")


VNNI = DotInstruction("vpdpbusd", 4, "int32")
BF16 = DotInstruction("dpbf16ps", 2, "float32")
# 16 ymm registers: 6 accumulators of 16 lanes are 12 of them, leaving room for the panel's
# loads and a broadcast
PMADDWD = DotInstruction("pmaddwd", 4, "int32", steps=2, acc_vectors=6)
# VNNI's bytes and layout through vpmaddubsw + vpmaddwd by ones (``llvm_x86_int``): exact for
# narrow weights only; 5 accumulators of 16 lanes leave registers for the ones, the loads and
# the broadcast (6 spilled in a register-tile model of the nest on Zen 3); pixel rows of
# 5 x 16 (``x86_pixel_rows``) beat channel rows by 15-35% on 7x7 maps (Zen 3)
PMADDUBSW = DotInstruction("pmaddubsw", 4, "int32", acc_vectors=5)


def int8_instruction(narrow: bool = False) -> DotInstruction:
    """The int8 instruction of this host: VNNI where it has AVX-512 VNNI; else, for narrow
    weights (all within [-64, 64], the workloads' ``weights=narrow``), vpmaddubsw, exact
    for them; else vpmaddwd."""
    from schedule_templates.codegen.llvm_jit import host_features

    if "+avx512vnni" in host_features().split(","):
        return VNNI
    return PMADDUBSW if narrow else PMADDWD


def workload_instruction(workload: object) -> DotInstruction:
    """The int8 instruction a ``dense_int8`` or ``conv2d_int8`` lowers to here (its
    ``weights`` field says whether they are narrow); ``weights=sat16`` is vpmaddubsw's own
    arithmetic, so vpmaddubsw on every host."""
    weights = getattr(workload, "weights", "full")
    return PMADDUBSW if weights == "sat16" else int8_instruction(weights == "narrow")


def padded_n(N: int) -> int:
    """Columns computed: N rounded up to whole 16-lane registers (the rest is never stored)."""
    return -(-N // LANES) * LANES


def padded_k(K: int, inst: DotInstruction) -> int:
    """K rounded up to whole groups (the padding holds zero weights)."""
    return -(-K // inst.group) * inst.group


def check_shape(op: str, N: int, K: int, inst: DotInstruction) -> None:
    """The packed layout needs whole registers of N and whole groups of K."""
    if N % LANES or K % inst.group:
        raise InvalidWorkloadError(
            f"{op} on x86 needs N a multiple of {LANES} and K a multiple of {inst.group} "
            f"(got N={N}, K={K})"
        )


def dot_space(M: int, N: int, K: int, inst: DotInstruction) -> ConfigSpace:
    knobs = (
        SplitKnob("tile_m", M, 3),
        SplitKnob("tile_n", N, 3),
        SplitKnob("tile_k", K // inst.group, 3),  # in groups of K
        ChoiceKnob("outer_order", ("nm", "mn")),  # which block index varies fastest in the
        ChoiceKnob("inner_order", ("nm", "mn")),  # parallel loop / inside one thread's block
        # the blocks threads split: M and N blocks fused, or only one axis (the other serial
        # inside each thread, which shares that thread's panel of weights or rows of data)
        ChoiceKnob("parallel", ("mn", "m", "n")),
    )
    return ConfigSpace(knobs, constraint=_fits)


def _fits(cfg: Config) -> bool:
    mr, nr, ku = cfg["tile_m"][2], cfg["tile_n"][2], cfg["tile_k"][2]
    return (nr % LANES == 0 and nr <= MAX_NR and mr <= MAX_MR and ku <= MAX_KU
            and mr * (nr // LANES) <= ACC_REGISTERS)


def dot_default(space: ConfigSpace, M: int, N: int, K: int, inst: DotInstruction) -> Config:
    """A config for ``inst``'s registers (N and K already padded); in every space of the
    operator whatever the host, since the space does not depend on the instruction."""
    wide = inst.acc_vectors >= 12
    nr = largest_divisor(N, MAX_NR if wide else LANES,
                         prefer=(64, 48, 32, 16) if wide else (16,))
    mr = largest_divisor(M, min(MAX_MR, inst.acc_vectors // (nr // LANES)),
                         prefer=(6, 8, 4) if wide else (6, 4, 5, 3))
    groups = K // inst.group
    # vpmaddwd takes a group in two instructions: unrolled by 2 groups, in K blocks of 512, it
    # ran level with 4 groups in blocks of 256 or up to 10% faster (medians of interleaved
    # runs on ResNet-50's int8 convs and BERT's int8 denses, Zen 3)
    ku = largest_divisor(groups, MAX_KU, prefer=(4, 2) if wide else (2, 1))
    return space.from_entities({
        "tile_m": three_way(M, mr, 96),
        "tile_n": three_way(N, nr, 256),
        # VNNI: one block (its byte panels stay in L2 at these sizes); vpmaddwd's 16-bit panels
        # are twice as large: blocks of 512 K values, partial sums through the workspace
        "tile_k": three_way(groups, ku, groups if wide else 128),
        "outer_order": "nm",
        "inner_order": "nm",
        "parallel": "mn",
    })


OperandA = Callable[[Expr, Expr], Load]  # (m, k word) -> one 32-bit word of the row
OperandB = Callable[[Expr, Expr, Expr], Load]  # (n panel, k word, j within panel)
Finish = Callable[[Expr, Expr, Expr], Stmt]  # (accumulator, m, n) -> the output store


def partial_buffer(cfg: Config, M: int, N: int, inst: DotInstruction) -> Buffer | None:
    """The workspace of partial sums a config with several K blocks needs (None for one)."""
    if cfg["tile_k"][0] == 1:
        return None
    return Buffer("partial", (M, N), Scope.WORKSPACE, inst.acc_dtype)


def dot_nest(cfg: Config, inst: DotInstruction, a: OperandA, b: OperandB, finish: Finish,
             partial: Buffer | None, swap: bool = False, rows: int | None = None,
             hint_b: bool = False) -> Stmt:
    """The blocked nest: ``a`` is broadcast per row, ``b`` loaded per 16 columns; ``swap``
    passes them to the instruction the other way round (VNNI's first operand is the unsigned
    one: a convolution broadcasts signed weights and loads unsigned activations). With
    ``rows``, only rows below it are finished (the nest computes more): the test stands
    outside the vectorized loop, so a fused activation stays vectorized. ``hint_b``: hint the
    next reduction block of ``b`` (a dense's weights) into L2 (``weight_hints``)."""
    mo, mi, mr = cfg["tile_m"]
    no, ni, nr = cfg["tile_n"]
    ko, ki, ku = cfg["tile_k"]
    kko, k_outer = loop("k_o", ko)
    blocks, (jo, io) = block_loops(cfg["parallel"], cfg["outer_order"], mo, no)
    vj, vj_mk = loop("j_i", ni)
    vi, vi_mk = loop("m_i", mi)
    panel = jo * ni + vj
    m0 = (io * mi + vi) * mr
    n0 = panel * nr
    acc = Buffer("acc", (mr, nr), Scope.LOCAL, inst.acc_dtype)
    r, unroll_r = loop("r", mr, LoopKind.UNROLL)
    j, vec_j = loop("j", nr, LoopKind.VECTORIZE)
    k1, k_inner = loop("k_i", ki)
    k2, k_unroll = loop("k_u", ku, LoopKind.UNROLL)
    kg = (kko * ki + k1) * ku + k2
    total: Expr = acc[r, j]
    for s in range(inst.steps):  # the words of one group, in order
        word = kg * inst.steps + s if inst.steps > 1 else kg
        row, column = a(m0 + r, word), b(panel, word, j)
        total = intrinsic(inst.intrinsic, total, *((column, row) if swap else (row, column)))
    step = store(acc[r, j], total)
    finished = vec_j(finish(acc[r, j], m0 + r, n0 + j))
    out_stage = unroll_r(finished if rows is None else IfThen(m0 + r < rows, (finished,)))
    if partial is None:
        init: list[Stmt] = [unroll_r(vec_j(store(acc[r, j], inst.zero)))]
        last: list[Stmt] = [out_stage]
    else:  # earlier K blocks keep their sums in the workspace; the last one finishes them
        first = binop("==", kko, 0)
        init = [unroll_r(vec_j(store(acc[r, j],
                                     Select(first, inst.zero, partial[m0 + r, n0 + j]))))]
        last = [IfThen(binop("==", kko, ko - 1), (out_stage,)),
                IfThen(binop("<", kko, ko - 1),
                       (unroll_r(vec_j(store(partial[m0 + r, n0 + j], acc[r, j]))),))]
    hints: list[Stmt] = []
    if hint_b:  # the words of a group are adjacent rows of the panel: one row of steps * nr
        ahead = (kg + ki * ku) * inst.steps
        hints = row_hints(lambda x: b(panel, ahead, x), inst.steps * nr, vi, mi)
    tile = Allocate(acc, (*init, k_inner(k_unroll(*hints, unroll_r(vec_j(step)))), *last))
    inner = vj_mk(vi_mk(tile)) if cfg["inner_order"] == "nm" else vi_mk(vj_mk(tile))
    return blocks(k_outer(inner))


def block_loops(parallel: str, order: str, mo: int, no: int
                 ) -> tuple[Callable[[Stmt], Stmt], tuple[Expr, Expr]]:
    """The loops over (N block, M block): a wrapper that builds them around a body, and the
    two indices."""
    if parallel == "mn":
        t, par = loop("t", mo * no, LoopKind.PARALLEL)
        return par, ((t // mo, t % mo) if order == "nm" else (t % no, t // no))
    io, m_loop = loop("m_o", mo, LoopKind.PARALLEL if parallel == "m" else LoopKind.SERIAL)
    jo, n_loop = loop("n_o", no, LoopKind.PARALLEL if parallel == "n" else LoopKind.SERIAL)
    if parallel == "m":
        return (lambda body: m_loop(n_loop(body))), (jo, io)
    return (lambda body: n_loop(m_loop(body))), (jo, io)


def pack_panels(weight: np.ndarray, nr: int, group: int) -> np.ndarray:
    """``weight[N, K]`` -> ``[N/nr][K/group][nr][group]``: the ``group`` K values of each
    column side by side, so that one 32-bit lane of a register holds them."""
    n, k = weight.shape
    panels = weight.reshape(n // nr, nr, k // group, group).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(panels)


def typed(inputs: Mapping[str, np.ndarray], name: str, dtype: type[np.generic]) -> np.ndarray:
    """Input ``name``, refused unless it already holds ``dtype``: quantized values and bf16
    bits have no meaningful conversion from another type."""
    array = np.asarray(inputs[name])
    if array.dtype != dtype:
        raise InvalidConfigError(f"input {name} is {array.dtype}, expected {np.dtype(dtype)}")
    return array


def as_words(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array of bytes or 16-bit values, read as 32-bit words along its last
    axis (the same memory: a reinterpretation, not a conversion)."""
    return np.ascontiguousarray(array).view(np.int32)
