"""The backend registry, the fake backend's knobs, and the correctness comparison."""

from __future__ import annotations

import numpy as np
import pytest

from schedule_templates.protocol import Candidate, ClaimItem, Target
from schedule_templates.records import ErrorKind, MeasureOptions
from workers.backends import BACKENDS, BackendSpec, backend_class, create_backend
from workers.backends.fake import FAULT_MODES, FakeBackend, parse_rates
from workers.errors import BackendError
from workers.measure import compare_output, measure_task

OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=0.0)


def task(index: int) -> ClaimItem:
    return ClaimItem(index, Candidate("dense.x86", "dense:M=64,N=64,K=64", {"index": index}),
                     Target("llvm"), OPTIONS)


def test_the_registry_names_llvm_fake_and_cuda() -> None:
    assert set(BACKENDS) == {"llvm", "fake", "cuda"}
    assert backend_class("fake") is FakeBackend
    with pytest.raises(BackendError, match="unknown backend"):
        backend_class("opencl")


def test_fake_costs_are_deterministic_and_seeded() -> None:
    backend = FakeBackend(validate=False)
    first = [measure_task(backend, task(i)).costs for i in range(5)]
    again = [measure_task(backend, task(i)).costs for i in range(5)]
    assert first == again and len(set(first)) == 5
    other = FakeBackend(seed=1, validate=False)
    assert measure_task(other, task(0)).costs != first[0]


def test_fake_failure_rates_are_roughly_honoured() -> None:
    backend = FakeBackend(validate=False, rates={"compile_error": 0.2, "wrong": 0.1})
    kinds = [measure_task(backend, task(i)).error for i in range(400)]
    assert 40 <= kinds.count(ErrorKind.COMPILE_HOST) <= 120
    assert 15 <= kinds.count(ErrorKind.WRONG_ANSWER) <= 70


def test_parse_rates() -> None:
    assert parse_rates("wrong=0.05, segfault=0.01") == {"wrong": 0.05, "segfault": 0.01}
    for bad in ("wrong", "typo=0.1", "wrong=2"):
        with pytest.raises(ValueError):
            parse_rates(bad)
    with pytest.raises(BackendError):
        create_backend(BackendSpec("fake", {"faults": {1: "explode"}}))
    assert "segfault" in FAULT_MODES


class Kernel:
    def __init__(self, out: np.ndarray, ref: np.ndarray, reduction: int = 1) -> None:
        self._out, self._ref, self.reduction_length = out, ref, reduction

    def run(self) -> None:
        """Nothing to run."""

    @property
    def output(self) -> np.ndarray:
        return self._out

    def expected(self) -> np.ndarray:
        return self._ref

    def close(self) -> None:
        """Nothing to free."""


def test_compare_output_scales_the_tolerance_with_the_reduction() -> None:
    ref = np.ones((4, 4), dtype=np.float32)
    assert compare_output(Kernel(ref.copy(), ref)) is None
    off = ref + 5e-3
    assert "max abs error" in (compare_output(Kernel(off, ref, reduction=1)) or "")
    assert compare_output(Kernel(off, ref, reduction=10**4)) is None
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert "not finite" in (compare_output(Kernel(nan, ref)) or "")
    assert "shape" in (compare_output(Kernel(ref.reshape(16), ref)) or "")


def test_compare_output_of_int8_saturated_values() -> None:
    """np.abs(int8 -128) is -128: taken in int8, the tolerance went negative and a correct
    saturated output was called wrong (found by the CUDA int8 templates)."""
    ref = np.array([-128, 127, 0, -5], dtype=np.int8)
    assert compare_output(Kernel(ref.copy(), ref)) is None
    wrong = ref.copy()
    wrong[1] = 126
    assert "1 of 4" in (compare_output(Kernel(wrong, ref)) or "")
