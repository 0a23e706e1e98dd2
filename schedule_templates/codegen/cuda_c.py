"""Loop-nest IR -> CUDA C: one ``extern "C" __global__`` kernel and its launch shape.

- block and thread loops become ``blockIdx``/``threadIdx`` (guarded when a loop is shorter than
  the launch dimension); ``Barrier`` is ``__syncthreads()``;
- SHARED buffers are ``__shared__ __align__(16)`` arrays, LOCAL ones per-thread arrays that
  nvcc keeps in registers when every index is a constant after unrolling;
- unrolled loops stay loops under ``#pragma unroll`` (readable; nvcc unrolls them fully);
- a vectorized loop of 2 or 4 lanes around one store reads every unit-stride operand whose
  address provably divides by the width as one ``float2``/``float4`` (and writes the same way);
  anything else is emitted lane by lane, which is always correct;
- inputs are ``const T* __restrict__`` of their element type (``float``, ``int``, ``unsigned
  char``, ``signed char``), indices are 32-bit ``int`` (tensors stay below 2^30 elements);
- ``Cast`` is a C conversion (float to integer truncates, as in the IR; integer narrowing
  wraps), ``roundeven`` is ``rintf`` (round half to even in the default rounding mode),
  ``dp4a`` is PTX ``dp4a.u32.s32`` through a small inline function emitted once per file, and
  ``bytes4`` packs four low bytes with shifts.
"""

from __future__ import annotations

import dataclasses
import math
import re

from schedule_templates.codegen.cuda_index import fold_sums, vector_access
from schedule_templates.errors import CodegenError
from schedule_templates.ir.analysis import (
    ReplaceLoads,
    body_uses_var,
    flat_offset,
    loads_in,
    stored_buffers,
    substitute,
)
from schedule_templates.ir.gpu import BLOCK_KINDS, THREAD_KINDS, LaunchDims, launch_dims
from schedule_templates.ir.nodes import (
    Allocate,
    Barrier,
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
    Prefetch,
    Scope,
    Select,
    Stmt,
    Store,
    Var,
)
from schedule_templates.ir.visitor import ExprFunctor, StmtFunctor
from schedule_templates.ir.warp import WarpMma

#: C precedence (higher binds tighter)
_PRECEDENCE = {"and": 1, "==": 2, "!=": 2, "<": 3, "<=": 3, ">=": 3, ">": 3,
               "+": 4, "-": 4, "*": 5, "//": 5, "%": 5, "/": 5}
_C_OP = {"//": "/", "and": "&&"}
#: the IR's math functions as CUDA C (``{}`` is the argument)
_C_MATH = {"exp": "expf({})", "log": "logf({})", "sqrt": "sqrtf({})", "tanh": "tanhf({})",
           "erf": "erff({})", "sigmoid": "(1.0f / (1.0f + expf(-({}))))", "abs": "fabsf({})",
           "floor": "floorf({})"}
_COMPONENTS = "xyzw"
#: the C element type of each IR element type the generator supports
_C_TYPES = {"float32": "float", "int32": "int", "uint8": "unsigned char", "int8": "signed char"}
#: element types with ``float2``/``float4``-style vector types (``int2``, ``int4``)
_VECTOR_TYPES = {"float32": "float", "int32": "int"}
#: PTX dp4a with an unsigned first operand (CUDA's ``__dp4a`` has only equal signs); guarded,
#: since several kernels may share one file
_DP4A = """#ifndef TUNER_DP4A_US
#define TUNER_DP4A_US
static __device__ __forceinline__ int tuner_dp4a_us(int a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
#endif"""
_ATOM = 100  # precedence of text that never needs brackets
_RESERVED = {"int", "float", "const", "for", "if", "else", "do", "while", "return", "char",
             "void", "auto", "register", "signed", "unsigned", "long", "short", "double",
             "switch", "case", "break", "continue", "default", "static", "struct", "min", "max"}
_GPU_INDEX = {
    LoopKind.BLOCK_X: "blockIdx.x", LoopKind.BLOCK_Y: "blockIdx.y", LoopKind.BLOCK_Z: "blockIdx.z",
    LoopKind.THREAD_X: "threadIdx.x", LoopKind.THREAD_Y: "threadIdx.y",
    LoopKind.THREAD_Z: "threadIdx.z",
}


@dataclasses.dataclass(frozen=True)
class CudaKernel:
    """Generated source and everything needed to launch it."""

    name: str
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    #: argument buffer names, in call order (params, then workspace)
    params: tuple[str, ...]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


def generate_cuda(kernel: Kernel, name: str | None = None) -> CudaKernel:
    """CUDA C for ``kernel``; ``name`` overrides the symbol (several kernels in one file)."""
    return _Writer(kernel, name or kernel.name).generate()


class _Writer(ExprFunctor[tuple[str, int]], StmtFunctor[None]):
    """Statements become lines; expressions (text, precedence of the outermost operator)."""

    def __init__(self, kernel: Kernel, name: str) -> None:
        self.kernel = kernel
        self.name = _identifier(name)
        self.dims: LaunchDims = launch_dims(kernel)
        self.lines: list[str] = []
        self.depth = 1
        self.names: dict[Var, str] = {}
        self.live: set[str] = set()
        self.buffers: dict[Buffer, str] = {}
        self.shared_bytes = 0
        self._temps = 0
        self._uses_dp4a = False

    def generate(self) -> CudaKernel:
        args = (*self.kernel.params, *self.kernel.workspace)
        written = stored_buffers(self.kernel.body)
        decls = []
        for buf in args:
            ctype = _c_type(buf)
            cname = self._buffer_name(buf)
            const = "" if buf in written else "const "
            decls.append(f"{const}{ctype}* __restrict__ {cname}")
        self._body(self.kernel.body)
        grid, block = self.dims.grid, self.dims.block
        header = [
            f"// {self.kernel.name}: grid ({grid[0]}, {grid[1]}, {grid[2]}), "
            f"block ({block[0]}, {block[1]}, {block[2]}), {self.shared_bytes} bytes shared",
            f'extern "C" __global__ void __launch_bounds__({self.dims.threads})',
            f"{self.name}({', '.join(decls)}) {{",
        ]
        helpers = [_DP4A] if self._uses_dp4a else []
        source = "\n".join([*helpers, *header, *self.lines, "}"]) + "\n"
        return CudaKernel(self.name, source, grid, block, self.shared_bytes,
                          tuple(b.name for b in args))

    # -- names -------------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        base = _identifier(base)
        name, i = base, 1
        taken = self.live | set(self.buffers.values()) | _RESERVED
        while name in taken:
            name, i = f"{base}_{i}", i + 1
        return name

    def _buffer_name(self, buf: Buffer) -> str:
        cname = self._fresh(buf.name)
        self.buffers[buf] = cname
        return cname

    def _bind(self, var: Var) -> str:
        cname = self._fresh(var.name)
        self.names[var] = cname
        self.live.add(cname)
        return cname

    def _unbind(self, var: Var) -> None:
        self.live.discard(self.names.pop(var))

    def _emit(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    # -- statements --------------------------------------------------------------------------
    def _body(self, body: tuple[Stmt, ...]) -> None:
        for s in body:
            self.visit_stmt(s)

    def default_stmt(self, s: Stmt) -> None:
        raise CodegenError(f"cannot generate {type(s).__name__}")

    def visit_store(self, s: Store) -> None:
        self._emit(f"{self._ref(s.buffer, s.indices)} = {self._expr(s.value)};")

    def visit_ifthen(self, s: IfThen) -> None:
        self._emit(f"if ({self._expr(s.cond)}) {{")
        self._block(s.body)

    def visit_barrier(self, s: Barrier) -> None:
        self._emit("__syncthreads();")

    def visit_prefetch(self, s: Prefetch) -> None:
        return None  # a CPU cache hint: GPU kernels stage through shared memory instead

    def visit_warp_mma(self, s: WarpMma) -> None:
        """The lane's fragments straight from shared memory (PTX's layout for m16n8k32: A words
        ``pair`` and ``pair + 4`` of rows ``group`` and ``group + 8``, B words ``pair`` and
        ``pair + 4`` of column ``group``), then the instruction on its four accumulators."""
        group, pair = s.lane // 4, s.lane % 4
        row, word = s.a.indices
        col, b_word = s.b.indices
        a = [Load(s.a.buffer, (row + group + 8 * (i % 2), word + pair + 4 * (i // 2)))
             for i in range(4)]
        b = [Load(s.b.buffer, (col + group, b_word + pair + 4 * i)) for i in range(2)]
        accs = [self._expr(s.accumulator(i)) for i in range(4)]
        operands = ", ".join([*(f'"+r"({acc})' for acc in accs)])
        inputs = ", ".join(f'"r"({self._expr(x)})' for x in (*a, *b))
        self._emit('asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 '
                   '{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"')
        self._emit(f"    : {operands}")
        self._emit(f"    : {inputs});")

    def _block(self, body: tuple[Stmt, ...]) -> None:
        self.depth += 1
        self._body(body)
        self.depth -= 1
        self._emit("}")

    def visit_allocate(self, s: Allocate) -> None:
        buf = s.buffer
        ctype = _c_type(buf)
        cname = self._buffer_name(buf)
        size = buf.size + buf.slack
        if buf.scope is Scope.SHARED:
            self.shared_bytes += _ITEM_BYTES[buf.dtype] * size
            self._emit(f"__shared__ __align__(16) {ctype} {cname}[{size}];")
        elif buf.scope is Scope.LOCAL:
            self._emit(f"{ctype} {cname}[{size}];")
        else:
            raise CodegenError(f"buffer {buf.name}: cannot allocate {buf.scope.value} memory")
        self._body(s.body)

    def visit_loop(self, s: Loop) -> None:
        if s.kind in _GPU_INDEX:
            self._gpu_loop(s)
            return
        if s.kind is LoopKind.VECTORIZE and self._vector_loop(s):
            return
        if s.extent == 1:
            self._emit("{")
            self._emit(f"  const int {self._bind(s.var)} = 0;")
            self._block(s.body)
        else:
            if s.kind in (LoopKind.UNROLL, LoopKind.VECTORIZE):
                self._emit("#pragma unroll")
            v = self._bind(s.var)
            self._emit(f"for (int {v} = 0; {v} < {s.extent}; ++{v}) {{")
            self._block(s.body)
        self._unbind(s.var)

    def _gpu_loop(self, s: Loop) -> None:
        full = self.dims.extent(s.kind)
        kind = "block" if s.kind in BLOCK_KINDS else "thread"
        assert s.kind in BLOCK_KINDS or s.kind in THREAD_KINDS
        self._emit(f"{{  // {kind} loop {s.var.name} in 0..{s.extent}")
        v = self._bind(s.var)
        self.depth += 1
        if body_uses_var(s.body, s.var):
            self._emit(f"const int {v} = {_GPU_INDEX[s.kind]};")
        else:
            v = _GPU_INDEX[s.kind]
        if s.extent < full:
            self._emit(f"if ({v} < {s.extent}) {{")
            self._block(s.body)
        else:
            self._body(s.body)
        self.depth -= 1
        self._emit("}")
        self._unbind(s.var)

    # -- vector loops ------------------------------------------------------------------------
    def _vector_loop(self, s: Loop) -> bool:
        """One store over 2 or 4 lanes with vector loads/stores where alignment is provable;
        False (emit a plain unrolled loop) when nothing would be vectorized."""
        lanes = s.extent
        if lanes not in (2, 4) or len(s.body) != 1 or not isinstance(s.body[0], Store):
            return False
        st = s.body[0]
        lane = s.var
        vec_loads = [ld for ld in _unique_loads(st.value)
                     if ld.buffer.dtype in _VECTOR_TYPES
                     and vector_access(ld.buffer, ld.indices, lane, lanes)]
        vec_store = (st.buffer.dtype in _VECTOR_TYPES
                     and vector_access(st.buffer, st.indices, lane, lanes))
        if not vec_loads and not vec_store:
            return False
        self._emit("{")
        self.depth += 1
        parts: dict[int, list[Var]] = {}
        for ld in vec_loads:
            tmp = f"v{self._temps}"
            self._temps += 1
            vtype = f"{_VECTOR_TYPES[ld.buffer.dtype]}{lanes}"
            base = substitute(flat_offset(ld.buffer, ld.indices), lane, 0)
            self._emit(f"const {vtype} {tmp} = *reinterpret_cast<const {vtype}*>("
                       f"&{self.buffers[ld.buffer]}[{self._expr(fold_sums(base))}]);")
            comps = [Var(f"{tmp}.{_COMPONENTS[i]}") for i in range(lanes)]
            for c in comps:
                self.names[c] = c.name
            parts[id(ld)] = comps
        values = []
        for i in range(lanes):
            picked = ReplaceLoads({key: comps[i] for key, comps in parts.items()})
            values.append(self._expr(substitute(picked.visit_expr(st.value), lane, i)))
        offset = flat_offset(st.buffer, st.indices)
        if vec_store:
            vtype = f"{_VECTOR_TYPES[st.buffer.dtype]}{lanes}"
            base = substitute(offset, lane, 0)
            self._emit(f"*reinterpret_cast<{vtype}*>(&{self.buffers[st.buffer]}"
                       f"[{self._expr(fold_sums(base))}]) = make_{vtype}({', '.join(values)});")
        else:
            for i, value in enumerate(values):
                index = fold_sums(substitute(offset, lane, i))
                self._emit(f"{self.buffers[st.buffer]}[{self._expr(index)}] = {value};")
        for comps in parts.values():
            for c in comps:
                del self.names[c]
        self.depth -= 1
        self._emit("}")
        return True

    # -- expressions -------------------------------------------------------------------------
    def _ref(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        try:
            cname = self.buffers[buf]
        except KeyError:
            raise CodegenError(f"buffer {buf.name} is used outside its scope") from None
        return f"{cname}[{self._expr(fold_sums(flat_offset(buf, indices)))}]"

    def _expr(self, e: Expr, parent: int = 0) -> str:
        text, prec = self.visit_expr(e)
        return f"({text})" if prec < parent else text

    def default_expr(self, e: Expr) -> tuple[str, int]:
        raise CodegenError(f"cannot generate expression {type(e).__name__}")

    def visit_var(self, e: Var) -> tuple[str, int]:
        try:
            return self.names[e], _ATOM
        except KeyError:
            raise CodegenError(f"loop variable {e.name} used outside its loop") from None

    def visit_const(self, e: Const) -> tuple[str, int]:
        text = _float_literal(float(e.value)) if e.dtype == "float32" else str(int(e.value))
        return text, _ATOM

    def visit_load(self, e: Load) -> tuple[str, int]:
        return self._ref(e.buffer, e.indices), _ATOM

    def visit_select(self, e: Select) -> tuple[str, int]:
        text = f"{self._expr(e.cond, 1)} ? {self._expr(e.a, 1)} : {self._expr(e.b, 1)}"
        return f"({text})", _ATOM

    def visit_binop(self, e: BinOp) -> tuple[str, int]:
        if e.op in ("max", "min"):
            fn = f"f{e.op}f" if e.a.dtype == "float32" else e.op
            return f"{fn}({self._expr(e.a)}, {self._expr(e.b)})", _ATOM
        prec = _PRECEDENCE[e.op]
        # left-associative: the right operand of an equal-precedence operator needs brackets
        text = f"{self._expr(e.a, prec)} {_C_OP.get(e.op, e.op)} {self._expr(e.b, prec + 1)}"
        return text, prec

    def visit_call(self, e: Call) -> tuple[str, int]:
        return _C_MATH[e.fn].format(self._expr(e.arg)), _ATOM

    def visit_cast(self, e: Cast) -> tuple[str, int]:
        if e.to not in _C_TYPES or e.arg.dtype not in _C_TYPES:
            raise CodegenError(f"cannot convert {e.arg.dtype} to {e.to} in CUDA C")
        if e.to == e.arg.dtype:
            return self.visit_expr(e.arg)
        return f"(({_C_TYPES[e.to]})({self._expr(e.arg)}))", _ATOM

    def visit_intrinsic(self, e: Intrinsic) -> tuple[str, int]:
        args = [self._expr(a) for a in e.args]
        if e.fn == "roundeven":
            return f"rintf({args[0]})", _ATOM
        if e.fn == "dp4a":  # (acc, unsigned bytes, signed bytes)
            self._uses_dp4a = True
            return f"tuner_dp4a_us({args[1]}, {args[2]}, {args[0]})", _ATOM
        if e.fn == "bytes4":
            parts = [f"(((unsigned)({a}) & 255u) << {8 * i})" for i, a in enumerate(args)]
            return f"((int)({' | '.join(parts)}))", _ATOM
        raise CodegenError(f"the CUDA generator has no {e.fn} (an x86 instruction)")


def _unique_loads(e: Expr) -> list[Load]:
    seen: dict[int, Load] = {}
    for ld in loads_in(e):
        seen.setdefault(id(ld), ld)
    return list(seen.values())


_ITEM_BYTES = {"float32": 4, "int32": 4, "uint8": 1, "int8": 1}


def _c_type(buf: Buffer) -> str:
    try:
        return _C_TYPES[buf.dtype]
    except KeyError:
        raise CodegenError(f"buffer {buf.name}: no CUDA C type for {buf.dtype}") from None


def _identifier(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    return text if text and not text[0].isdigit() else f"_{text}"


def _float_literal(value: float) -> str:
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    if math.isnan(value):
        return "__int_as_float(0x7fffffff)"
    text = repr(value)
    if "e" not in text and "." not in text:
        text += ".0"
    return text + "f"
