"""AMX tile statements (``ir.amx.TileMatmul``) as LLVM IR: tile loads, dot products, stores.

Every tile register is configured the same way, 16 rows of 64 bytes (a tile of ``a``, of
``b``, or of 16 x 16 accumulators), so one palette serves every block shape and is loaded once
per function call, in the entry block of the function the statement stands in (the outlined
body of a parallel loop runs once per thread). The function releases the tiles before it
returns (``release_tiles``). Linux hands the tile registers to a process only after it asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``): the entry asks once per process, so
a kernel runs the same from Python, a worker or the native program.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from schedule_templates.codegen.llvm_dtypes import I32, I64
from schedule_templates.codegen.llvm_expr import FunctionScope
from schedule_templates.ir.amx import TILE_COLS, TILE_REGISTERS, TILE_ROWS, TILE_WORDS, TileMatmul
from schedule_templates.ir.analysis import flat_offset, substitute
from schedule_templates.ir.nodes import Expr, Load, Prefetch, Var

I8 = ir.IntType(8)
PTR = ir.PointerType()
TILE_BYTES = 4 * TILE_WORDS  # bytes of one tile row
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
_FEATURES = {"tdpbusd": ("amx-tile", "amx-int8"), "tdpbsud": ("amx-tile", "amx-int8"),
             "tdpbf16ps": ("amx-tile", "amx-bf16")}


def emit_tile_matmul(scope: FunctionScope, s: TileMatmul) -> None:
    scope.ctx.required_features.update(_FEATURES[s.dot])
    _configure(scope)
    b = scope.builder
    sums = list(range(s.rows * s.cols))
    lefts = [len(sums) + i for i in range(s.rows)]
    rights = [len(sums) + s.rows + j for j in range(s.cols)]
    zero = scope.ctx.declare("llvm.x86.tilezero", ir.VoidType(), [I8])
    load = scope.ctx.declare("llvm.x86.tileloadd64", ir.VoidType(), [I8, PTR, I64])
    dot = scope.ctx.declare(f"llvm.x86.{s.dot}", ir.VoidType(), [I8, I8, I8])
    store = scope.ctx.declare("llvm.x86.tilestored64", ir.VoidType(), [I8, PTR, I64])
    for t in sums:
        b.call(zero, [_tile(t)])
    a_stride, b_stride = ir.Constant(I64, 4 * s.a_row), ir.Constant(I64, 4 * s.b_row)

    def step() -> None:
        """The reduction step ``s.step`` (bound): each tile of ``a`` loaded just before its
        products, the ``b`` tiles with the first row's, so the first product waits for two
        loads, not all of them (2-6% on ResNet-50's int8 layers and BERT's denses alone,
        AMX Xeon, session 22)."""
        _hints(scope, s)
        for i, t in enumerate(lefts):
            b.call(load, [_tile(t), _pointer(scope, s.a_at(TILE_ROWS * i, 0)), a_stride])
            for j, r in enumerate(rights):
                if i == 0:
                    b.call(load, [_tile(r), _pointer(scope, s.b_at(0, j, 0)), b_stride])
                b.call(dot, [_tile(i * s.cols + j), _tile(t), _tile(r)])

    _counted(scope, s.step, s.steps, step)
    acc = scope.buffers[s.acc]
    acc_stride = 4 * TILE_COLS * s.cols
    for i in range(s.rows):
        for j in range(s.cols):
            at = ir.Constant(I64, (TILE_ROWS * i * TILE_COLS * s.cols + TILE_COLS * j) * 4)
            b.call(store, [_tile(i * s.cols + j), b.gep(acc, [at], source_etype=I8),
                           ir.Constant(I64, acc_stride)])


def _hints(scope: FunctionScope, s: TileMatmul) -> None:
    """Prefetches of every row of the ``b`` tiles ``ahead_b`` steps on (into L1: a tile load
    follows a step later)."""
    for j in range(s.cols if s.ahead_b else 0):
        for w in range(TILE_WORDS):
            at = _shifted(s.b_at(w, j, 0), s.step, s.step + s.ahead_b)
            scope.prefetch(Prefetch(at, 3))


def _shifted(at: Load, var: Var, value: Expr) -> Load:
    return Load(at.buffer, tuple(substitute(i, var, value) for i in at.indices))


def release_tiles(scope: FunctionScope) -> None:
    """Before the function returns: give the tiles back if it configured them."""
    if scope.tiles_configured:
        release = scope.ctx.declare("llvm.x86.tilerelease", ir.VoidType(), [])
        scope.builder.call(release, [])


def _configure(scope: FunctionScope) -> None:
    if scope.tiles_configured:
        return
    scope.tiles_configured = True
    b = ir.IRBuilder(scope.entry)
    b.position_before(scope.entry.terminator)
    b.call(_permission(scope.ctx.module), [])
    load_config = scope.ctx.declare("llvm.x86.ldtilecfg", ir.VoidType(), [PTR])
    b.call(load_config, [_palette(scope.ctx.module)])


def _palette(module: ir.Module) -> ir.GlobalVariable:
    """The 64-byte tile configuration: palette 1, every tile 16 rows of 64 bytes."""
    name = "tuner.amx.palette"
    existing = module.globals.get(name)
    if isinstance(existing, ir.GlobalVariable):
        return existing
    config = bytearray(64)
    config[0] = 1
    for t in range(TILE_REGISTERS):
        config[16 + 2 * t] = TILE_BYTES  # bytes per row (16-bit field, little end first)
        config[48 + t] = TILE_ROWS
    ty = ir.ArrayType(I8, 64)
    palette = ir.GlobalVariable(module, ty, name)
    palette.global_constant = True
    palette.linkage = "internal"
    palette.initializer = ir.Constant(ty, config)
    palette.align = 64
    return palette


def _permission(module: ir.Module) -> ir.Function:
    """``void permit()``: asks Linux for the tile data state once per process."""
    name = "tuner.amx.permit"
    existing = module.globals.get(name)
    if isinstance(existing, ir.Function):
        return existing
    flag = ir.GlobalVariable(module, I32, "tuner.amx.permitted")
    flag.linkage = "internal"
    flag.initializer = ir.Constant(I32, 0)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), name=name)
    fn.linkage = "internal"
    entry, ask, done = (fn.append_basic_block(n) for n in ("entry", "ask", "done"))
    b = ir.IRBuilder(entry)
    asked = b.load_atomic(flag, "monotonic", 4)
    b.cbranch(b.icmp_signed("!=", asked, ir.Constant(I32, 0)), done, ask)
    b.position_at_end(ask)
    syscall = module.globals.get("syscall")
    if not isinstance(syscall, ir.Function):
        syscall = ir.Function(module, ir.FunctionType(I64, [I64], var_arg=True), name="syscall")
    b.call(syscall, [ir.Constant(I64, n) for n in
                     (_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)])
    b.store_atomic(ir.Constant(I32, 1), flag, "monotonic", 4)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def _tile(t: int) -> ir.Constant:
    return ir.Constant(I8, t)


def _pointer(scope: FunctionScope, at: Load) -> ir.Value:
    return scope.address(at.buffer, flat_offset(at.buffer, at.indices))


def _counted(scope: FunctionScope, var: Var, steps: int, body: Callable[[], None]) -> None:
    """``for var in range(steps): body()`` as an LLVM loop, ``var`` bound while it runs."""
    b = scope.builder
    pre = b.block
    head = b.append_basic_block("tiles.k")
    after = b.append_basic_block("tiles.done")
    b.branch(head)
    b.position_at_end(head)
    k = b.phi(I64, name="tiles.k")
    k.add_incoming(ir.Constant(I64, 0), pre)
    scope.env[var] = k
    body()
    del scope.env[var]
    nxt = b.add(k, ir.Constant(I64, 1))
    k.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, ir.Constant(I64, steps)), head, after)
    b.position_at_end(after)
