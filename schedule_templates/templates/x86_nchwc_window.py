"""Pieces the blocked (NCHW[b]c) convolution templates share: register budget, the
zero-bordered copy of a blocked input, and output rows cut into tiles of any width.

A blocked pixel is one vector of ``b`` channels, so a register tile is counted in pixels (times
channel blocks) and needs no divisor of the row: a row of ``out_w`` pixels is ``out_w // w``
tiles of ``w`` pixels plus one narrower tile for the rest (7-wide maps get a 4 + 3 split, not
seven 1-pixel tiles).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from schedule_templates.ir.nodes import Buffer, Const, Expr, LoopKind, Scope, Stmt, loop, store
from schedule_templates.workloads.conv_nchwc import BlockedWindow

#: widest register tile along a row (pixels)
MAX_TILE_W = 16
#: elements allocated past a zero-bordered copy (a tile reads nothing past its last tap; kept
#: for the vector loads of a full block at the very end)
SLACK = 64


def vector_registers(block: int) -> int:
    """Vector registers of the ISA whose vector is ``block`` floats wide (AVX-512: 32 zmm;
    AVX2 and SSE: 16). The register budget of a tile is counted in these."""
    return 32 if block >= 16 else 16


def tile_widths(out_w: int) -> tuple[int, ...]:
    """Every register-tile width worth a knob value: 1 .. min(out_w, MAX_TILE_W)."""
    return tuple(range(1, min(out_w, MAX_TILE_W) + 1))


def balanced_width(out_w: int, pixels: int) -> int:
    """The widest tile that cuts a row into as few tiles as ``pixels`` per tile allows, all of
    nearly equal width (a 7-wide row and 6 pixels: 4 + 3, a 56-wide one: 9 x 6 + 2)."""
    pixels = max(1, min(pixels, MAX_TILE_W))
    tiles = -(-out_w // pixels)
    return min(pixels, -(-out_w // tiles))


def row_tiles(out_w: int, width: int, tile: Callable[[int, Expr | int, str], Sequence[Stmt]]
              ) -> list[Stmt]:
    """``tile(w, first_column, name)`` over a row: a loop of whole tiles, then the remainder."""
    full, rest = divmod(out_w, width)
    stmts: list[Stmt] = []
    if full:
        wb, cols = loop("ow_o", full)
        stmts.append(cols(list(tile(width, wb * width, "m"))))
    if rest:
        stmts += list(tile(rest, full * width, "r"))
    return stmts


def padded_blocked(wl: BlockedWindow) -> Buffer:
    top, left, bottom, right = wl.pad
    return Buffer("data_pad", (wl.N * wl.blocks_in, wl.H + top + bottom, wl.W + left + right,
                               wl.block), Scope.WORKSPACE, slack=SLACK)


def pad_blocked_stage(wl: BlockedWindow, data: Buffer, pad: Buffer) -> Stmt:
    """Copy the blocked activations into a zero-bordered buffer, one channel block plane per
    parallel iteration (inside the timed region: it is part of the operator)."""
    q, par = loop("q", wl.N * wl.blocks_in, LoopKind.PARALLEL)
    return par(copy_blocked_plane(wl, data, pad, q, q // wl.blocks_in, q % wl.blocks_in))


def copy_blocked_plane(wl: BlockedWindow, data: Buffer, dst: Buffer, plane: Expr, n: Expr,
                       cb: Expr) -> list[Stmt]:
    """Channel block ``cb`` of image ``n`` into plane ``plane`` of ``dst`` (shape
    ``[planes][Hp][Wp][b]``): border pixels zero, interior a vector copy per pixel."""
    top, left, bottom, right = wl.pad
    wp = wl.W + left + right
    zero = Const(0.0, "float32")
    stmts: list[Stmt] = []
    for first, count, name in ((0, top, "zt"), (top + wl.H, bottom, "zb")):
        if count:
            h, rows = loop(f"{name}h", count)
            w, cols = loop(f"{name}w", wp)
            k, vec = loop(f"{name}k", wl.block, LoopKind.VECTORIZE)
            stmts.append(rows(cols(vec(store(dst[plane, first + h, w, k], zero)))))
    h, rows = loop("ch", wl.H)
    row: list[Stmt] = []
    for first, count, name in ((0, left, "zl"), (left + wl.W, right, "zr")):
        if count:
            w, cols = loop(f"{name}w", count)
            k, vec = loop(f"{name}k", wl.block, LoopKind.VECTORIZE)
            row.append(cols(vec(store(dst[plane, top + h, first + w, k], zero))))
    w, cols = loop("cw", wl.W)
    k, vec = loop("ck", wl.block, LoopKind.VECTORIZE)
    row.append(cols(vec(store(dst[plane, top + h, left + w, k], data[n, cb, h, w, k]))))
    stmts.append(rows(row))
    return stmts
