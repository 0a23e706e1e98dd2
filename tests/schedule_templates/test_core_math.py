"""Math functions (``Call``) and float division in generated code, against numpy in float64.

Each function runs as a scalar loop, as a 16-lane vectorized loop and as an odd-width (13 =
8 + 4 + 1 lanes) vectorized loop, over wide ranges plus the edge cases (infinities, NaN, zero,
denormals). The vector kernels must not call libm. exp flushes results below the smallest normal
float to zero.
"""

import ctypes
import math
import re

import numpy as np
import pytest

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import CompiledKernel
from schedule_templates.features import kernel_features
from schedule_templates.ir.nodes import MATH_FUNCS, Buffer, Kernel, LoopKind, call, loop, store
from schedule_templates.ir.printer import format_kernel

_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _reference(fn: str, x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        table = {
            "exp": np.exp,
            "log": np.log,
            "sqrt": np.sqrt,
            "abs": np.abs,
            "floor": np.floor,
            "tanh": np.tanh,
            "erf": lambda v: np.where(np.isnan(v), np.nan, _ERF(np.nan_to_num(v))),
            "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
        }
        return table[fn](x)


def _points(fn: str) -> np.ndarray:
    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 0.625, -0.625, 1e-30,
             -1e-30, 1e-8, 1.4e-45, 1e-40, 3.4e38, -3.4e38, 88.0, 88.7, 88.73, 89.5, -87.0,
             -88.0, -100.0, -103.0, -104.5, 0.34657, -0.34657, 2.0, 6.0, 10.0, 20.0]
    spread = np.concatenate([
        rng.uniform(-10, 10, 2000),
        rng.uniform(-100, 100, 1000),
        np.linspace(-87.5, -87.2, 2000),  # around ln(FLT_MIN), where exp's results turn denormal
        np.exp(rng.uniform(-90, 88, 1000)) * rng.choice([-1, 1], 1000),
        np.linspace(-1, 1, 1001),
    ])
    x = np.concatenate([np.asarray(edges), spread]).astype(np.float32)
    return np.concatenate([x, np.zeros(-len(x) % 208, np.float32)])  # whole 13- and 16-blocks


def _run(fn: str, x: np.ndarray, width: int) -> tuple[np.ndarray, str]:
    n = x.size
    src, dst = Buffer("src", (n,)), Buffer("dst", (n,))
    if width == 1:
        i, mk = loop("i", n)
        body = mk(store(dst[i], call(fn, src[i])))
    else:
        o, outer = loop("o", n // width)
        v, vec = loop("v", width, LoopKind.VECTORIZE)
        body = outer(vec(store(dst[o * width + v], call(fn, src[o * width + v]))))
    kernel = Kernel(f"math_{fn}_{width}", (src, dst), (), (body,))
    module = generate_llvm_ir(kernel)
    out = np.zeros(n, np.float32)
    compiled = CompiledKernel(module, kernel.name, 2)
    try:
        compiled.function(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data), 1)
    finally:
        compiled.close()
    return out, str(module)


def _check(fn: str, x: np.ndarray, got: np.ndarray) -> None:
    want = _reference(fn, x)
    with np.errstate(all="ignore"):
        want32 = want.astype(np.float32)
    special = ~np.isfinite(want32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want32), err_msg=f"{fn}: NaN pattern")
    np.testing.assert_array_equal(got[special & ~np.isnan(want32)],
                                  want32[special & ~np.isnan(want32)], err_msg=f"{fn}: inf")
    ok = ~special
    g, w = got[ok].astype(np.float64), want[ok]
    if fn == "exp":  # denormal results are flushed to zero (no microcode assists on Intel)
        tiny = w < np.finfo(np.float32).tiny * 1.0001
        assert not np.any((g > 0) & (g < np.finfo(np.float32).tiny)), "exp: a denormal result"
        np.testing.assert_array_equal(g[tiny], 0.0, err_msg="exp: denormal results not flushed")
        g, w = g[~tiny], w[~tiny]
    if fn in ("exp", "log"):
        # relative error in float32 ulps (denormal results are judged on an absolute scale)
        ulp = np.spacing(np.maximum(np.abs(w), np.finfo(np.float32).tiny).astype(np.float32))
        err = np.abs(g - w) / ulp.astype(np.float64)
        assert err.max() <= 4.0, f"{fn}: {err.max():.1f} ulp at x={x[ok][err.argmax()]!r}"
    elif fn in ("sqrt", "abs", "floor"):
        np.testing.assert_array_equal(got[ok], want32[ok])
    else:
        err = np.abs(g - w)
        assert err.max() <= 1e-6, f"{fn}: abs error {err.max():.2e} at x={x[ok][err.argmax()]!r}"
        if fn in ("tanh", "erf"):  # odd functions keep their relative accuracy near zero
            small = (np.abs(w) < 1e-3) & (np.abs(w) > np.finfo(np.float32).tiny)
            rel = np.abs(g[small] - w[small]) / np.abs(w[small])
            assert rel.size == 0 or rel.max() < 1e-5, f"{fn}: relative error near 0"


@pytest.mark.parametrize("width", [1, 16, 13])
@pytest.mark.parametrize("fn", MATH_FUNCS)
def test_math_functions_match_numpy(fn, width):
    x = _points(fn)
    got, text = _run(fn, x, width)
    _check(fn, x, got)
    calls = set(re.findall(r"call \S+ @\"?([\w.]+)", text))
    assert all(c.startswith("llvm.") for c in calls), f"library calls in {fn}: {calls}"
    if width > 1:
        assert "x float>" in text


def test_saturation_and_exact_values():
    x = np.array([0.0, 200.0, -200.0, 1e4, -1e4, np.inf, -np.inf] + [0.0] * 9, np.float32)
    for fn, want in (("tanh", [0, 1, -1, 1, -1, 1, -1]), ("sigmoid", [0.5, 1, 0, 1, 0, 1, 0]),
                     ("erf", [0, 1, -1, 1, -1, 1, -1]), ("exp", [1, np.inf, 0, np.inf, 0,
                                                                np.inf, 0])):
        for width in (1, 16):
            got, _ = _run(fn, x, width)
            np.testing.assert_allclose(got[:7], want, atol=1e-7, err_msg=f"{fn} width {width}")


@pytest.mark.parametrize("width", [1, 16])
def test_sigmoid_tail_is_relative_and_never_denormal(width):
    # sigmoid(x) for very negative x is e^x: the result keeps its relative accuracy down to
    # where it nears the smallest normal float, and no lane ever holds a denormal (a microcode
    # assist per operation on Intel cores)
    x = np.concatenate([np.linspace(-85.0, 0.0, 4096), np.linspace(-300.0, -85.0, 512)])
    x = x.astype(np.float32)
    got, _ = _run("sigmoid", x, width)
    tiny = np.finfo(np.float32).tiny
    assert np.all(got >= tiny), "a denormal or zero sigmoid"
    want = 1.0 / (1.0 + np.exp(-x[:4096].astype(np.float64)))
    rel = np.abs(got[:4096] - want) / want
    assert rel.max() < 2e-5, f"relative error {rel.max():.2e} at x={x[rel.argmax()]!r}"


@pytest.mark.parametrize("width", [1, 16])
def test_float_division(width):
    n = 64
    a, b, dst = Buffer("a", (n,)), Buffer("b", (n,)), Buffer("dst", (n,))
    v, vec = loop("v", n, LoopKind.VECTORIZE if width > 1 else LoopKind.SERIAL)
    kernel = Kernel("div", (a, b, dst), (), (vec(store(dst[v], a[v] / b[v] + 1.0 / b[v])),))
    rng = np.random.default_rng(3)
    xa, xb = rng.normal(size=n).astype(np.float32), rng.normal(size=n).astype(np.float32)
    xb[0] = 0.0
    out = np.zeros(n, np.float32)
    compiled = CompiledKernel(generate_llvm_ir(kernel), kernel.name, 3)
    try:
        compiled.function(*[ctypes.c_void_p(z.ctypes.data) for z in (xa, xb, out)], 1)
    finally:
        compiled.close()
    with np.errstate(all="ignore"):
        want = xa / xb + np.float32(1.0) / xb
    np.testing.assert_allclose(out, want, rtol=1e-6)


def test_printer_shows_calls_and_division():
    src, dst = Buffer("src", (4,)), Buffer("dst", (4,))
    i, mk = loop("i", 4)
    kernel = Kernel("p", (src, dst), (), (mk(store(dst[i], call("exp", src[i] / 2.0) * 3.0)),))
    assert "dst[i] = exp(src[i] / 2.0) * 3.0" in format_kernel(kernel)


def test_features_count_calls_as_float_work():
    src, dst = Buffer("src", (64,)), Buffer("dst", (64,))

    def features(value_of):
        v, vec = loop("v", 64, LoopKind.VECTORIZE)
        return kernel_features(Kernel("f", (src, dst), (), (vec(store(dst[v], value_of(v))),)))

    plain = features(lambda v: src[v] * 2.0)
    exp = features(lambda v: call("exp", src[v]) * 2.0)
    erf = features(lambda v: call("erf", src[v]) * 2.0)
    assert np.isfinite(exp).all() and np.isfinite(erf).all()
    assert not np.array_equal(plain, exp) and not np.array_equal(exp, erf)
    # the load inside the call is still an access: a copy without it differs
    const = features(lambda v: call("exp", v * 0 + 1.0) * 2.0)
    assert not np.array_equal(exp, const)
