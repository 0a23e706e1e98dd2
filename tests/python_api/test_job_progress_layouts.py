"""A job's latency estimate (``JobProgress.estimated_latency_s``) when it tunes both layouts'
tasks (``tuner tune --layout auto``): each layer counted once, in the faster plan."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")

from tuner_service.compiler.frontend.extract import extract_tasks, is_blocked
from tuner_service.compiler.frontend.layout import blocked_workload
from tuner_service.compiler.frontend.samples import build_sample_model
from tuner_service.tuning.remote import JobProgress, TaskProgress, layout_plans


@pytest.fixture(scope="module")
def mobilenet() -> bytes:
    return bytes(build_sample_model("mobilenet_v2").SerializeToString())


def test_a_jobs_latency_estimate_counts_each_layer_once_across_layouts(mobilenet: bytes) -> None:
    """With both layouts' tasks the estimate is the faster plan's, not both plans' sum."""
    tasks = extract_tasks(mobilenet, layout="auto", block=16).tasks

    def progress(blocked_s: float) -> JobProgress:
        rows = tuple(TaskProgress(n, t.workload.key, t.weight, 1, 1, None,
                                  blocked_s if is_blocked(t.workload) else 1e-3, "done")
                     for n, t in enumerate(tasks))
        return JobProgress(1, "done", "", rows)

    plain, blocked = layout_plans(progress(1e-3).tasks)
    layers = sum(t.weight for t in extract_tasks(mobilenet).tasks)
    assert sum(t.weight for t in plain) == sum(t.weight for t in blocked) == layers
    assert {t.workload for t in plain} == {t.workload.key for t in extract_tasks(mobilenet).tasks}
    assert {t.workload for t in blocked} == {
        t.workload.key for t in extract_tasks(mobilenet, layout="nchwc", block=16).tasks}
    assert progress(1e-3).estimated_latency_s == pytest.approx(layers * 1e-3)
    dense = sum(t.weight for t in tasks if not is_blocked(t.workload)
                and blocked_workload(t.workload, 16) is None)
    assert progress(5e-4).estimated_latency_s == pytest.approx(
        dense * 1e-3 + (layers - dense) * 5e-4)
    # one layout's tasks: every task counts
    one = tuple(TaskProgress(n, t.workload.key, t.weight, 1, 1, None, 1e-3, "done")
                for n, t in enumerate(extract_tasks(mobilenet, layout="nchwc", block=16).tasks))
    assert JobProgress(1, "done", "", one).estimated_latency_s == pytest.approx(layers * 1e-3)
