"""Float math functions (the IR's ``Call``) as inline LLVM IR that vectorizes.

A call to libm inside a SIMD loop would scalarize it lane by lane (``expf`` has no vector
form the JIT can link), so every function here is straight-line arithmetic, integer tricks on
the float's bits and selects, written once for ``float`` and ``<N x float>`` alike: the same
instructions build either, with constants splatted to the value's type.

- exp: n = round(x * log2(e)), r = x - n * ln2 (ln2 in two parts so r stays exact), a
  degree-6 polynomial for e^r, then a scale by 2^n built in the exponent bits. 2^n is applied
  as two factors 2^(n//2) * 2^(n - n//2) so results that overflow come out as inf. Results
  below the smallest normal float (x < ln 2^-126, to within 5e-5) are flushed to zero, and
  the input is clamped where the arithmetic stays normal, so no step makes a denormal: on
  Intel cores a float operation with a denormal result takes a microcode assist, and a masked
  softmax's exponentials are mostly such results (BERT-base's attention softmax, 1536 rows of
  128 with half the scores masked: 0.98 ms against 0.33 unmasked, on Emerald Rapids).
  oneDNN's exp flushes the same way;
- log: the exponent and the mantissa split apart, the mantissa moved to [sqrt(1/2), sqrt(2))
  and a polynomial in (m - 1); denormal inputs are scaled by 2^23 first;
- sqrt, abs, floor: LLVM intrinsics (one instruction each on the host);
- sigmoid = 1 / (1 + 2^y), y = -x log2(e) limited to +-125 so that nothing in it turns
  denormal (sigmoid is 0 or 1 to float precision past that), 2^y as a degree-5 polynomial of
  y's fraction scaled by 2^n taken from the rounding sum's bits: half the instructions of
  exp's path (no flush or overflow handling), SiLU over 1.2M floats 0.46 -> 0.29 ms against a
  0.11 ms copy (Zen 4). tanh: an odd polynomial for |x| < 0.625 (where 1 - 2/(e^2x+1)
  would cancel) and that formula beyond, which saturates at +-1 by itself;
- erf: its Taylor series for |x| < 0.5 and Abramowitz & Stegun 7.1.26 (an e^-x^2 times a
  polynomial in 1 / (1 + p|x|), error below 1.5e-7) beyond.
The coefficients are the classic Cephes single-precision minimax ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from schedule_templates.errors import CodegenError

F32 = ir.FloatType()
I32 = ir.IntType(32)

_LOG2E = 1.44269504088896341
_LN2_HI = 0.693359375  # exactly representable: n * _LN2_HI has no rounding error
_LN2_LO = -2.12194440e-4
_ROUND_MAGIC = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds to an integer
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
             1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
             3.3333331174e-1)
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)
# erf(x) = x P(x^2) / Q(x^2) on [-4, 4] (beyond it erf rounds to +-1 in float32), highest power
# first. Our own fit (``scripts/fit_erf.py``: least squares on P - erf(x)/x Q, reweighted towards
# the largest errors): 2.5e-8 relative error in float64, 2.9e-7 absolute once evaluated in
# float32. No exp and one division: GELU over 1M floats ran 0.77 -> 0.35 ms (Zen 4) against the
# Abramowitz-Stegun form it replaces (a Taylor branch beside exp, a division and a polynomial).
_ERF_SATURATES = 4.0
_ERF_P = (1.9867275113938376e-06, 0.000284561887383461, 0.00388334016315639,
          0.053101714700460434, 0.19354553520679474, 1.1283791065216064)
_ERF_Q = (3.7419391446746886e-05, 0.001185562927275896, 0.015207244083285332,
          0.11535011231899261, 0.5048578381538391, 1.0)
# 2^f on [-0.5, 0.5], highest power first: our own fit (weighted least squares on the relative
# error, the constant fixed at 1): 9.1e-8 relative error in float64, 1.9e-7 evaluated in float32
_EXP2_POLY = (0.001326472614891827, 0.009671512991189957, 0.05550733581185341,
              0.24022242426872253, 0.6931470036506653, 1.0)
_ROUND_MAGIC_BITS = 0x4B400000  # the bits of _ROUND_MAGIC
_SIGMOID_EXP2_LIMIT = 125.0
_FLT_MIN = 1.17549435e-38
#: just above ln(_FLT_MIN) (-87.336545) as a float32: e^x is normal from here up; below it
#: e^x is flushed to zero
_EXP_FLUSH_BELOW = -87.3365


class _Math:
    """Builds one function of ``x`` (a float or a float vector) at the builder's position."""

    def __init__(self, b: ir.IRBuilder, module: ir.Module, x: ir.Value) -> None:
        self.b = b
        self.module = module
        self.ty = x.type
        vector = isinstance(x.type, ir.VectorType)
        self.ity: ir.Type = ir.VectorType(I32, x.type.count) if vector else I32

    # -- constants and small helpers ---------------------------------------------------------
    def f(self, value: float) -> ir.Constant:
        if isinstance(self.ty, ir.VectorType):
            return ir.Constant(self.ty, [value] * self.ty.count)
        return ir.Constant(F32, value)

    def i(self, value: int) -> ir.Constant:
        if isinstance(self.ity, ir.VectorType):
            return ir.Constant(self.ity, [value] * self.ity.count)
        return ir.Constant(I32, value)

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        suffix = f"v{self.ty.count}f32" if isinstance(self.ty, ir.VectorType) else "f32"
        full = f"llvm.{name}.{suffix}"
        fn = self.module.globals.get(full)
        if not isinstance(fn, ir.Function):
            fn = ir.Function(self.module, ir.FunctionType(self.ty, [self.ty] * len(args)),
                             name=full)
        return self.b.call(fn, list(args))

    def fma(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        return self.intrinsic("fmuladd", x, y, z)

    def horner(self, coeffs: Sequence[float], t: ir.Value) -> ir.Value:
        acc: ir.Value = self.f(coeffs[0])
        for c in coeffs[1:]:
            acc = self.fma(acc, t, self.f(c))
        return acc

    def lt(self, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.b.fcmp_ordered("<", x, y)

    def is_nan(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """``x`` limited to [lo, hi]; NaN becomes ``lo`` (callers put NaN back at the end)."""
        b = self.b
        x = b.select(b.fcmp_ordered(">", x, self.f(lo)), x, self.f(lo))
        return b.select(self.lt(x, self.f(hi)), x, self.f(hi))

    def neg(self, x: ir.Value) -> ir.Value:
        return self.b.fneg(x)

    def pow2(self, n: ir.Value) -> ir.Value:
        """2^n for an integer n in the normal exponent range [-126, 127]."""
        bits = self.b.shl(self.b.add(n, self.i(127)), self.i(23))
        return self.b.bitcast(bits, self.ty)

    # -- the functions -----------------------------------------------------------------------
    def exp(self, x: ir.Value) -> ir.Value:
        b = self.b
        # past 89 e^x is inf in float32; below ln(FLT_MIN) it is denormal, flushed to 0 below
        xc = self.clamp(x, _EXP_FLUSH_BELOW, 89.0)
        t = b.fadd(b.fmul(xc, self.f(_LOG2E)), self.f(_ROUND_MAGIC))
        nf = b.fsub(t, self.f(_ROUND_MAGIC))
        r = self.fma(nf, self.f(-_LN2_HI), xc)
        r = self.fma(nf, self.f(-_LN2_LO), r)
        p = self.horner(_EXP_POLY, r)
        p = self.fma(p, b.fmul(r, r), b.fadd(r, self.f(1.0)))
        n = b.fptosi(nf, self.ity)
        half = b.ashr(n, self.i(1))
        y = b.fmul(b.fmul(p, self.pow2(half)), self.pow2(b.sub(n, half)))
        y = b.select(self.lt(x, self.f(_EXP_FLUSH_BELOW)), self.f(0.0), y)
        return b.select(self.is_nan(x), x, y)

    def log(self, x: ir.Value) -> ir.Value:
        b = self.b
        tiny = self.lt(x, self.f(_FLT_MIN))  # denormals (and <= 0, handled at the end)
        xs = b.select(tiny, b.fmul(x, self.f(8388608.0)), x)
        bits = b.bitcast(xs, self.ity)
        e = b.sub(b.ashr(bits, self.i(23)), self.i(126))
        e = b.sub(e, b.select(tiny, self.i(23), self.i(0)))
        m = b.bitcast(b.or_(b.and_(bits, self.i(0x007FFFFF)), self.i(0x3F000000)), self.ty)
        low = self.lt(m, self.f(0.707106781186547524))  # m in [0.5, 1): fold to [0.707, 1.414)
        e = b.sub(e, b.select(low, self.i(1), self.i(0)))
        m = b.fsub(b.select(low, b.fadd(m, m), m), self.f(1.0))
        ef = b.sitofp(e, self.ty)
        z = b.fmul(m, m)
        y = b.fmul(b.fmul(self.horner(_LOG_POLY, m), m), z)
        y = self.fma(ef, self.f(_LN2_LO), y)
        y = self.fma(z, self.f(-0.5), y)
        y = self.fma(ef, self.f(_LN2_HI), b.fadd(m, y))
        y = b.select(b.fcmp_ordered("==", x, self.f(float("inf"))), x, y)
        y = b.select(b.fcmp_ordered("==", x, self.f(0.0)), self.f(float("-inf")), y)
        y = b.select(self.lt(x, self.f(0.0)), self.f(float("nan")), y)
        return b.select(self.is_nan(x), x, y)

    def sigmoid(self, x: ir.Value) -> ir.Value:
        b = self.b
        # e^-x = 2^y, y = -x log2(e) kept within +-125 so that 2^y, 1 + 2^y and its reciprocal
        # all stay normal floats: past that range sigmoid is 0 or 1 to float precision anyway
        y = self.clamp(b.fmul(x, self.f(-_LOG2E)), -_SIGMOID_EXP2_LIMIT, _SIGMOID_EXP2_LIMIT)
        t = b.fadd(y, self.f(_ROUND_MAGIC))
        frac = b.fsub(y, b.fsub(t, self.f(_ROUND_MAGIC)))  # exact, in [-0.5, 0.5]
        # 2^n from t's bits: its low mantissa bits hold n + the magic number's own bits
        bits = b.add(b.bitcast(t, self.ity), self.i(127 - _ROUND_MAGIC_BITS))
        e = b.fmul(self.horner(_EXP2_POLY, frac), b.bitcast(b.shl(bits, self.i(23)), self.ty))
        s = b.fdiv(self.f(1.0), b.fadd(self.f(1.0), e))
        return b.select(self.is_nan(x), x, s)

    def tanh(self, x: ir.Value) -> ir.Value:
        b = self.b
        ax = self.intrinsic("fabs", x)
        z = b.fmul(x, x)
        small = self.fma(b.fmul(self.horner(_TANH_POLY, z), z), x, x)
        e = self.exp(b.fadd(ax, ax))
        big = b.fsub(self.f(1.0), b.fdiv(self.f(2.0), b.fadd(e, self.f(1.0))))
        big = b.select(self.lt(x, self.f(0.0)), self.neg(big), big)
        return b.select(self.lt(ax, self.f(0.625)), small, big)

    def erf(self, x: ir.Value) -> ir.Value:
        b = self.b
        xc = self.clamp(x, -_ERF_SATURATES, _ERF_SATURATES)  # NaN put back below
        z = b.fmul(xc, xc)
        y = b.fdiv(b.fmul(self.horner(_ERF_P, z), xc), self.horner(_ERF_Q, z))
        y = self.clamp(y, -1.0, 1.0)  # the fit overshoots 1 by an ulp or two near 4
        return b.select(self.is_nan(x), x, y)


_INTRINSICS = {"sqrt": "sqrt", "abs": "fabs", "floor": "floor"}
_BUILT: dict[str, Callable[[_Math, ir.Value], ir.Value]] = {
    "exp": _Math.exp,
    "log": _Math.log,
    "sigmoid": _Math.sigmoid,
    "tanh": _Math.tanh,
    "erf": _Math.erf,
}


def emit_math(b: ir.IRBuilder, module: ir.Module, fn: str, x: ir.Value) -> ir.Value:
    """``fn(x)`` for a ``float`` or ``<N x float>`` value, as inline code (no libm calls)."""
    math = _Math(b, module, x)
    if fn in _INTRINSICS:
        return math.intrinsic(_INTRINSICS[fn], x)
    if fn in _BUILT:
        return _BUILT[fn](math, x)
    raise CodegenError(f"no code generator for math function {fn!r}")
