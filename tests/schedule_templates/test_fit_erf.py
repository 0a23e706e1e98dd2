"""The generated erf's coefficients are what ``scripts/fit_erf.py`` fits, and accurate."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import fit_erf

from schedule_templates.codegen import llvm_math


def test_the_script_reproduces_the_coefficients_in_use() -> None:
    rel, p, q = fit_erf.fit(len(llvm_math._ERF_P) - 1, len(llvm_math._ERF_Q) - 1)
    assert rel < 5e-8
    np.testing.assert_allclose(p[::-1], llvm_math._ERF_P, rtol=1e-4)
    np.testing.assert_allclose(q[::-1], llvm_math._ERF_Q, rtol=1e-4)
    assert fit_erf.SATURATES == llvm_math._ERF_SATURATES


def test_the_coefficients_in_use_are_accurate_in_float32() -> None:
    p = np.array(llvm_math._ERF_P[::-1], np.float32)
    q = np.array(llvm_math._ERF_Q[::-1], np.float32)
    assert fit_erf.float32_error(p, q) < 5e-7


@pytest.mark.parametrize("degrees", [(3, 3), (4, 4)])
def test_lower_degrees_fit_worse(degrees: tuple[int, int]) -> None:
    rel, _, _ = fit_erf.fit(*degrees, rounds=50)
    assert 5e-8 < rel < 1e-3
