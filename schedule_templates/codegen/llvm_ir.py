"""Loop-nest IR -> LLVM IR, with llvmlite's IR builder.

The kernel becomes ``void name(ptr noalias arg..., ptr workspace..., i64 nthreads)``.
- serial loops are counted loops with a phi; unrolled loops repeat their body with a constant;
- a vectorized loop turns every store below it into SIMD code over ``<L x float>``: loads whose
  address does not move with the lane index are broadcast, unit-stride ones are vector loads,
  small strides on buffers with slack are a wide load plus a shuffle, anything else falls back to
  per-lane code; ``a * b + c`` on floats becomes ``llvm.fmuladd`` (an FMA on the host); a loop
  wider than 16 lanes or not a power of two is emitted as power-of-two pieces of <= 16 lanes;
- buffers hold their element type (``DTYPES``; bfloat16 as i16 bits), ``Cast`` converts and
  ``Intrinsic`` calls a target instruction (VNNI, AVX-512 BF16) on whole vectors; the features
  such calls need are collected in ``required_features`` so a caller can refuse to compile for a
  CPU that lacks them (LLVM would abort the process instead of reporting an error);
- the outermost parallel loop is outlined into a function that libgomp's ``GOMP_parallel`` runs
  on ``nthreads`` threads, each taking one contiguous chunk of the iterations.
"""

from __future__ import annotations

import dataclasses

from llvmlite import ir

from schedule_templates.codegen.llvm_dtypes import (
    F32,
    I32,
    I64,
    align_of,
    element,
    emit_cast,
    emit_intrinsic,
    intrinsic_feature,
)
from schedule_templates.codegen.llvm_math import emit_math
from schedule_templates.errors import CodegenError
from schedule_templates.ir.analysis import flat_offset, linear_coeff, loads_in, substitute, uses_var
from schedule_templates.ir.nodes import (
    COMPARISONS,
    Allocate,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    IfThen,
    Intrinsic,
    Kernel,
    Load,
    Loop,
    LoopKind,
    Scope,
    Select,
    Stmt,
    Store,
    Var,
)

PTR = ir.PointerType()
_ICMP = {"<": "<", "<=": "<=", ">=": ">=", ">": ">", "==": "==", "!=": "!="}
_FCMP = {"<": "<", "<=": "<=", ">=": ">=", ">": ">", "==": "==", "!=": "!="}
MAX_VECTOR_LANES = 16  # widest SIMD op emitted: one zmm of fp32 (two ymm without AVX-512)


@dataclasses.dataclass
class _Scope:
    """Everything bound while emitting one LLVM function."""

    fn: ir.Function
    builder: ir.IRBuilder
    entry: ir.Block
    env: dict[Var, ir.Value]
    buffers: dict[Buffer, ir.Value]
    in_parallel: bool


class LLVMGenerator:
    def __init__(self, kernel: Kernel, triple: str = "", data_layout: str = "") -> None:
        self.kernel = kernel
        self.module = ir.Module(name=kernel.name)
        if triple:
            self.module.triple = triple
        if data_layout:
            self.module.data_layout = data_layout
        self._outlined = 0
        #: CPU features (LLVM names, no sign) the emitted intrinsics need
        self.required_features: set[str] = set()

    def generate(self) -> ir.Module:
        bufs = (*self.kernel.params, *self.kernel.workspace)
        fnty = ir.FunctionType(ir.VoidType(), [PTR] * len(bufs) + [I64])
        fn = ir.Function(self.module, fnty, name=self.kernel.name)
        for arg, buf in zip(fn.args, bufs, strict=False):
            arg.name = buf.name
            arg.add_attribute("noalias")
        fn.args[-1].name = "nthreads"
        scope = self._open(fn, dict(zip(bufs, fn.args, strict=False)), {}, in_parallel=False)
        self._nthreads = fn.args[-1]
        self._body(scope, self.kernel.body)
        scope.builder.ret_void()
        return self.module

    # -- functions ---------------------------------------------------------------------------
    def _open(self, fn: ir.Function, buffers: dict[Buffer, ir.Value], env: dict[Var, ir.Value],
              in_parallel: bool) -> _Scope:
        entry = fn.append_basic_block("entry")
        start = fn.append_basic_block("start")
        ir.IRBuilder(entry).branch(start)  # allocas go before this branch
        return _Scope(fn, ir.IRBuilder(start), entry, dict(env), dict(buffers), in_parallel)

    def _alloca(self, scope: _Scope, buf: Buffer) -> ir.Value:
        b = ir.IRBuilder(scope.entry)
        b.position_before(scope.entry.terminator)
        slot = b.alloca(ir.ArrayType(element(buf.dtype), buf.size + buf.slack), name=buf.name)
        slot.align = 64
        return slot

    # -- statements --------------------------------------------------------------------------
    def _body(self, scope: _Scope, body: tuple[Stmt, ...]) -> None:
        for s in body:
            self._stmt(scope, s)

    def _stmt(self, scope: _Scope, s: Stmt) -> None:
        if isinstance(s, Store):
            self._store(scope, s)
        elif isinstance(s, Loop):
            self._loop(scope, s)
        elif isinstance(s, Allocate):
            scope.buffers[s.buffer] = self._alloca(scope, s.buffer)
            self._body(scope, s.body)
        elif isinstance(s, IfThen):
            with scope.builder.if_then(self._expr(scope, s.cond)):
                self._body(scope, s.body)
        else:
            raise CodegenError(f"cannot generate {type(s).__name__}")

    def _loop(self, scope: _Scope, s: Loop) -> None:
        if s.kind is LoopKind.UNROLL:
            for i in range(s.extent):
                scope.env[s.var] = ir.Constant(I64, i)
                self._body(scope, s.body)
            del scope.env[s.var]
        elif s.kind is LoopKind.VECTORIZE:
            self._vector_loop(scope, s)
        elif s.kind is LoopKind.PARALLEL and not scope.in_parallel:
            self._parallel_loop(scope, s)
        else:  # serial, an inner parallel loop, or a GPU kind run serially on the host
            self._serial_loop(scope, s, ir.Constant(I64, 0), ir.Constant(I64, s.extent))

    def _serial_loop(self, scope: _Scope, s: Loop, lo: ir.Value, hi: ir.Value) -> None:
        b = scope.builder
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
        scope.env[s.var] = index
        self._body(scope, s.body)
        index.add_incoming(b.add(index, ir.Constant(I64, 1)), b.block)
        b.branch(header)
        b.position_at_end(done)
        del scope.env[s.var]

    # -- parallel ----------------------------------------------------------------------------
    def _parallel_loop(self, scope: _Scope, s: Loop) -> None:
        """Outline the loop: body(ptrs..., vars..., lo, hi) does iterations [lo, hi)."""
        self._outlined += 1
        tag = f"{self.kernel.name}.par{self._outlined}"
        bufs = [b for b in scope.buffers if b.scope in (Scope.GLOBAL, Scope.WORKSPACE)]
        bound = list(scope.env)
        body_ty = ir.FunctionType(ir.VoidType(), [PTR] * len(bufs) + [I64] * (len(bound) + 2))
        body_fn = ir.Function(self.module, body_ty, name=f"{tag}.body")
        body_fn.linkage = "internal"
        for arg in body_fn.args[: len(bufs)]:
            arg.add_attribute("noalias")
        inner = self._open(
            body_fn,
            dict(zip(bufs, body_fn.args[: len(bufs)], strict=True)),
            dict(zip(bound, body_fn.args[len(bufs) : -2], strict=True)),
            in_parallel=True,
        )
        self._serial_loop(inner, s, body_fn.args[-2], body_fn.args[-1])
        inner.builder.ret_void()

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
        gomp = self._declare("GOMP_parallel", ir.VoidType(), [PTR, PTR, I32, I32])
        b.call(gomp, [omp_fn, closure, b.trunc(self._nthreads, I32), ir.Constant(I32, 0)])
        b.branch(done)
        b.position_at_end(done)

    def _omp_trampoline(self, tag: str, body_fn: ir.Function, closure_ty: ir.Type,
                        nfields: int, extent: int) -> ir.Function:
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR]), name=f"{tag}.omp")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        tid = b.sext(b.call(self._declare("omp_get_thread_num", I32, []), []), I64)
        nt = b.sext(b.call(self._declare("omp_get_num_threads", I32, []), []), I64)
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

    def _declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        existing = self.module.globals.get(name)
        if isinstance(existing, ir.Function):
            return existing
        return ir.Function(self.module, ir.FunctionType(ret, args), name=name)

    # -- scalar expressions ------------------------------------------------------------------
    def _address(self, scope: _Scope, buf: Buffer, offset: Expr) -> ir.Value:
        try:
            base = scope.buffers[buf]
        except KeyError:
            raise CodegenError(f"buffer {buf.name} is used outside its scope") from None
        return scope.builder.gep(base, [self._expr(scope, offset)], inbounds=True,
                                 source_etype=element(buf.dtype))

    def _store(self, scope: _Scope, s: Store) -> None:
        ptr = self._address(scope, s.buffer, flat_offset(s.buffer, s.indices))
        _store_to(scope.builder, self._expr(scope, s.value), ptr, align_of(s.buffer.dtype))

    def _expr(self, scope: _Scope, e: Expr) -> ir.Value:
        b = scope.builder
        if isinstance(e, Var):
            try:
                return scope.env[e]
            except KeyError:
                raise CodegenError(f"loop variable {e.name} used outside its loop") from None
        if isinstance(e, Const):
            return ir.Constant(element(e.dtype), e.value)
        if isinstance(e, Load):
            return b.load(self._address(scope, e.buffer, flat_offset(e.buffer, e.indices)),
                          typ=element(e.dtype), align=align_of(e.dtype))
        if isinstance(e, Cast):
            return emit_cast(b, self._expr(scope, e.arg), e.arg.dtype, e.to)
        if isinstance(e, Intrinsic):
            return self._intrinsic(b, e, [self._expr(scope, a) for a in e.args])
        if isinstance(e, Select):
            return b.select(self._expr(scope, e.cond), self._expr(scope, e.a),
                            self._expr(scope, e.b))
        if isinstance(e, BinOp):
            fused = _as_fma(e)
            if fused is not None:
                return self._fma(b, *(self._expr(scope, x) for x in fused))
            return self._binop(b, e.op, self._expr(scope, e.a), self._expr(scope, e.b),
                               e.a.dtype)
        if isinstance(e, Call):
            return emit_math(b, self.module, e.fn, self._expr(scope, e.arg))
        raise CodegenError(f"cannot generate expression {type(e).__name__}")

    def _binop(self, b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
        if dtype == "float32":
            table = {"+": b.fadd, "-": b.fsub, "*": b.fmul, "/": b.fdiv}
            if op in table:
                return table[op](x, y)
            if op in ("max", "min"):
                return b.select(b.fcmp_ordered(">" if op == "max" else "<", x, y), x, y)
            if op in _FCMP:
                return b.fcmp_ordered(_FCMP[op], x, y)
        else:
            itable = {"+": b.add, "-": b.sub, "*": b.mul, "//": b.sdiv, "%": b.srem,
                      "and": b.and_}
            if op in itable:
                return itable[op](x, y)
            if op in _ICMP:
                return b.icmp_signed(_ICMP[op], x, y)
            if op in ("max", "min"):
                return b.select(b.icmp_signed(">" if op == "max" else "<", x, y), x, y)
        raise CodegenError(f"operator {op} on {dtype} is not supported")

    def _intrinsic(self, b: ir.IRBuilder, e: Intrinsic, args: list[ir.Value]) -> ir.Value:
        feature = intrinsic_feature(e.fn)
        if feature:
            self.required_features.add(feature)
        return emit_intrinsic(b, self.module, e.fn, args)

    def _fma(self, b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        ty = x.type
        name = "llvm.fmuladd.f32" if ty == F32 else f"llvm.fmuladd.v{ty.count}f32"
        return b.call(self._declare(name, ty, [ty, ty, ty]), [x, y, z])

    # -- vector code -------------------------------------------------------------------------
    def _vector_loop(self, scope: _Scope, s: Loop) -> None:
        for stmt in s.body:
            if isinstance(stmt, Loop) and stmt.kind is LoopKind.UNROLL:
                for i in range(stmt.extent):
                    scope.env[stmt.var] = ir.Constant(I64, i)
                    self._vector_loop(scope, Loop(s.var, s.extent, s.kind, stmt.body))
                del scope.env[stmt.var]
            elif isinstance(stmt, Store) and self._vectorizable(stmt, s.var):
                start = 0
                for width in _vector_chunks(s.extent):
                    part = _subst_stmt(stmt, s.var, s.var + start) if start else stmt
                    assert isinstance(part, Store)
                    self._vector_store(scope, part, s.var, width)
                    start += width
            else:  # not SIMD-friendly: emit it lane by lane
                for lane in range(s.extent):
                    self._stmt(scope, _subst_stmt(stmt, s.var, lane))

    @staticmethod
    def _vectorizable(s: Store, lane: Var) -> bool:
        offsets = [flat_offset(s.buffer, s.indices)] + [
            flat_offset(ld.buffer, ld.indices) for ld in loads_in(s.value)
        ]
        if any(linear_coeff(o, lane) is None for o in offsets):
            return False
        return not _lane_in_control(s.value, lane)

    def _vector_store(self, scope: _Scope, s: Store, lane: Var, lanes: int) -> None:
        value = self._vexpr(scope, s.value, lane, lanes)
        b = scope.builder
        offset = flat_offset(s.buffer, s.indices)
        stride = linear_coeff(offset, lane)
        base = substitute(offset, lane, 0)
        if not isinstance(value.type, ir.VectorType):
            value = self._splat(b, value, lanes)
        align = align_of(s.buffer.dtype)
        if stride == 1:
            _store_to(b, value, self._address(scope, s.buffer, base), align)
            return
        for i in range(lanes):  # scattered (or repeated) destination: one lane at a time
            ptr = self._address(scope, s.buffer, base + i * (stride or 0))
            _store_to(b, b.extract_element(value, ir.Constant(I32, i)), ptr, align)

    def _vexpr(self, scope: _Scope, e: Expr, lane: Var, lanes: int) -> ir.Value:
        """A float expression over the lanes; values that do not vary stay scalar."""
        b = scope.builder
        if not uses_var(e, lane):
            return self._expr(scope, e)
        if isinstance(e, Load):
            return self._vload(scope, e, lane, lanes)
        if isinstance(e, BinOp):
            fused = _as_fma(e)
            if fused is not None:
                parts = [self._vexpr(scope, x, lane, lanes) for x in fused]
                return self._fma(b, *(self._widen(b, p, lanes) for p in parts))
            x = self._widen(b, self._vexpr(scope, e.a, lane, lanes), lanes)
            y = self._widen(b, self._vexpr(scope, e.b, lane, lanes), lanes)
            return self._binop(b, e.op, x, y, e.a.dtype)
        if isinstance(e, Select):  # the condition does not vary with the lane (checked)
            x = self._widen(b, self._vexpr(scope, e.a, lane, lanes), lanes)
            y = self._widen(b, self._vexpr(scope, e.b, lane, lanes), lanes)
            return b.select(self._expr(scope, e.cond), x, y)
        if isinstance(e, Call):
            arg = self._widen(b, self._vexpr(scope, e.arg, lane, lanes), lanes)
            return emit_math(b, self.module, e.fn, arg)
        if isinstance(e, Cast):
            arg = self._widen(b, self._vexpr(scope, e.arg, lane, lanes), lanes)
            return emit_cast(b, arg, e.arg.dtype, e.to)
        if isinstance(e, Intrinsic):
            args = [self._widen(b, self._vexpr(scope, a, lane, lanes), lanes) for a in e.args]
            return self._intrinsic(b, e, args)
        raise CodegenError(f"cannot vectorize {type(e).__name__}")

    def _vload(self, scope: _Scope, e: Load, lane: Var, lanes: int) -> ir.Value:
        b = scope.builder
        offset = flat_offset(e.buffer, e.indices)
        stride = linear_coeff(offset, lane)
        base = substitute(offset, lane, 0)
        elem, align = element(e.dtype), align_of(e.dtype)
        vec = ir.VectorType(elem, lanes)
        if stride == 1:
            return b.load(self._address(scope, e.buffer, base), typ=vec, align=align)
        if stride is not None and 1 < stride <= 4 and e.buffer.slack >= stride - 1:
            wide_ty = ir.VectorType(elem, lanes * stride)
            wide = b.load(self._address(scope, e.buffer, base), typ=wide_ty, align=align)
            mask = ir.Constant(ir.VectorType(I32, lanes), [i * stride for i in range(lanes)])
            return b.shuffle_vector(wide, wide, mask)
        out: ir.Value = ir.Constant(vec, None)
        for i in range(lanes):  # gather by hand
            value = self._expr(scope, substitute(e, lane, i))
            out = b.insert_element(out, value, ir.Constant(I32, i))
        return out

    def _widen(self, b: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
        return value if isinstance(value.type, ir.VectorType) else self._splat(b, value, lanes)

    @staticmethod
    def _splat(b: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
        vec = ir.VectorType(value.type, lanes)
        one = b.insert_element(ir.Constant(vec, None), value, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(vec, None),
                                ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


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


def _store_to(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, align: int = 4) -> None:
    # llvmlite types stack slots with their pointee; the printed IR is opaque-pointer IR
    # either way, so the cast only satisfies llvmlite's own type check.
    pointee = getattr(ptr.type, "pointee", None)
    if pointee is not None and pointee != value.type:
        ptr = b.bitcast(ptr, value.type.as_pointer())
    b.store(value, ptr, align=align)


def _as_fma(e: BinOp) -> tuple[Expr, Expr, Expr] | None:
    """``a * b + c`` or ``c + a * b`` on floats, as (a, b, c)."""
    if e.op != "+" or e.dtype != "float32":
        return None
    for prod, other in ((e.a, e.b), (e.b, e.a)):
        if isinstance(prod, BinOp) and prod.op == "*":
            return prod.a, prod.b, other
    return None


def _lane_in_control(e: Expr, lane: Var) -> bool:
    """True if the lane index feeds a select condition or a comparison (not SIMD-able here)."""
    if isinstance(e, Select):
        return uses_var(e.cond, lane) or _lane_in_control(e.a, lane) or _lane_in_control(e.b, lane)
    if isinstance(e, BinOp):
        if e.op in COMPARISONS and uses_var(e, lane):
            return True
        return _lane_in_control(e.a, lane) or _lane_in_control(e.b, lane)
    if isinstance(e, Call | Cast):
        return _lane_in_control(e.arg, lane)
    if isinstance(e, Intrinsic):
        return any(_lane_in_control(a, lane) for a in e.args)
    return False


def _subst_stmt(s: Stmt, var: Var, value: Expr | int) -> Stmt:
    if isinstance(s, Store):
        return Store(s.buffer, tuple(substitute(i, var, value) for i in s.indices),
                     substitute(s.value, var, value))
    if isinstance(s, Loop):
        return Loop(s.var, s.extent, s.kind, tuple(_subst_stmt(x, var, value) for x in s.body))
    if isinstance(s, IfThen):
        return IfThen(substitute(s.cond, var, value),
                      tuple(_subst_stmt(x, var, value) for x in s.body))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, tuple(_subst_stmt(x, var, value) for x in s.body))
    raise CodegenError(f"cannot substitute into {type(s).__name__}")


def generate_llvm_ir(kernel: Kernel, triple: str = "", data_layout: str = "") -> ir.Module:
    return LLVMGenerator(kernel, triple, data_layout).generate()
