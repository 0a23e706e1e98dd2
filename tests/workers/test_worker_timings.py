"""Stage times of a candidate, from the moments its measuring process changed phase."""

from __future__ import annotations

import pytest

from workers.timings import STAGES, StageTimes


def test_a_full_candidate_splits_into_build_check_wait_and_measure() -> None:
    marks = {"compile": 1.0, "verify": 1.5, "time": 1.6, "go": 1.9, "end": 2.4}
    times = StageTimes.from_marks(marks)
    assert times.build_s == pytest.approx(0.5) and times.check_s == pytest.approx(0.1)
    assert times.wait_s == pytest.approx(0.3) and times.measure_s == pytest.approx(0.5)


def test_a_candidate_that_failed_to_build_has_only_a_build_time() -> None:
    times = StageTimes.from_marks({"compile": 1.0, "end": 1.25})
    assert times == StageTimes(build_s=0.25)


def test_json_has_every_stage_and_no_negative_time() -> None:
    data = StageTimes(build_s=-0.001, measure_s=0.1234567).to_json()
    assert list(data) == list(STAGES) and data["build_s"] == 0.0
    assert StageTimes.from_json(data).measure_s == pytest.approx(0.123457)
