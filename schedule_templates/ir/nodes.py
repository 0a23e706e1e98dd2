"""Loop-nest IR nodes.

Expressions are int64 index arithmetic or values of a buffer element type (``DTYPES``: float32
by default; the integer and bfloat16 types serve low-precision kernels, with explicit ``Cast``
between them and ``Intrinsic`` for target instructions such as VNNI dot products); statements
are loops (with a kind), stores, local allocations and guarded blocks. Nodes are immutable;
build them with the helpers at the bottom (``loop``, ``store``) and Python operators on
expressions.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence


class LoopKind(enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"  # split across CPU threads (outermost one only)
    VECTORIZE = "vectorize"  # the body becomes SIMD code over this loop
    UNROLL = "unroll"  # the body is replicated, the index becomes a constant
    # GPU binding kinds (used by the CUDA generator)
    BLOCK_X = "blockIdx.x"
    BLOCK_Y = "blockIdx.y"
    BLOCK_Z = "blockIdx.z"
    THREAD_X = "threadIdx.x"
    THREAD_Y = "threadIdx.y"
    THREAD_Z = "threadIdx.z"


class Scope(enum.Enum):
    GLOBAL = "global"  # a kernel argument
    WORKSPACE = "workspace"  # scratch memory the runtime allocates once (padded copies)
    LOCAL = "local"  # registers / stack of one thread (register tiles)
    SHARED = "shared"  # GPU shared memory


class Expr:
    """Base of expressions; arithmetic operators build BinOp nodes."""

    def __add__(self, other: ExprLike) -> Expr:
        return _binop("+", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return _binop("+", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return _binop("-", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return _binop("-", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return _binop("*", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return _binop("*", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return _binop("//", self, other)

    def __truediv__(self, other: ExprLike) -> Expr:
        return _binop("/", self, other)  # float division only

    def __rtruediv__(self, other: ExprLike) -> Expr:
        return _binop("/", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return _binop("%", self, other)

    def __lt__(self, other: ExprLike) -> Expr:
        return _binop("<", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return _binop(">=", self, other)

    @property
    def dtype(self) -> str:
        raise TypeError(f"{type(self).__name__} has no dtype")


ExprLike = Expr | int | float


@dataclasses.dataclass(frozen=True, eq=False)
class Var(Expr):
    name: str

    @property
    def dtype(self) -> str:
        return "int64"


@dataclasses.dataclass(frozen=True)
class Const(Expr):
    value: int | float
    const_dtype: str = "int64"

    @property
    def dtype(self) -> str:
        return self.const_dtype


_FOLD = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
}
COMPARISONS = ("<", "<=", ">=", ">", "==", "!=")
FLOAT_FUNCS = ("max", "min")
#: element types a Buffer may hold; bfloat16 is stored as its 16 raw bits
DTYPES = ("float32", "int32", "int8", "uint8", "bfloat16")
#: float -> float math functions a ``Call`` may name (code generators implement each one)
MATH_FUNCS = ("exp", "log", "sqrt", "tanh", "erf", "sigmoid", "abs", "floor")


@dataclasses.dataclass(frozen=True, eq=False)
class BinOp(Expr):
    op: str  # + - * // % / < <= >= > == != and max min  (/ is float division)
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return "bool" if self.op in (*COMPARISONS, "and") else self.a.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Buffer:
    name: str
    shape: tuple[int, ...]
    scope: Scope = Scope.GLOBAL
    dtype: str = "float32"
    #: extra elements allocated past the end (lets strided vector loads over-read safely)
    slack: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"buffer {self.name}: unknown dtype {self.dtype!r}; known: "
                             f"{', '.join(DTYPES)}")

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def strides(self) -> tuple[int, ...]:
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def __getitem__(self, idx: ExprLike | tuple[ExprLike, ...]) -> Load:
        indices = idx if isinstance(idx, tuple) else (idx,)
        if len(indices) != len(self.shape):
            raise ValueError(f"{self.name} has {len(self.shape)} dims, indexed with {len(indices)}")
        return Load(self, tuple(as_expr(i) for i in indices))


@dataclasses.dataclass(frozen=True, eq=False)
class Load(Expr):
    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Select(Expr):
    """``cond ? a : b``. Both sides are evaluated: never guard an unsafe load with it."""

    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Call(Expr):
    """``fn(arg)`` for a float math function named in ``MATH_FUNCS``."""

    fn: str
    arg: Expr

    def __post_init__(self) -> None:
        if self.fn not in MATH_FUNCS:
            raise ValueError(f"unknown math function {self.fn!r}; known: {', '.join(MATH_FUNCS)}")

    @property
    def dtype(self) -> str:
        return "float32"


@dataclasses.dataclass(frozen=True, eq=False)
class Cast(Expr):
    """``arg`` converted to the element type ``to``.

    float -> integer truncates toward zero (round first with the ``roundeven`` intrinsic);
    integer -> integer extends by the source's signedness or wraps; float32 -> bfloat16 rounds
    to nearest even; bfloat16 -> an integer type gives its 16 raw bits (zero-extended), which
    is what packing two of them into a word needs. Saturation is the caller's: clamp before
    narrowing."""

    to: str
    arg: Expr

    def __post_init__(self) -> None:
        if self.to not in (*DTYPES, "int64"):
            raise ValueError(f"cannot cast to {self.to!r}")

    @property
    def dtype(self) -> str:
        return self.to


@dataclasses.dataclass(frozen=True)
class IntrinsicSig:
    """What an intrinsic takes and gives, per lane; ``lanes`` > 0 fixes the vector width (the
    instruction exists only at that width), 0 means any width, scalars included."""

    result: str
    args: tuple[str, ...]
    lanes: int = 0


#: target instructions an ``Intrinsic`` may name (code generators map each to their own call)
INTRINSICS: dict[str, IntrinsicSig] = {
    # acc + sum of 4 products (u8 of a) * (s8 of b), per 32-bit lane: AVX-512 VNNI
    "vpdpbusd": IntrinsicSig("int32", ("int32", "int32", "int32"), 16),
    # acc + a.lo * b.lo + a.hi * b.hi on the two bfloat16 halves of each 32-bit lane
    "dpbf16ps": IntrinsicSig("float32", ("float32", "int32", "int32"), 16),
    # acc + a.lo * b.lo + a.hi * b.hi on the two signed 16-bit halves of each 32-bit lane
    # (AVX2 vpmaddwd + vpaddd; any multiple of 8 lanes)
    "pmaddwd": IntrinsicSig("int32", ("int32", "int32", "int32")),
    # vpdpbusd's sum through AVX2 vpmaddubsw (16-bit pair sums, saturating) + vpmaddwd by ones
    # + vpaddd: exact only while |w1| + |w2| <= 128 for each pair of b's s8 bytes (narrow
    # weights); any multiple of 8 lanes
    "pmaddubsw": IntrinsicSig("int32", ("int32", "int32", "int32")),
    # round half to even (the rounding of onnxruntime's requantization)
    "roundeven": IntrinsicSig("float32", ("float32",)),
    # vpdpbusd's arithmetic at any width: acc + the 4 products (u8 of a) * (s8 of b) of each
    # 32-bit lane (CUDA's dp4a, PTX ``dp4a.u32.s32``; LLVM emits it portably for host runs)
    "dp4a": IntrinsicSig("int32", ("int32", "int32", "int32")),
    # one word from the low bytes of four values, the first in the lowest byte (the word a
    # dot-product instruction takes, gathered from bytes that are not adjacent in memory)
    "bytes4": IntrinsicSig("int32", ("int32", "int32", "int32", "int32")),
}


@dataclasses.dataclass(frozen=True, eq=False)
class Intrinsic(Expr):
    """``fn(args...)`` for a target instruction named in ``INTRINSICS``, applied lane-wise."""

    fn: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        sig = INTRINSICS.get(self.fn)
        if sig is None:
            raise ValueError(f"unknown intrinsic {self.fn!r}; known: {', '.join(INTRINSICS)}")
        got = tuple(a.dtype for a in self.args)
        if got != sig.args:
            raise ValueError(f"{self.fn} takes ({', '.join(sig.args)}), got ({', '.join(got)})")

    @property
    def dtype(self) -> str:
        return INTRINSICS[self.fn].result


class Stmt:
    """Base of statements."""


@dataclasses.dataclass(frozen=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclasses.dataclass(frozen=True, eq=False)
class Loop(Stmt):
    var: Var
    extent: int
    kind: LoopKind
    body: tuple[Stmt, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    """A LOCAL (or SHARED) buffer live for ``body``."""

    buffer: Buffer
    body: tuple[Stmt, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class IfThen(Stmt):
    cond: Expr
    body: tuple[Stmt, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Prefetch(Stmt):
    """A hint to bring the cache line holding ``target`` towards the core: nothing is read
    into the kernel and an address past the buffer cannot fault (the instruction ignores it).
    ``locality`` is LLVM's: 3 keeps the line in every level (L1), 2 in L2 and out, 1 in the
    last level only. A target without prefetch instructions (the CUDA C writer) drops it."""

    target: Load
    locality: int = 2


@dataclasses.dataclass(frozen=True, eq=False)
class Barrier(Stmt):
    """``__syncthreads()``: every thread of a GPU block waits here. Only between thread-loop
    nests (never inside one): each phase between barriers is its own set of thread loops, which
    is also what makes a block runnable serially on the host."""


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    params: tuple[Buffer, ...]  # inputs then the output, in call order
    workspace: tuple[Buffer, ...]  # WORKSPACE buffers, passed after params
    body: tuple[Stmt, ...]

    @property
    def output(self) -> Buffer:
        return self.params[-1]


def as_expr(value: ExprLike) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        raise TypeError("booleans are not expressions")
    if isinstance(value, int):
        return Const(value)
    if isinstance(value, float):
        return Const(value, "float32")
    raise TypeError(f"cannot make an expression of {value!r}")


def _binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    ea, eb = _literal(a, b), _literal(b, a)
    if isinstance(ea, Const) and isinstance(eb, Const) and op in _FOLD and ea.dtype == "int64":
        return Const(_FOLD[op](ea.value, eb.value))
    # x + 0, x * 1, x * 0 simplifications keep printed IR and generated code small
    if op in ("+", "-") and isinstance(eb, Const) and eb.value == 0:
        return ea
    if op == "+" and isinstance(ea, Const) and ea.value == 0:
        return eb
    if op in ("//", "%") and isinstance(eb, Const) and eb.value == 1 and ea.dtype == "int64":
        return ea if op == "//" else Const(0)
    if op == "*" and ea.dtype == "int64":
        if isinstance(eb, Const) and eb.value == 1:
            return ea
        if isinstance(ea, Const) and ea.value == 1:
            return eb
        if (isinstance(ea, Const) and ea.value == 0) or (isinstance(eb, Const) and eb.value == 0):
            return Const(0)
    return BinOp(op, ea, eb)


def _literal(value: ExprLike, other: ExprLike) -> Expr:
    """A Python int next to an int32 value is an int32 constant (``acc + 1``), not an index."""
    if isinstance(value, int) and not isinstance(value, bool) and isinstance(other, Expr) \
            and other.dtype == "int32":
        return Const(value, "int32")
    return as_expr(value)


def binop(op: str, a: ExprLike, b: ExprLike) -> Expr:
    return _binop(op, a, b)


def call(fn: str, arg: ExprLike) -> Expr:
    """``call("exp", x)``: a float math function of one float expression."""
    return Call(fn, as_expr(arg))


def cast(to: str, arg: ExprLike) -> Expr:
    """``arg`` as element type ``to`` (no node when it already is)."""
    e = as_expr(arg)
    return e if e.dtype == to else Cast(to, e)


def intrinsic(fn: str, *args: ExprLike) -> Expr:
    return Intrinsic(fn, tuple(as_expr(a) for a in args))


def fmax(a: ExprLike, b: ExprLike) -> Expr:
    return BinOp("max", as_expr(a), as_expr(b))


def fmin(a: ExprLike, b: ExprLike) -> Expr:
    return BinOp("min", as_expr(a), as_expr(b))


def loop(name: str, extent: int, kind: LoopKind = LoopKind.SERIAL) -> tuple[Var, LoopFactory]:
    """``v, mk = loop("k", 64)`` then ``mk(body...)`` builds the Loop once the body exists."""
    var = Var(name)
    return var, LoopFactory(var, extent, kind)


@dataclasses.dataclass(frozen=True)
class LoopFactory:
    var: Var
    extent: int
    kind: LoopKind

    def __call__(self, *body: Stmt | Sequence[Stmt]) -> Stmt:
        flat = _flatten(body)
        if self.extent == 1 and self.kind in (LoopKind.SERIAL, LoopKind.UNROLL):
            # a loop of one iteration is its body with the index fixed at zero
            return Loop(self.var, 1, LoopKind.UNROLL, flat)
        return Loop(self.var, self.extent, self.kind, flat)


def prefetch(target: Load, locality: int = 2) -> Prefetch:
    if not 0 <= locality <= 3:
        raise ValueError(f"prefetch locality is 0..3, got {locality}")
    return Prefetch(target, locality)


def store(target: Load, value: ExprLike) -> Store:
    """``store(buf[i, j], expr)``: the indexing syntax of loads doubles as the store target."""
    return Store(target.buffer, target.indices, as_expr(value))


def _flatten(body: Sequence[Stmt | Sequence[Stmt]]) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for item in body:
        if isinstance(item, Stmt):
            out.append(item)
        else:
            out.extend(_flatten(item))
    return tuple(out)
