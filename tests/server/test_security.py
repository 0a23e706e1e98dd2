"""The shared request checks (``tuner_service.db.values``) and the resource budget."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from schedule_templates.workloads import parse_workload
from tuner_service.db.values import bounded_json, check_tree, safe_json
from tuner_service.errors import InvalidInputError
from tuner_service.jobs.budget import ResourceBudget


@pytest.mark.parametrize(("value", "words"), [
    ({"a": float("nan")}, "finite"),
    ([1, [2, float("inf")]], "finite"),
    ({"n": 2**63}, "64-bit"),
    ({"n": -(2**63) - 5}, "64-bit"),
    ({"s": "a\x00b"}, "NUL"),
    ({"s": "\ud800"}, "surrogate"),
    ({"\udfff": 1}, "surrogate"),
    ({"k\x00": 1}, "NUL"),
])
def test_check_tree_refuses_what_json_or_the_databases_cannot_hold(value: Any,
                                                                   words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_tree(value)


def test_check_tree_bounds_depth_without_recursion() -> None:
    deep: Any = 1
    for _ in range(100_000):  # far deeper than Python's recursion limit
        deep = [deep]
    with pytest.raises(ValueError, match="deeper than 32"):
        check_tree(deep)
    check_tree({"ok": [1, 2.5, "text", None, True, {"x": -(2**63) + 1}]})


def test_bounded_json_limits_size_and_depth() -> None:
    check = bounded_json(100, 3)
    assert check({"a": {"b": 1}}) == {"a": {"b": 1}}
    with pytest.raises(ValueError, match="at most 100 bytes"):
        check({"a": "x" * 200})
    with pytest.raises(ValueError, match="deeper than 3"):
        check({"a": {"b": {"c": {"d": 1}}}})


def test_safe_json_always_encodes() -> None:
    hostile = {"nan": float("nan"), b"bytes": b"\xff", "lone": "\ud800", "big": 10**40,
               "obj": object(), "deep": [[[[[[[[[[[[1]]]]]]]]]]]]}
    text = json.dumps(safe_json(hostile), allow_nan=False)
    assert "nan" in text.lower() and "bytes" in text


BUDGET = ResourceBudget(max_tensor_bytes=1 << 20, max_candidate_flops=10**7, max_number=10,
                        max_repeat=5, max_min_repeat_ms=100.0, max_build_timeout_s=30.0,
                        max_run_timeout_s=10.0)


@pytest.mark.parametrize(("key", "limit"), [
    ("dense:M=1024,N=1024,K=1", "TUNER_BUDGET_MAX_TENSOR_BYTES"),
    ("dense:M=256,N=256,K=256", "TUNER_BUDGET_MAX_CANDIDATE_FLOPS"),
])
def test_workloads_over_budget_name_the_limit(key: str, limit: str) -> None:
    with pytest.raises(InvalidInputError, match=limit):
        BUDGET.check_workloads([(key, parse_workload(key))])


def test_workloads_within_budget_pass() -> None:
    key = "dense:M=64,N=64,K=64"
    BUDGET.check_workloads([(key, parse_workload(key))])


@pytest.mark.parametrize(("options", "limit"), [
    ({"number": 11}, "TUNER_BUDGET_MAX_NUMBER"),
    ({"repeat": 6}, "TUNER_BUDGET_MAX_REPEAT"),
    ({"min_repeat_ms": 101.0}, "TUNER_BUDGET_MAX_MIN_REPEAT_MS"),
    ({"build_timeout_s": 31.0}, "TUNER_BUDGET_MAX_BUILD_TIMEOUT_S"),
    ({"run_timeout_s": math.inf}, "TUNER_BUDGET_MAX_RUN_TIMEOUT_S"),
])
def test_measure_options_over_budget_name_the_limit(options: dict[str, Any], limit: str) -> None:
    with pytest.raises(InvalidInputError, match=limit):
        BUDGET.check_options(options)
    BUDGET.check_options({"number": 10, "repeat": 5, "run_timeout_s": 10.0})
