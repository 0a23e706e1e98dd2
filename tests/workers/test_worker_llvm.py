"""The llvm backend on real templates: measure, verify, classify (skips without the runtime)."""

from __future__ import annotations

import pytest

pytest.importorskip("llvmlite")
pytest.importorskip("schedule_templates.runtime", reason="the LLVM runtime is not built yet")

from schedule_templates.protocol import ClaimItem
from schedule_templates.records import ErrorKind, MeasureOptions
from schedule_templates.templates.base import template_by_name
from schedule_templates.workloads import parse_workload
from workers.backends import BackendSpec, BoundKernel, Decoded
from workers.backends.llvm import LlvmBackend
from workers.measure import measure_candidate, measure_task
from workers.measure.pool import IsolatedMeasurer

pytestmark = pytest.mark.timeout(180)

DENSE = "dense:M=64,N=64,K=64"
OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=5.0)


def default_index(key: str = DENSE, template: str = "dense.x86") -> int:
    return template_by_name(template).default_config(parse_workload(key)).index


def task(index: int, **extra: object) -> ClaimItem:
    return ClaimItem.from_json({"measure_id": index, "template": "dense.x86", "workload": DENSE,
                                "target": "llvm", "config": {"index": index},
                                "options": OPTIONS.to_json(), **extra})


def test_measure_candidate_times_a_correct_kernel() -> None:
    result = measure_candidate(DENSE, "dense.x86", {"index": default_index()}, "llvm",
                               OPTIONS, 1)
    assert result.ok, result.error_message
    assert len(result.costs) == 3 and all(c > 0 for c in result.costs)
    assert 0 < result.compile_time_s <= result.wall_time_s
    assert result.gflops(parse_workload(DENSE).flops()) > 0.1


@pytest.mark.parametrize(("extra", "words"), [
    ({"config": {"index": 10**12}}, "outside"),
    ({"template_version": 99}, "version"),
    ({"template": "no.such"}, "unknown template"),
    ({"template": "conv2d.x86"}, "handles conv2d, not dense"),
    ({"target": "cuda"}, "generates llvm code"),
])
def test_invalid_configs_are_instantiation_errors(extra: dict[str, object], words: str) -> None:
    result = measure_task(LlvmBackend(), task(default_index(), **extra))
    assert result.error is ErrorKind.INSTANTIATION, result
    assert words in result.error_message


class CorruptingBackend(LlvmBackend):
    """A test-only fault: the kernel's output is damaged after every run."""

    def compile_cached(self, task: ClaimItem, resolved: Decoded | None, code: bytes | None
                       ) -> tuple[BoundKernel, bytes | None]:
        kernel, fresh = super().compile_cached(task, resolved, code)
        run = kernel.run

        def corrupt() -> None:
            run()
            kernel.output.flat[0] += 1.0

        kernel.run = corrupt  # type: ignore[method-assign]
        return kernel, fresh


def test_a_wrong_answer_is_caught_before_timing() -> None:
    result = measure_task(CorruptingBackend(), task(default_index()))
    assert result.error is ErrorKind.WRONG_ANSWER
    assert "max abs error" in result.error_message and result.costs == ()


def test_isolated_llvm_measurements_of_several_configs() -> None:
    workload = parse_workload(DENSE)
    space = template_by_name("dense.x86").space(workload)
    indices = [default_index(), *[i for i in range(0, space.size, space.size // 7)
                                  if space.is_valid(i)][:3]]
    with IsolatedMeasurer(BackendSpec("llvm"), parallel_build=2) as measurer:
        results = dict((t.measure_id, r) for t, r in measurer.measure_many(task(i)
                                                                          for i in indices))
    assert results[default_index()].ok
    assert all(r.ok or r.error is not ErrorKind.UNKNOWN for r in results.values())
