"""Loop-nest IR -> LLVM IR, with llvmlite's IR builder.

The kernel becomes ``void name(ptr noalias arg..., ptr workspace..., i64 nthreads)``.
- serial loops are counted loops with a phi; unrolled loops repeat their body with a constant;
- a vectorized loop turns every store below it into SIMD code over ``<L x float>``
  (``llvm_expr.VectorEmitter``), or per-lane code where it cannot; a loop wider than 16 lanes or
  not a power of two is emitted as power-of-two pieces of <= 16 lanes; expressions are emitted
  by ``llvm_expr.FunctionScope``;
- buffers hold their element type (``DTYPES``; bfloat16 as i16 bits), ``Cast`` converts and
  ``Intrinsic`` calls a target instruction (VNNI, AVX-512 BF16) on whole vectors; the features
  such calls need are collected in ``required_features`` so a caller can refuse to compile for a
  CPU that lacks them (LLVM would abort the process instead of reporting an error);
- the outermost parallel loop is outlined into a function that libgomp's ``GOMP_parallel`` runs
  on ``nthreads`` threads, each taking one contiguous chunk of the iterations.
"""

from __future__ import annotations

from llvmlite import ir

from schedule_templates.codegen.llvm_amx import emit_tile_matmul, release_tiles
from schedule_templates.codegen.llvm_dtypes import I32, I64, element
from schedule_templates.codegen.llvm_expr import (
    FunctionScope,
    ModuleContext,
    VectorEmitter,
    vectorizable,
)
from schedule_templates.errors import CodegenError
from schedule_templates.ir.amx import TileMatmul
from schedule_templates.ir.analysis import substitute_stmt
from schedule_templates.ir.nodes import (
    Allocate,
    Buffer,
    IfThen,
    Kernel,
    Loop,
    LoopKind,
    Prefetch,
    Scope,
    Stmt,
    Store,
    Var,
)
from schedule_templates.ir.visitor import StmtFunctor

PTR = ir.PointerType()
MAX_VECTOR_LANES = 16  # widest SIMD op emitted: one zmm of fp32 (two ymm without AVX-512)


class LLVMGenerator(StmtFunctor[None]):
    """Statements of one kernel into an LLVM module; ``scope`` is the function being emitted."""

    def __init__(self, kernel: Kernel, triple: str = "", data_layout: str = "") -> None:
        self.kernel = kernel
        self.module = ir.Module(name=kernel.name)
        if triple:
            self.module.triple = triple
        if data_layout:
            self.module.data_layout = data_layout
        self.ctx = ModuleContext(self.module)
        self._outlined = 0

    @property
    def required_features(self) -> set[str]:
        """CPU features (LLVM names, no sign) the emitted intrinsics need."""
        return self.ctx.required_features

    def generate(self) -> ir.Module:
        bufs = (*self.kernel.params, *self.kernel.workspace)
        fnty = ir.FunctionType(ir.VoidType(), [PTR] * len(bufs) + [I64])
        fn = ir.Function(self.module, fnty, name=self.kernel.name)
        for arg, buf in zip(fn.args, bufs, strict=False):
            arg.name = buf.name
            _pointer_facts(arg, buf)
        fn.args[-1].name = "nthreads"
        self.scope = self._open(fn, dict(zip(bufs, fn.args, strict=False)), {},
                                in_parallel=False)
        self._nthreads = fn.args[-1]
        self._body(self.kernel.body)
        release_tiles(self.scope)
        self.scope.builder.ret_void()
        return self.module

    # -- functions ---------------------------------------------------------------------------
    def _open(self, fn: ir.Function, buffers: dict[Buffer, ir.Value], env: dict[Var, ir.Value],
              in_parallel: bool) -> FunctionScope:
        entry = fn.append_basic_block("entry")
        start = fn.append_basic_block("start")
        ir.IRBuilder(entry).branch(start)  # allocas go before this branch
        return FunctionScope(self.ctx, fn, ir.IRBuilder(start), entry, dict(env), dict(buffers),
                             in_parallel)

    def _alloca(self, buf: Buffer) -> ir.Value:
        b = ir.IRBuilder(self.scope.entry)
        b.position_before(self.scope.entry.terminator)
        slot = b.alloca(ir.ArrayType(element(buf.dtype), buf.size + buf.slack), name=buf.name)
        slot.align = 64
        return slot

    # -- statements --------------------------------------------------------------------------
    def _body(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            self.visit_stmt(s)

    def default_stmt(self, s: Stmt) -> None:
        raise CodegenError(f"cannot generate {type(s).__name__}")

    def visit_store(self, s: Store) -> None:
        self.scope.store(s)

    def visit_prefetch(self, s: Prefetch) -> None:
        self.scope.prefetch(s)

    def visit_tile_matmul(self, s: TileMatmul) -> None:
        emit_tile_matmul(self.scope, s)

    def visit_allocate(self, s: Allocate) -> None:
        self.scope.buffers[s.buffer] = self._alloca(s.buffer)
        self._body(s.body)

    def visit_ifthen(self, s: IfThen) -> None:
        with self.scope.builder.if_then(self.scope.visit_expr(s.cond)):
            self._body(s.body)

    def visit_loop(self, s: Loop) -> None:
        if s.kind is LoopKind.UNROLL:
            for i in range(s.extent):
                self.scope.env[s.var] = ir.Constant(I64, i)
                self._body(s.body)
            del self.scope.env[s.var]
        elif s.kind is LoopKind.VECTORIZE:
            self._vector_loop(s)
        elif s.kind is LoopKind.PARALLEL and not self.scope.in_parallel:
            self._parallel_loop(s)
        else:  # serial, an inner parallel loop, or a GPU kind run serially on the host
            self._serial_loop(s, ir.Constant(I64, 0), ir.Constant(I64, s.extent))

    def _serial_loop(self, s: Loop, lo: ir.Value, hi: ir.Value) -> None:
        b = self.scope.builder
        pre = b.block
        header = b.append_basic_block(f"{s.var.name}.head")
        body = b.append_basic_block(f"{s.var.name}.body")
        done = b.append_basic_block(f"{s.var.name}.done")
        b.branch(header)
        b.position_at_end(header)
        index = b.phi(I64, name=s.var.name)
        index.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", index, hi), body, done)
        b.position_at_end(body)
        self.scope.env[s.var] = index
        self._body(s.body)
        index.add_incoming(b.add(index, ir.Constant(I64, 1)), b.block)
        b.branch(header)
        b.position_at_end(done)
        del self.scope.env[s.var]

    # -- parallel ----------------------------------------------------------------------------
    def _parallel_loop(self, s: Loop) -> None:
        """Outline the loop: body(ptrs..., vars..., lo, hi) does iterations [lo, hi)."""
        self._outlined += 1
        tag = f"{self.kernel.name}.par{self._outlined}"
        scope = self.scope
        bufs = [b for b in scope.buffers if b.scope in (Scope.GLOBAL, Scope.WORKSPACE)]
        bound = list(scope.env)
        body_ty = ir.FunctionType(ir.VoidType(), [PTR] * len(bufs) + [I64] * (len(bound) + 2))
        body_fn = ir.Function(self.module, body_ty, name=f"{tag}.body")
        body_fn.linkage = "internal"
        for arg, buf in zip(body_fn.args, bufs, strict=False):
            _pointer_facts(arg, buf)
        self.scope = self._open(
            body_fn,
            dict(zip(bufs, body_fn.args[: len(bufs)], strict=True)),
            dict(zip(bound, body_fn.args[len(bufs) : -2], strict=True)),
            in_parallel=True,
        )
        self._serial_loop(s, body_fn.args[-2], body_fn.args[-1])
        release_tiles(self.scope)
        self.scope.builder.ret_void()
        self.scope = scope

        # closure: the pointers and bound indices, stored in a struct on the caller's stack
        fields = [PTR] * len(bufs) + [I64] * len(bound)
        closure_ty = ir.LiteralStructType(fields)
        b = scope.builder
        closure = b.alloca(closure_ty, name=f"{tag}.closure")
        values = [scope.buffers[x] for x in bufs] + [scope.env[v] for v in bound]
        for i, value in enumerate(values):
            b.store(value, b.gep(closure, [ir.Constant(I32, 0), ir.Constant(I32, i)],
                                 inbounds=True))
        omp_fn = self._omp_trampoline(tag, body_fn, closure_ty, len(fields), s.extent)
        serial, threaded = b.append_basic_block(f"{tag}.serial"), b.append_basic_block(
            f"{tag}.omp")
        done = b.append_basic_block(f"{tag}.done")
        b.cbranch(b.icmp_signed("<=", self._nthreads, ir.Constant(I64, 1)), serial, threaded)
        b.position_at_end(serial)
        b.call(body_fn, [*values, ir.Constant(I64, 0), ir.Constant(I64, s.extent)])
        b.branch(done)
        b.position_at_end(threaded)
        gomp = self.ctx.declare("GOMP_parallel", ir.VoidType(), [PTR, PTR, I32, I32])
        b.call(gomp, [omp_fn, closure, b.trunc(self._nthreads, I32), ir.Constant(I32, 0)])
        b.branch(done)
        b.position_at_end(done)

    def _omp_trampoline(self, tag: str, body_fn: ir.Function, closure_ty: ir.Type,
                        nfields: int, extent: int) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR]), name=f"{tag}.omp")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        tid = b.sext(b.call(self.ctx.declare("omp_get_thread_num", I32, []), []), I64)
        nt = b.sext(b.call(self.ctx.declare("omp_get_num_threads", I32, []), []), I64)
        total = ir.Constant(I64, extent)
        chunk = b.sdiv(b.add(total, b.sub(nt, ir.Constant(I64, 1))), nt)
        lo = b.mul(tid, chunk)
        hi = b.add(lo, chunk)
        hi = b.select(b.icmp_signed("<", hi, total), hi, total)
        args = []
        for i, ty in enumerate(closure_ty.elements):
            ptr = b.gep(fn.args[0], [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True,
                        source_etype=closure_ty)
            args.append(b.load(ptr, typ=ty))
        assert len(args) == nfields
        with b.if_then(b.icmp_signed("<", lo, hi)):
            b.call(body_fn, [*args, lo, hi])
        b.ret_void()
        return fn

    # -- vector code -------------------------------------------------------------------------
    def _vector_loop(self, s: Loop) -> None:
        for stmt in s.body:
            if type(stmt) is Loop and stmt.kind is LoopKind.UNROLL:
                for i in range(stmt.extent):
                    self.scope.env[stmt.var] = ir.Constant(I64, i)
                    self._vector_loop(Loop(s.var, s.extent, s.kind, stmt.body))
                del self.scope.env[stmt.var]
            elif type(stmt) is Store and vectorizable(stmt, s.var):
                start = 0
                for width in _vector_chunks(s.extent):
                    part = substitute_stmt(stmt, s.var, s.var + start) if start else stmt
                    assert isinstance(part, Store)
                    VectorEmitter(self.scope, s.var, width).store(part)
                    start += width
            else:  # not SIMD-friendly: emit it lane by lane
                for lane in range(s.extent):
                    self.visit_stmt(substitute_stmt(stmt, s.var, lane))


def _vector_chunks(lanes: int) -> list[int]:
    """Split a vector loop into power-of-two pieces of at most ``MAX_VECTOR_LANES`` lanes.

    The x86 backend legalises an odd-sized vector such as ``<24 x float>`` or ``<48 x float>``
    (a promoted accumulator tile carried through the reduction loop) by widening it and going
    through the stack lane by lane: a conv kernel with 48-wide tiles ran ~20x slower than with
    16-wide ones. Pieces of native width (or less) map onto whole registers.
    """
    chunks = []
    while lanes > 0:
        width = min(MAX_VECTOR_LANES, 1 << (lanes.bit_length() - 1))
        chunks.append(width)
        lanes -= width
    return chunks



def generate_llvm_ir(kernel: Kernel, triple: str = "", data_layout: str = "") -> ir.Module:
    return LLVMGenerator(kernel, triple, data_layout).generate()


#: bytes of one element of each buffer dtype
_ELEMENT_BYTES = {"float32": 4, "int32": 4, "int8": 1, "uint8": 1, "bfloat16": 2}


def _pointer_facts(arg: ir.Argument, buf: Buffer) -> None:
    """A buffer argument aliases no other and points at its whole shape's bytes (every caller
    allocates at least that): LLVM may then hoist a loop-invariant load out of a branch inside
    the loop (a tile kernel's output stage reloaded its zero point and scales every row, under
    the row's ``IfThen``)."""
    arg.add_attribute("noalias")
    arg.attributes.dereferenceable = buf.size * _ELEMENT_BYTES[buf.dtype]
    arg.attributes.align = _ELEMENT_BYTES[buf.dtype]
