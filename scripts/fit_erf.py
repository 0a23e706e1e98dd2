"""Fit the coefficients of the generated erf (``schedule_templates/codegen/llvm_math.py``).

erf(x) ~ x P(x^2) / Q(x^2) on [0, 4] with Q(0) = 1: the linear least-squares problem
P(z) - (erf(x)/x) Q(z) = 0 is solved repeatedly, each time divided by the previous Q (so that
it approaches the true relative error) and with the weights of the worst-fitting points raised
(towards the minimax fit). Prints the best fit's float64 relative error, its error once the
float32 coefficients are evaluated in float32, and the coefficients, highest power first.

    python scripts/fit_erf.py --p 5 --q 5
"""

from __future__ import annotations

import argparse
import math

import numpy as np

SATURATES = 4.0  # erf(4) = 1 - 1.5e-8 is 1.0 in float32
_erf = np.vectorize(math.erf, otypes=[np.float64])


def fit(p_degree: int, q_degree: int, rounds: int = 200) -> tuple[float, np.ndarray, np.ndarray]:
    """(max relative error, P, Q), coefficients lowest power first, Q[0] = 1."""
    x = np.concatenate([np.linspace(1e-4, SATURATES, 20000),
                        SATURATES * np.sin(np.linspace(0.0, np.pi / 2, 4000))[1:]])
    z, want = x * x, _erf(x)
    g = want / x
    powers_p = np.vander(z, p_degree + 1, increasing=True)
    powers_q = np.vander(z, q_degree + 1, increasing=True)[:, 1:]
    a = np.concatenate([powers_p, -g[:, None] * powers_q], axis=1)
    weights, previous_q = np.ones_like(x), np.ones_like(x)
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for _ in range(rounds):
        scale = weights / previous_q
        solution = np.linalg.lstsq(a * scale[:, None], g * scale, rcond=None)[0]
        p = solution[:p_degree + 1]
        q = np.concatenate([[1.0], solution[p_degree + 1:]])
        previous_q = powers_q @ q[1:] + 1.0
        err = np.abs(x * (powers_p @ p) / previous_q - want) / want
        if best is None or err.max() < best[0]:
            best = (float(err.max()), p.copy(), q.copy())
        weights = weights * np.sqrt(err / err.max() + 1e-3)
        weights /= weights.mean()
    assert best is not None
    return best


def float32_error(p: np.ndarray, q: np.ndarray) -> float:
    """Max absolute error of the float32 evaluation (fused multiply-adds, clamped result)."""
    x = np.concatenate([np.linspace(0.0, 4.5, 200001),
                        np.exp(np.linspace(-30.0, 0.0, 10000))]).astype(np.float32)
    xc = np.minimum(x, np.float32(SATURATES))
    z = xc * xc

    def horner(coeffs: np.ndarray) -> np.ndarray:
        acc = np.full_like(z, np.float32(coeffs[-1]))
        for c in coeffs[-2::-1]:
            acc = (acc.astype(np.float64) * z + np.float32(c)).astype(np.float32)
        return acc

    y = np.minimum(xc * horner(p) / horner(q), np.float32(1.0))
    return float(np.abs(y.astype(np.float64) - _erf(x.astype(np.float64))).max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", type=int, default=5, help="degree of P in x^2")
    parser.add_argument("--q", type=int, default=5, help="degree of Q in x^2")
    args = parser.parse_args(argv)
    rel, p, q = fit(args.p, args.q)
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    print(f"relative error (float64): {rel:.3g}; absolute error (float32): "
          f"{float32_error(p32, q32):.3g}")
    print("_ERF_P =", tuple(float(c) for c in p32[::-1]))
    print("_ERF_Q =", tuple(float(c) for c in q32[::-1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
