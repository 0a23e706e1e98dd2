"""Winograd F(m x m, 3 x 3) lowering of a 3x3, stride-1 conv2d for x86 (m = 2 or 4).

The output is cut into m x m tiles; each tile needs an (m+2) x (m+2) input patch. Per tile and
channel the patch is transformed (``B^T d B``), the weights once at pack time (``G g G^T``),
and the convolution becomes (m+2)^2 independent GEMMs over channels followed by the inverse
transform ``A^T [.] A``. Multiplications per output drop from 9 to 9/4 (m = 2) or 36/16
(m = 4), at the price of the transforms and a small loss of precision. Four stages, each one
parallel loop:

1. the activations are copied channel-last into a zero-bordered workspace ``[N][Hp][Wp][C]``
   (so that the transform reads contiguous channel vectors);
2. input transform, vectorized over channels, into ``V[e][p][c]`` (e: one of the (m+2)^2
   positions, p: a tile);
3. per position e, ``M[e][p][k] = sum_c V[e][p][c] U[e][c][k]``: register tiles of ``rows``
   tiles by ``kt`` output channels as vector accumulators along the channels, like the direct
   kernel's;
4. inverse transform of each tile, vectorized over output channels, with the fused epilogue,
   into the NCHW output (tiles that overhang the output are clipped).

The GEMM hints the next (position, channel block)'s transformed weights into L2 as it goes
(``weight_hints``): a 14x14 layer's are 4 MB, from memory inside a model.

Knobs are those of the direct kernel, read for this algorithm: ``tile_k`` -> kt;
``tile_ow`` -> rows (tiles per register tile); ``tile_oh`` -> register tiles per parallel
iteration; ``outer_order`` -> channel block or tile block outermost; ``reduce_order`` -> the
position e outermost (``c_rs``) or innermost (``rs_c``) in the GEMM's parallel loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    Const,
    Expr,
    IfThen,
    Kernel,
    LoopKind,
    Scope,
    Stmt,
    binop,
    loop,
    store,
)
from schedule_templates.space import Config
from schedule_templates.templates.choose import (
    LANES,
    RegisterFile,
    largest_divisor,
    padded_spatial,
)
from schedule_templates.templates.epilogue import (
    EpilogueStage,
    epilogue_arguments,
    epilogue_stage,
)
from schedule_templates.templates.weight_hints import row_hints
from schedule_templates.workloads import Conv2d

F = Fraction
#: (B^T, G, A^T) of F(m, 3) for correlation, as exact fractions (Lavin & Gray's points)
MATRICES: dict[int, tuple[list[list[Fraction]], list[list[Fraction]], list[list[Fraction]]]] = {
    2: (
        [[F(1), F(0), F(-1), F(0)],
         [F(0), F(1), F(1), F(0)],
         [F(0), F(-1), F(1), F(0)],
         [F(0), F(1), F(0), F(-1)]],
        [[F(1), F(0), F(0)],
         [F(1, 2), F(1, 2), F(1, 2)],
         [F(1, 2), F(-1, 2), F(1, 2)],
         [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(0)],
         [F(0), F(1), F(-1), F(-1)]],
    ),
    4: (
        [[F(4), F(0), F(-5), F(0), F(1), F(0)],
         [F(0), F(-4), F(-4), F(1), F(1), F(0)],
         [F(0), F(4), F(-4), F(-1), F(1), F(0)],
         [F(0), F(-2), F(-1), F(2), F(1), F(0)],
         [F(0), F(2), F(-1), F(-2), F(1), F(0)],
         [F(0), F(4), F(0), F(-5), F(0), F(1)]],
        [[F(1, 4), F(0), F(0)],
         [F(-1, 6), F(-1, 6), F(-1, 6)],
         [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)],
         [F(1, 24), F(-1, 12), F(1, 6)],
         [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(1), F(1), F(0)],
         [F(0), F(1), F(-1), F(2), F(-2), F(0)],
         [F(0), F(1), F(1), F(4), F(4), F(0)],
         [F(0), F(1), F(-1), F(8), F(-8), F(1)]],
    ),
}
#: the algorithm knob's values and their tile size m
ALGORITHMS = {"winograd2": 2, "winograd4": 4}


def eligible(wl: Conv2d) -> bool:
    """Winograd F(m, 3) applies to 3x3 windows at stride 1 without dilation."""
    return (wl.R, wl.S) == (3, 3) and wl.stride == (1, 1) and wl.dilation == (1, 1)


def lincomb(coeffs: Sequence[Fraction], values: Sequence[Expr]) -> Expr:
    """``sum(c * v)`` with the zero terms dropped and +-1 as plain adds and subtracts."""
    terms = sorted(((c, v) for c, v in zip(coeffs, values, strict=True) if c != 0),
                   key=lambda t: t[0] < 0)
    if not terms:
        return Const(0.0, "float32")
    c0, v0 = terms[0]
    acc: Expr = v0 if c0 == 1 else Const(float(c0), "float32") * v0
    for c, v in terms[1:]:
        if c == 1:
            acc = acc + v
        elif c == -1:
            acc = acc - v
        else:
            acc = Const(float(c), "float32") * v + acc  # one FMA
    return acc


#: the default uses Winograd only with at least this many output tiles (the GEMMs' rows): with
#: fewer, reading the (m+2)^2 transformed weight matrices dominates (ResNet-18's 7x7x512 layer,
#: 16 tiles at m = 2, runs as fast direct), and the largest m that still has them is taken
#: (m = 4 from 21x21 outputs up: 1.3-4x the direct default on ResNet and DenseNet layers)
DEFAULT_MIN_TILES = 36
#: input and output channels the default needs for Winograd: its transforms cost per channel
#: what the direct kernel's taps do, so a short reduction cannot pay them back
DEFAULT_MIN_CHANNELS = 16
#: tiles per register tile the default tries, in order of preference (4 and 7: measured best
#: on 56x56 and 28x28/14x14 outputs of ResNet-18/DenseNet-121 layers, one core)
DEFAULT_ROWS = (4, 7, 8, 6, 5, 14, 12)


def default_winograd(wl: Conv2d, registers: RegisterFile) -> tuple[str, int, int] | None:
    """``(algorithm, kt, rows)`` for the default config, or None where direct is the default.

    ``rows`` is the tiles per register tile (it must divide the output width the direct kernel
    computes, ``padded_spatial(out_w)``, being read from ``tile_ow``); the one that wastes the
    fewest padded tiles is taken, ties in the order of ``DEFAULT_ROWS``.
    """
    if not eligible(wl) or min(wl.C, wl.K) < DEFAULT_MIN_CHANNELS:
        return None
    algorithm = next((name for name, m in sorted(ALGORITHMS.items(), key=lambda a: -a[1])
                      if _Geometry(wl, m).tiles >= DEFAULT_MIN_TILES), None)
    if algorithm is None:
        return None
    tiles = _Geometry(wl, ALGORITHMS[algorithm]).tiles
    wide = registers.lanes >= LANES  # AVX-512: 32 channels of 2 zmm; AVX2: 16 of 2 ymm
    kt = largest_divisor(wl.K, 64, prefer=(32, 16, 64, 48) if wide else (16, 8, 32, 24))
    budget = registers.accumulators // registers.vregs(kt)
    rows = [r for r in DEFAULT_ROWS if r <= budget and padded_spatial(wl.out_w) % r == 0]
    if not rows:
        return None
    best = min(rows, key=lambda r: (-(-tiles // r) * r, DEFAULT_ROWS.index(r)))
    return algorithm, kt, best


class _Geometry:
    def __init__(self, wl: Conv2d, m: int) -> None:
        self.m, self.alpha = m, m + 2
        self.positions = self.alpha * self.alpha
        self.th, self.tw = -(-wl.out_h // m), -(-wl.out_w // m)
        self.tiles = wl.N * self.th * self.tw
        self.hp, self.wp = self.th * m + 2, self.tw * m + 2


def lower_winograd(wl: Conv2d, config: Config, m: int) -> Kernel:
    g = _Geometry(wl, m)
    ko, kt = config["tile_k"]
    group = config["tile_oh"][1]
    rows = config["tile_ow"][1]
    blocks = -(-g.tiles // (rows * group))
    padded_tiles = blocks * rows * group
    data = Buffer("data", (wl.N, wl.C, wl.H, wl.W))
    packed = Buffer("weight_packed", (g.positions, ko, wl.C, kt))
    out = Buffer("out", (wl.N, wl.K, wl.out_h, wl.out_w))
    channels_last = Buffer("data_t", (wl.N, g.hp, g.wp, wl.C), Scope.WORKSPACE)
    v = Buffer("winograd_v", (g.positions, padded_tiles, wl.C), Scope.WORKSPACE)
    mm = Buffer("winograd_m", (g.positions, padded_tiles, wl.K), Scope.WORKSPACE)
    epilogue = epilogue_stage(wl)
    stages = (
        _channels_last(wl, g, data, channels_last),
        _input_transform(wl, g, channels_last, v),
        _gemm(wl, g, config, v, packed, mm, rows, group, blocks),
        _output_transform(wl, g, mm, out, epilogue),
    )
    return Kernel("conv2d_winograd_x86", (data, packed, *epilogue.buffers, out),
                  (channels_last, v, mm), stages)


def _channels_last(wl: Conv2d, g: _Geometry, data: Buffer, dst: Buffer) -> Stmt:
    top, left = wl.pad[0], wl.pad[1]
    zero = Const(0.0, "float32")
    q, par = loop("q", wl.N * g.hp, LoopKind.PARALLEL)
    n, y = q // g.hp, q % g.hp
    h = y - top

    def zeros(name: str, start: int, count: int) -> Stmt:
        x, xs = loop(name, count)
        c, vec = loop("c", wl.C, LoopKind.VECTORIZE)
        return xs(vec(store(dst[n, y, x + start, c], zero)))

    x, xs = loop("x", wl.W)
    c, vec = loop("c", wl.C, LoopKind.VECTORIZE)
    row: list[Stmt] = []
    if left:
        row.append(zeros("xl", 0, left))
    row.append(xs(vec(store(dst[n, y, x + left, c], data[n, c, h, x]))))
    right = g.wp - left - wl.W
    if right > 0:
        row.append(zeros("xr", left + wl.W, right))
    inside = binop("and", h >= 0, h < wl.H)
    return par(IfThen(inside, tuple(row)), IfThen(h < 0, (zeros("xz", 0, g.wp),)),
               IfThen(h >= wl.H, (zeros("xz", 0, g.wp),)))


def _input_transform(wl: Conv2d, g: _Geometry, src: Buffer, v: Buffer) -> Stmt:
    bt = MATRICES[g.m][0]
    a = g.alpha
    width = largest_divisor(wl.C, 16)
    blocks = wl.C // width
    q, par = loop("q", wl.N * g.th * blocks, LoopKind.PARALLEL)  # enough work for every thread
    n, ty, cb = q // (g.th * blocks), q // blocks % g.th, q % blocks
    tx, txs = loop("tx", g.tw)
    c, vec = loop("c", width, LoopKind.VECTORIZE)
    ch = cb * width + c
    tile = (n * g.th + ty) * g.tw + tx
    patch = [[src[n, ty * g.m + i, tx * g.m + j, ch] for j in range(a)] for i in range(a)]
    rows = Buffer("patch_b", (a, a, width), Scope.LOCAL)
    first = [store(rows[i, e2, c], lincomb(bt[e2], patch[i])) for i in range(a)
             for e2 in range(a)]
    second = [store(v[e1 * a + e2, tile, ch],
                    lincomb(bt[e1], [rows[i, e2, c] for i in range(a)]))
              for e1 in range(a) for e2 in range(a)]
    return par(txs(Allocate(rows, (vec(*first, *second),))))


def _gemm(wl: Conv2d, g: _Geometry, config: Config, v: Buffer, packed: Buffer, mm: Buffer,
          rows: int, group: int, blocks: int) -> Stmt:
    ko, kt = config["tile_k"]
    e_outer = config["reduce_order"] == "c_rs"
    t, par = loop("t", g.positions * ko * blocks, LoopKind.PARALLEL)
    if e_outer:
        e, rest = t // (ko * blocks), t % (ko * blocks)
    else:
        e, rest = t % g.positions, t // g.positions
    if config["outer_order"] == "k_h":
        kb, pb = rest // blocks, rest % blocks
    else:
        kb, pb = rest % ko, rest // ko
    s, sub = loop("s", group)
    i, unroll_i = loop("i", rows, LoopKind.UNROLL)
    k, vec_k = loop("k", kt, LoopKind.VECTORIZE)
    c, c_loop = loop("c", wl.C)
    p = (pb * group + s) * rows + i
    acc = Buffer("acc", (rows, kt), Scope.LOCAL)
    # the next (position, channel block)'s weights, the tiles that share this one taking turns
    shared = config["outer_order"] == "k_h"
    hints = row_hints(lambda x: packed[e, kb + 1, c, x], kt,
                      pb * group + s if shared else s, blocks * group if shared else group)
    tile = Allocate(acc, (
        unroll_i(vec_k(store(acc[i, k], Const(0.0, "float32")))),
        c_loop(*hints,
               unroll_i(vec_k(store(acc[i, k], v[e, p, c] * packed[e, kb, c, k] + acc[i, k])))),
        unroll_i(vec_k(store(mm[e, p, kb * kt + k], acc[i, k]))),
    ))
    return par(sub(tile))


def _output_transform(wl: Conv2d, g: _Geometry, mm: Buffer, out: Buffer,
                      epilogue: EpilogueStage) -> Stmt:
    at = MATRICES[g.m][2]
    a, m = g.alpha, g.m
    width = largest_divisor(wl.K, 16)
    blocks = wl.K // width
    q, par = loop("q", wl.N * g.th * blocks, LoopKind.PARALLEL)
    n, ty, kb = q // (g.th * blocks), q // blocks % g.th, q % blocks
    tx, txs = loop("tx", g.tw)
    k, vec = loop("k", width, LoopKind.VECTORIZE)
    ch = kb * width + k
    tile = (n * g.th + ty) * g.tw + tx
    cols = Buffer("tile_at", (m, a, width), Scope.LOCAL)
    first = vec(*[store(cols[i, e2, k], lincomb(at[i], [mm[e1 * a + e2, tile, ch]
                                                          for e1 in range(a)]))
                  for i in range(m) for e2 in range(a)])
    clipped = wl.out_h % m != 0 or wl.out_w % m != 0
    outputs: list[Stmt] = []
    for i in range(m):
        for j in range(m):
            oh, ow = ty * m + i, tx * m + j
            value = lincomb(at[j], [cols[i, e2, k] for e2 in range(a)])
            st = vec(store(out[n, ch, oh, ow], epilogue.apply(value, ch, (n, ch, oh, ow))))
            outputs.append(IfThen(binop("and", oh < wl.out_h, ow < wl.out_w), (st,))
                           if clipped else st)
    return par(txs(Allocate(cols, (first, *outputs))))


def pack_winograd(wl: Conv2d, config: Config, m: int, inputs: Mapping[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """``U = G g G^T`` per output/input channel pair, laid out ``[e][K/kt][C][kt]``."""
    ko, kt = config["tile_k"]
    gm = np.array(MATRICES[m][1], dtype=np.float64)
    weight = np.asarray(inputs["weight"], dtype=np.float64).reshape(wl.K, wl.C, 3, 3)
    u = np.einsum("ar,kcrs,bs->abkc", gm, weight, gm).reshape((m + 2) ** 2, ko, kt, wl.C)
    packed = np.ascontiguousarray(u.transpose(0, 1, 3, 2), dtype=np.float32)
    return {"data": inputs["data"], "weight_packed": packed, **epilogue_arguments(wl, inputs)}
