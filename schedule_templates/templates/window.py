"""Pieces shared by the sliding-window templates (conv2d, depthwise_conv2d)."""

from __future__ import annotations

from schedule_templates.ir.nodes import Buffer, Const, LoopKind, Scope, Stmt, loop, store
from schedule_templates.workloads.conv import _Window

#: elements allocated past the padded copy so stride-2..4 vector loads may over-read
SLACK = 64


def needs_copy(wl: _Window, strided_vectors: bool = False) -> bool:
    return any(wl.pad) or (strided_vectors and wl.stride[1] > 1)


def padded_buffer(wl: _Window) -> Buffer:
    top, left, bottom, right = wl.pad
    return Buffer("data_pad", (wl.N * wl.C, wl.H + top + bottom, wl.W + left + right),
                  Scope.WORKSPACE, slack=SLACK)


def pad_stage(wl: _Window, data: Buffer, pad: Buffer) -> Stmt:
    """Copy the activations into a zero-bordered buffer (inside the timed region: it is part of
    the operator). Border rows and columns are written as zeros, the interior as a copy."""
    top, left, bottom, right = wl.pad
    q, par = loop("q", wl.N * wl.C, LoopKind.PARALLEL)
    n, c = q // wl.C, q % wl.C
    zero = Const(0.0, "float32")
    wp = wl.W + left + right
    h, rows = loop("h", wl.H)
    body: list[Stmt] = []
    if top:
        ht, top_rows = loop("ht", top)
        w, vec = loop("w", wp, LoopKind.VECTORIZE)
        body.append(top_rows(vec(store(pad[q, ht, w], zero))))
    row: list[Stmt] = []
    if left:
        w, vec = loop("wl", left, LoopKind.VECTORIZE)
        row.append(vec(store(pad[q, h + top, w], zero)))
    w, vec = loop("w", wl.W, LoopKind.VECTORIZE)
    row.append(vec(store(pad[q, h + top, w + left], data[n, c, h, w])))
    if right:
        w, vec = loop("wr", right, LoopKind.VECTORIZE)
        row.append(vec(store(pad[q, h + top, w + left + wl.W], zero)))
    body.append(rows(row))
    if bottom:
        hb, bottom_rows = loop("hb", bottom)
        w, vec = loop("w", wp, LoopKind.VECTORIZE)
        body.append(bottom_rows(vec(store(pad[q, hb + top + wl.H, w], zero))))
    return par(body)
