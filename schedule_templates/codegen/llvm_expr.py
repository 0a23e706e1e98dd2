"""IR expressions -> LLVM values: scalar code in one function, and SIMD code over a lane loop.

``FunctionScope`` is everything bound while emitting one LLVM function (builder, loop indices,
buffer pointers) and turns an expression into a scalar value. ``VectorEmitter`` turns the value
and target of one store under a vectorized loop into ``<L x T>`` code: loads whose address does
not move with the lane are broadcast, unit-stride ones are vector loads, small strides are a wide
load (the lanes' whole span, or, where the buffer has no slack to over-read, two overlapping
loads up to the last lane's element) plus a shuffle, anything else is gathered lane by lane;
``a * b + c`` on floats becomes ``llvm.fmuladd`` in both.
"""

from __future__ import annotations

from llvmlite import ir

from schedule_templates.codegen.llvm_dtypes import (
    F32,
    I32,
    align_of,
    element,
    emit_cast,
    emit_intrinsic,
    emit_lrint,
    intrinsic_feature,
)
from schedule_templates.codegen.llvm_math import emit_math
from schedule_templates.errors import CodegenError
from schedule_templates.ir.analysis import flat_offset, linear_coeff, loads_in, substitute, uses_var
from schedule_templates.ir.nodes import (
    COMPARISONS,
    BinOp,
    Buffer,
    Call,
    Cast,
    Const,
    Expr,
    Intrinsic,
    Load,
    Prefetch,
    Select,
    Store,
    Var,
)
from schedule_templates.ir.visitor import ExprFunctor

_ICMP = {"<": "<", "<=": "<=", ">=": ">=", ">": ">", "==": "==", "!=": "!="}
_FCMP = {"<": "<", "<=": "<=", ">=": ">=", ">": ">", "==": "==", "!=": "!="}


class ModuleContext:
    """The module being built, its declarations, and the CPU features its code needs."""

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        #: CPU features (LLVM names, no sign) the emitted intrinsics need
        self.required_features: set[str] = set()

    def declare(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        existing = self.module.globals.get(name)
        if isinstance(existing, ir.Function):
            return existing
        return ir.Function(self.module, ir.FunctionType(ret, args), name=name)

    def intrinsic(self, b: ir.IRBuilder, e: Intrinsic, args: list[ir.Value]) -> ir.Value:
        feature = intrinsic_feature(e.fn)
        if feature:
            self.required_features.add(feature)
        return emit_intrinsic(b, self.module, e.fn, args)

    def fma(self, b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        ty = x.type
        name = "llvm.fmuladd.f32" if ty == F32 else f"llvm.fmuladd.v{ty.count}f32"
        return b.call(self.declare(name, ty, [ty, ty, ty]), [x, y, z])


class FunctionScope(ExprFunctor[ir.Value]):
    """Everything bound while emitting one LLVM function; expressions become scalar values."""

    def __init__(self, ctx: ModuleContext, fn: ir.Function, builder: ir.IRBuilder,
                 entry: ir.Block, env: dict[Var, ir.Value], buffers: dict[Buffer, ir.Value],
                 in_parallel: bool) -> None:
        self.ctx = ctx
        self.fn = fn
        self.builder = builder
        self.entry = entry
        self.env = env
        self.buffers = buffers
        self.in_parallel = in_parallel
        #: whether the entry block loads the AMX palette (``llvm_amx``): released at return
        self.tiles_configured = False

    def address(self, buf: Buffer, offset: Expr) -> ir.Value:
        try:
            base = self.buffers[buf]
        except KeyError:
            raise CodegenError(f"buffer {buf.name} is used outside its scope") from None
        return self.builder.gep(base, [self.visit_expr(offset)], inbounds=True,
                                source_etype=element(buf.dtype))

    def store(self, s: Store) -> None:
        ptr = self.address(s.buffer, flat_offset(s.buffer, s.indices))
        store_to(self.builder, self.visit_expr(s.value), ptr, align_of(s.buffer.dtype))

    def prefetch(self, s: Prefetch) -> None:
        """``llvm.prefetch`` (read, data cache) of the target's address; the address may lie
        past the buffer (the next block of a loop's last iteration), so it is computed without
        ``inbounds``, which would make it poison and let LLVM drop the hint."""
        target = s.target
        try:
            base = self.buffers[target.buffer]
        except KeyError:
            raise CodegenError(f"buffer {target.buffer.name} is used outside its scope") from None
        ptr = self.builder.gep(base, [self.visit_expr(flat_offset(target.buffer, target.indices))],
                               source_etype=element(target.buffer.dtype))
        fn = self.ctx.declare("llvm.prefetch.p0", ir.VoidType(), [ptr.type, I32, I32, I32])
        self.builder.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, s.locality),
                               ir.Constant(I32, 1)])

    def default_expr(self, e: Expr) -> ir.Value:
        raise CodegenError(f"cannot generate expression {type(e).__name__}")

    def visit_var(self, e: Var) -> ir.Value:
        try:
            return self.env[e]
        except KeyError:
            raise CodegenError(f"loop variable {e.name} used outside its loop") from None

    def visit_const(self, e: Const) -> ir.Value:
        return ir.Constant(element(e.dtype), e.value)

    def visit_load(self, e: Load) -> ir.Value:
        return self.builder.load(self.address(e.buffer, flat_offset(e.buffer, e.indices)),
                                 typ=element(e.dtype), align=align_of(e.dtype))

    def visit_cast(self, e: Cast) -> ir.Value:
        rounded = rounded_operand(e)
        if rounded is not None:
            return emit_lrint(self.builder, self.ctx.module, self.visit_expr(rounded))
        return emit_cast(self.builder, self.visit_expr(e.arg), e.arg.dtype, e.to)

    def visit_intrinsic(self, e: Intrinsic) -> ir.Value:
        return self.ctx.intrinsic(self.builder, e, [self.visit_expr(a) for a in e.args])

    def visit_select(self, e: Select) -> ir.Value:
        return self.builder.select(self.visit_expr(e.cond), self.visit_expr(e.a),
                                   self.visit_expr(e.b))

    def visit_binop(self, e: BinOp) -> ir.Value:
        fused = as_fma(e)
        if fused is not None:
            return self.ctx.fma(self.builder, *(self.visit_expr(x) for x in fused))
        return emit_binop(self.builder, e.op, self.visit_expr(e.a), self.visit_expr(e.b),
                          e.a.dtype)

    def visit_call(self, e: Call) -> ir.Value:
        return emit_math(self.builder, self.ctx.module, e.fn, self.visit_expr(e.arg))


def emit_binop(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    """One binary operator on scalars or vectors of ``dtype``."""
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


class VectorEmitter(ExprFunctor[ir.Value]):
    """SIMD code for one store over ``lanes`` values of the loop variable ``lane`` (starting at
    zero); values that do not vary with the lane stay scalar."""

    def __init__(self, scope: FunctionScope, lane: Var, lanes: int) -> None:
        self.scope = scope
        self.lane = lane
        self.lanes = lanes

    def store(self, s: Store) -> None:
        scope, b, lanes = self.scope, self.scope.builder, self.lanes
        value = self.vector(s.value)
        offset = flat_offset(s.buffer, s.indices)
        stride = linear_coeff(offset, self.lane)
        base = substitute(offset, self.lane, 0)
        align = align_of(s.buffer.dtype)
        if stride == 1:
            store_to(b, value, scope.address(s.buffer, base), align)
            return
        for i in range(lanes):  # scattered (or repeated) destination: one lane at a time
            ptr = scope.address(s.buffer, base + i * (stride or 0))
            store_to(b, b.extract_element(value, ir.Constant(I32, i)), ptr, align)

    def visit_expr(self, e: Expr) -> ir.Value:
        if not uses_var(e, self.lane):
            return self.scope.visit_expr(e)
        return super().visit_expr(e)

    def vector(self, e: Expr) -> ir.Value:
        """``e`` as a vector value (broadcast when it does not vary)."""
        return self._widen(self.visit_expr(e))

    def _widen(self, value: ir.Value) -> ir.Value:
        return value if isinstance(value.type, ir.VectorType) else self._splat(value)

    def default_expr(self, e: Expr) -> ir.Value:
        raise CodegenError(f"cannot vectorize {type(e).__name__}")

    def visit_binop(self, e: BinOp) -> ir.Value:
        b = self.scope.builder
        fused = as_fma(e)
        if fused is not None:
            parts = [self.visit_expr(x) for x in fused]  # all three, then the broadcasts
            return self.scope.ctx.fma(b, *(self._widen(p) for p in parts))
        return emit_binop(b, e.op, self.vector(e.a), self.vector(e.b), e.a.dtype)

    def visit_select(self, e: Select) -> ir.Value:
        # the condition does not vary with the lane (``vectorizable`` checked)
        x, y = self.vector(e.a), self.vector(e.b)
        return self.scope.builder.select(self.scope.visit_expr(e.cond), x, y)

    def visit_call(self, e: Call) -> ir.Value:
        arg = self.vector(e.arg)
        return emit_math(self.scope.builder, self.scope.ctx.module, e.fn, arg)

    def visit_cast(self, e: Cast) -> ir.Value:
        rounded = rounded_operand(e)
        if rounded is not None:
            return emit_lrint(self.scope.builder, self.scope.ctx.module, self.vector(rounded))
        return emit_cast(self.scope.builder, self.vector(e.arg), e.arg.dtype, e.to)

    def visit_intrinsic(self, e: Intrinsic) -> ir.Value:
        args = [self.vector(a) for a in e.args]
        return self.scope.ctx.intrinsic(self.scope.builder, e, args)

    def visit_load(self, e: Load) -> ir.Value:
        scope, b, lanes = self.scope, self.scope.builder, self.lanes
        offset = flat_offset(e.buffer, e.indices)
        stride = linear_coeff(offset, self.lane)
        base = substitute(offset, self.lane, 0)
        elem, align = element(e.dtype), align_of(e.dtype)
        vec = ir.VectorType(elem, lanes)
        if stride == 1:
            return b.load(scope.address(e.buffer, base), typ=vec, align=align)
        if stride is not None and 1 < stride <= 4:
            return self._strided_load(e, base, stride)
        out: ir.Value = ir.Constant(vec, None)
        for i in range(lanes):  # gather by hand
            value = scope.visit_expr(substitute(e, self.lane, i))
            out = b.insert_element(out, value, ir.Constant(I32, i))
        return out

    def _strided_load(self, e: Load, base: Expr, stride: int) -> ir.Value:
        """Lanes ``stride`` elements apart: the lanes' whole span in one load where the buffer
        has slack past its end, else up to the last lane's element only, as two loads of a
        power-of-two width that overlap (an odd-sized ``<31 x i8>`` load was legalized into
        byte inserts: a stride-2 phase stage ran at a tenth of stride 1's bytes per second);
        then a shuffle picks the lanes."""
        b, lanes = self.scope.builder, self.lanes
        elem, align = element(e.dtype), align_of(e.dtype)
        offsets = [i * stride for i in range(lanes)]
        if e.buffer.slack >= stride - 1:
            span = lanes * stride
            wide = b.load(self.scope.address(e.buffer, base),
                          typ=ir.VectorType(elem, span), align=align)
            return b.shuffle_vector(wide, wide, ir.Constant(ir.VectorType(I32, lanes), offsets))
        span = (lanes - 1) * stride + 1
        half = 1 << (span.bit_length() - 1)  # two of these cover the span
        typ = ir.VectorType(elem, half)
        low = b.load(self.scope.address(e.buffer, base), typ=typ, align=align)
        high = b.load(self.scope.address(e.buffer, base + (span - half)), typ=typ, align=align)
        mask = [o if o < half else half + o - (span - half) for o in offsets]
        return b.shuffle_vector(low, high, ir.Constant(ir.VectorType(I32, lanes), mask))

    def _splat(self, value: ir.Value) -> ir.Value:
        b, lanes = self.scope.builder, self.lanes
        vec = ir.VectorType(value.type, lanes)
        one = b.insert_element(ir.Constant(vec, None), value, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(vec, None),
                                ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def rounded_operand(e: Cast) -> Expr | None:
    """``x`` where ``e`` is ``int32(roundeven(x))``: one conversion in the default rounding
    mode (``llvm.lrint``, x86's ``cvtps2dq``) instead of a round then a truncation; both are
    undefined past int32's range, so nothing a kernel may rely on changes."""
    arg = e.arg
    if e.to == "int32" and isinstance(arg, Intrinsic) and arg.fn == "roundeven":
        return arg.args[0]
    return None


def vectorizable(s: Store, lane: Var) -> bool:
    """Every address affine in the lane and no lane-dependent control (selects, compares)."""
    offsets = [flat_offset(s.buffer, s.indices)] + [
        flat_offset(ld.buffer, ld.indices) for ld in loads_in(s.value)
    ]
    if any(linear_coeff(o, lane) is None for o in offsets):
        return False
    return not _LaneInControl(lane).visit_expr(s.value)


class _LaneInControl(ExprFunctor[bool]):
    """True if the lane index feeds a select condition or a comparison (not SIMD-able here)."""

    def __init__(self, lane: Var) -> None:
        self.lane = lane

    def default_expr(self, e: Expr) -> bool:
        return False

    def visit_select(self, e: Select) -> bool:
        return uses_var(e.cond, self.lane) or self.visit_expr(e.a) or self.visit_expr(e.b)

    def visit_binop(self, e: BinOp) -> bool:
        if e.op in COMPARISONS and uses_var(e, self.lane):
            return True
        return self.visit_expr(e.a) or self.visit_expr(e.b)

    def visit_call(self, e: Call) -> bool:
        return self.visit_expr(e.arg)

    def visit_cast(self, e: Cast) -> bool:
        return self.visit_expr(e.arg)

    def visit_intrinsic(self, e: Intrinsic) -> bool:
        return any(self.visit_expr(a) for a in e.args)


def store_to(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, align: int = 4) -> None:
    # llvmlite types stack slots with their pointee; the printed IR is opaque-pointer IR
    # either way, so the cast only satisfies llvmlite's own type check.
    pointee = getattr(ptr.type, "pointee", None)
    if pointee is not None and pointee != value.type:
        ptr = b.bitcast(ptr, value.type.as_pointer())
    b.store(value, ptr, align=align)


def as_fma(e: BinOp) -> tuple[Expr, Expr, Expr] | None:
    """``a * b + c`` or ``c + a * b`` on floats, as (a, b, c)."""
    if e.op != "+" or e.dtype != "float32":
        return None
    for prod, other in ((e.a, e.b), (e.b, e.a)):
        if isinstance(prod, BinOp) and prod.op == "*":
            return prod.a, prod.b, other
    return None
