"""x86 template for ``batch_matmul_bf16``: both operands are activations, so both are rounded
to bfloat16 and packed inside the kernel, then ``x86_dot_gemm``'s bf16 nest runs per batch.

Two parallel staging passes, each one read of an operand (small next to the B x M x N x K
products): ``x``'s rows become words of two consecutive K values (``word_rows``; M rounded up as
``batch_matmul`` rounds it, the extra rows zero), and ``y`` becomes micro-panels
``[B][Np/nr][K/2][nr]`` of words, the pair of K values of one column side by side (one vector
load per pair of reduction steps, as ``dense_bf16``'s packed weights). Columns past N (rounded up
to whole 16-lane registers) and the value past an odd K are zero. The batches are split between
threads (attention has 12 or more heads; the nest inside one batch runs in one thread), so the
space keeps one K block: partial sums would need a workspace per batch. Where N is not whole
registers the tiles go to a padded workspace and the real columns are copied out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from schedule_templates.ir.nodes import (
    Buffer,
    Const,
    Expr,
    Kernel,
    LoopKind,
    Scope,
    Select,
    Stmt,
    binop,
    cast,
    loop,
    store,
)
from schedule_templates.space import Config, ConfigSpace
from schedule_templates.templates.base import Template, register
from schedule_templates.templates.base import as_workload as _as
from schedule_templates.templates.x86_dot_gemm import (
    BF16,
    dot_default,
    dot_nest,
    dot_space,
    padded_k,
    padded_n,
)
from schedule_templates.templates.x86_gemm import padded_extent
from schedule_templates.templates.x86_int8_stages import vector_walk, word_rows
from schedule_templates.workloads import BatchMatmulBf16, Workload


def _bits(value: Expr) -> Expr:
    """An fp32 value rounded to bfloat16, its 16 bits as an int32."""
    return cast("int32", cast("bfloat16", value))


@register
class BatchMatmulBf16X86(Template):
    name = "batch_matmul_bf16.x86"
    op = "batch_matmul_bf16"
    target_kind = "llvm"
    version = 1

    def space(self, workload: Workload, device: Mapping[str, object] | None = None
              ) -> ConfigSpace:
        wl = _as(workload, BatchMatmulBf16)
        plain = dot_space(padded_extent(wl.M), padded_n(wl.N), padded_k(wl.K, BF16), BF16)
        fits = plain.constraint

        def one_k_block(cfg: Config) -> bool:
            return cfg["tile_k"][0] == 1 and (fits is None or fits(cfg))

        return ConfigSpace(plain.knobs, constraint=one_k_block)

    def default_config(self, workload: Workload) -> Config:
        wl = _as(workload, BatchMatmulBf16)
        return dot_default(self.space(wl), padded_extent(wl.M), padded_n(wl.N),
                           padded_k(wl.K, BF16), BF16)

    def lower(self, workload: Workload, config: Config) -> Kernel:
        wl = _as(workload, BatchMatmulBf16)
        mp, np_, words = padded_extent(wl.M), padded_n(wl.N), padded_k(wl.K, BF16) // 2
        nr = config["tile_n"][2]
        x = Buffer("x", (wl.B, wl.M, wl.K))
        y = Buffer("y", (wl.B, wl.K, wl.N))
        out = Buffer("out", (wl.B, wl.M, wl.N))
        rows = Buffer("x_words", (wl.B * mp, words), Scope.WORKSPACE, "int32")
        panels = Buffer("y_panels", (wl.B, np_ // nr, words, nr), Scope.WORKSPACE, "int32")

        def x_value(row: Expr, k: Expr) -> Expr:
            b, m = row // mp, row % mp
            if mp == wl.M:
                return _bits(x[b, m, k])
            return Select(m < wl.M, _bits(x[b, binop("min", m, wl.M - 1), k]),
                          Const(0, "int32"))

        stage_x = word_rows(lambda r, w: rows[r, w], x_value, wl.B * mp, wl.K, words, BF16,
                            prefix="xw")
        stage_y = self._panel_stage(wl, y, panels, np_, words, nr)
        b, batches = loop("b", wl.B, LoopKind.PARALLEL if wl.B > 1 else LoopKind.SERIAL)
        padded = (None if np_ == wl.N
                  else Buffer("out_padded", (wl.B, mp, np_), Scope.WORKSPACE))
        target = out if padded is None else padded

        def finish(acc: Expr, m: Expr, n: Expr) -> Stmt:
            return store(target[b, m, n], acc)

        nest = dot_nest(config, BF16, a=lambda m, w: rows[b * mp + m, w],
                        b=lambda p, w, j: panels[b, p, w, j], finish=finish, partial=None,
                        rows=None if mp == wl.M or padded is not None else wl.M)
        body: list[Stmt] = [stage_x, *stage_y, batches(nest)]
        workspaces = [rows, panels]
        if padded is not None:
            workspaces.append(padded)
            q, copy_rows = loop("q", wl.B * wl.M, LoopKind.PARALLEL)
            body.append(copy_rows(*vector_walk(
                wl.N, lambda n: store(out[q // wl.M, q % wl.M, n],
                                      padded[q // wl.M, q % wl.M, n]), "cp")))
        return Kernel("batch_matmul_bf16_x86", (x, y, out), tuple(workspaces), tuple(body))

    @staticmethod
    def _panel_stage(wl: BatchMatmulBf16, y: Buffer, panels: Buffer, np_: int, words: int,
                     nr: int) -> list[Stmt]:
        """``panels[b][p][w][j]`` = the bf16 pair ``y[b, 2w, n]``, ``y[b, 2w+1, n]`` of column
        ``n = p*nr + j`` (low half first); zero past N and past K. The panels wholly inside N
        are read without guards (contiguous loads); the last one, where N is not whole
        panels, on its own."""
        count = np_ // nr
        inside = count if np_ == wl.N else count - 1

        def stage(first: int, panels_count: int, guarded: bool) -> Stmt:
            i, rows_loop = loop(f"yp{first}", wl.B * panels_count * words, LoopKind.PARALLEL)
            b, w = i // (panels_count * words), i % words
            p = first + (i // words) % panels_count

            def value(k: Expr, n: Expr) -> Expr:
                if not guarded:
                    return _bits(y[b, k, n])
                return Select(n < wl.N, _bits(y[b, k, binop("min", n, wl.N - 1)]),
                              Const(0, "int32"))

            def element(j: Expr) -> Stmt:
                n = p * nr + j
                high = value(binop("min", w * 2 + 1, wl.K - 1), n)
                if wl.K % 2:  # the last word's second value is past K: zero
                    high = Select(w * 2 + 1 < wl.K, high, Const(0, "int32"))
                word = value(w * 2, n) + high * Const(1 << 16, "int32")
                return store(panels[b, p, w, j], word)

            return rows_loop(*vector_walk(nr, element, f"yj{first}"))

        stages = [stage(0, inside, False)] if inside else []
        if inside < count:
            stages.append(stage(inside, 1, True))
        return stages

    def pack(self, workload: Workload, config: Config, inputs: Mapping[str, np.ndarray]
             ) -> dict[str, np.ndarray]:
        return {"x": np.asarray(inputs["x"], dtype=np.float32),
                "y": np.asarray(inputs["y"], dtype=np.float32)}
