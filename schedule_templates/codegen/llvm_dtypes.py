"""Element types, conversions and target intrinsics in LLVM IR, for the IR's ``Cast`` and
``Intrinsic`` nodes and typed loads and stores.

Every IR element type has one LLVM type (bfloat16 travels as its raw 16 bits: arithmetic on it
happens in fp32, after a ``Cast``). Conversions work on scalars and vectors alike. Intrinsics
map to LLVM's target intrinsics (``vpdpbusd`` to ``llvm.x86.avx512.vpdpbusd.512``); each names
the CPU feature it needs, so a caller can refuse a host without it before LLVM's instruction
selection would abort the whole process.
"""

from __future__ import annotations

import dataclasses

from llvmlite import ir

from schedule_templates.codegen.llvm_portable_int import emit_bytes4, emit_dp4a
from schedule_templates.codegen.llvm_x86_int import emit_pmaddubsw, emit_pmaddwd
from schedule_templates.errors import CodegenError
from schedule_templates.ir.nodes import INTRINSICS

F32 = ir.FloatType()
I64 = ir.IntType(64)
I32 = ir.IntType(32)
I16 = ir.IntType(16)
I8 = ir.IntType(8)
I1 = ir.IntType(1)


class _BFloat(ir.Type):
    """LLVM's ``bfloat`` (llvmlite's IR builder has no such type); only bitcast to and from."""

    def _to_string(self) -> str:
        return "bfloat"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _BFloat)

    def __hash__(self) -> int:
        return hash("bfloat")


#: the LLVM type each element type is held in (bfloat16 as its raw 16 bits)
_ELEMENT: dict[str, ir.Type] = {
    "float32": F32, "int32": I32, "int8": I8, "uint8": I8, "bfloat16": I16, "int64": I64,
    "bool": I1,
}
_SIGNED = ("int32", "int8", "int64")


@dataclasses.dataclass(frozen=True)
class _LLVMIntrinsic:
    """How an IR intrinsic is called: the LLVM name (``{v}`` becomes the type suffix), the CPU
    feature it needs, and whether its two vector operands are really bf16 pairs."""

    name: str
    feature: str = ""
    bf16_pairs: bool = False


_INTRINSICS = {
    "vpdpbusd": _LLVMIntrinsic("llvm.x86.avx512.vpdpbusd.512", "avx512vnni"),
    "dpbf16ps": _LLVMIntrinsic("llvm.x86.avx512bf16.dpbf16ps.512", "avx512bf16", True),
    "roundeven": _LLVMIntrinsic("llvm.roundeven.{v}"),
    "pmaddwd": _LLVMIntrinsic("llvm.x86.avx2.pmadd.wd", "avx2"),  # llvm_x86_int.py emits it
    "pmaddubsw": _LLVMIntrinsic("llvm.x86.avx2.pmadd.ub.sw", "avx2"),  # and this one
    # plain integer arithmetic (llvm_portable_int.py): the host form of GPU kernels
    "dp4a": _LLVMIntrinsic(""),
    "bytes4": _LLVMIntrinsic(""),
}


def element(dtype: str) -> ir.Type:
    try:
        return _ELEMENT[dtype]
    except KeyError:
        raise CodegenError(f"no LLVM type for {dtype}") from None


def align_of(dtype: str) -> int:
    """Bytes of one element: the alignment every access to it can promise."""
    return {"float32": 4, "int32": 4, "int64": 8, "bfloat16": 2}.get(dtype, 1)


def emit_cast(b: ir.IRBuilder, value: ir.Value, src: str, dst: str) -> ir.Value:
    """``value`` (scalar or vector) of element type ``src`` converted to ``dst``."""
    if src == dst:
        return value
    ty = value.type
    lanes = ty.count if isinstance(ty, ir.VectorType) else 0

    def of(elem: ir.Type) -> ir.Type:
        return ir.VectorType(elem, lanes) if lanes else elem

    if src == "bfloat16" and dst != "float32":  # to an integer: the 16 raw bits (packing)
        return emit_cast(b, b.zext(value, of(I32)), "int32", dst)
    if src == "bfloat16":  # the bits are the top half of an fp32
        wide = b.shl(b.zext(value, of(I32)), _splat_const(I32, 16, lanes))
        return emit_cast(b, b.bitcast(wide, of(F32)), "float32", dst)
    if dst == "bfloat16":  # round to nearest even on the bits, then keep the top half
        bits = b.bitcast(emit_cast(b, value, src, "float32"), of(I32))
        odd = b.and_(b.lshr(bits, _splat_const(I32, 16, lanes)), _splat_const(I32, 1, lanes))
        rounded = b.add(bits, b.add(odd, _splat_const(I32, 0x7FFF, lanes)))
        return b.trunc(b.lshr(rounded, _splat_const(I32, 16, lanes)), of(I16))
    target = of(element(dst))
    if src == "float32":
        if dst in ("int8", "uint8"):  # via i32: fptosi straight to i8 is poison past 127
            return b.trunc(b.fptosi(value, of(I32)), target)
        return b.fptosi(value, target)
    if dst == "float32":
        return b.sitofp(value, target) if src in _SIGNED else b.uitofp(value, target)
    src_bits, dst_bits = element(src).width, element(dst).width
    if dst_bits < src_bits:
        return b.trunc(value, target)
    if dst_bits == src_bits:
        return value
    return b.sext(value, target) if src in _SIGNED else b.zext(value, target)


def _splat_const(elem: ir.Type, value: int, lanes: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(elem, lanes), [value] * lanes) if lanes else ir.Constant(
        elem, value)


def intrinsic_feature(fn: str) -> str:
    """The CPU feature (LLVM's name, no sign) intrinsic ``fn`` needs; empty for none."""
    return _INTRINSICS[fn].feature


def emit_lrint(b: ir.IRBuilder, module: ir.Module, value: ir.Value) -> ir.Value:
    """fp32 (scalar or vector) to int32, rounded in the current rounding mode (to nearest
    even: nothing here changes it)."""
    ty = value.type
    lanes = ty.count if isinstance(ty, ir.VectorType) else 0
    ret: ir.Type = ir.VectorType(I32, lanes) if lanes else I32
    name = f"llvm.lrint.v{lanes}i32.v{lanes}f32" if lanes else "llvm.lrint.i32.f32"
    existing = module.globals.get(name)
    callee = existing if isinstance(existing, ir.Function) else ir.Function(
        module, ir.FunctionType(ret, [ty]), name=name)
    return b.call(callee, [value])


def emit_intrinsic(b: ir.IRBuilder, module: ir.Module, fn: str, args: list[ir.Value]
                   ) -> ir.Value:
    if fn == "pmaddwd":
        return emit_pmaddwd(b, module, *args)
    if fn == "pmaddubsw":
        return emit_pmaddubsw(b, module, *args)
    if fn == "dp4a":
        return emit_dp4a(b, *args)
    if fn == "bytes4":
        return emit_bytes4(b, *args)
    sig, how = INTRINSICS[fn], _INTRINSICS[fn]
    ty = args[0].type
    lanes = ty.count if isinstance(ty, ir.VectorType) else 0
    if sig.lanes and lanes != sig.lanes:
        raise CodegenError(f"{fn} works on {sig.lanes} lanes at once, here {lanes or 1}: "
                           f"put it under a vectorized loop of a multiple of {sig.lanes}")
    result = element(sig.result)
    ret = ir.VectorType(result, lanes) if lanes else result
    if how.bf16_pairs:  # <16 x i32> holding bf16 pairs is <32 x bfloat> to LLVM
        pairs = ir.VectorType(_BFloat(), 2 * lanes)
        args = [args[0], *(b.bitcast(a, pairs) for a in args[1:])]
    name = how.name.format(v=f"v{lanes}f32" if lanes else "f32")
    existing = module.globals.get(name)
    callee = existing if isinstance(existing, ir.Function) else ir.Function(
        module, ir.FunctionType(ret, [a.type for a in args]), name=name)
    return b.call(callee, args)
