"""The typed candidate protocol: targets, candidates, claim items and reports, and their JSON."""

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest

from schedule_templates.errors import InvalidConfigError, InvalidWorkloadError
from schedule_templates.protocol import (
    Candidate,
    ClaimItem,
    MessageError,
    Report,
    Target,
    measure_id_of,
)
from schedule_templates.records import ErrorKind, MeasureOptions, MeasureResult
from schedule_templates.templates.base import get_template, template_by_name
from schedule_templates.workloads import parse_workload

DENSE = "dense:M=64,N=64,K=64"
#: a claim item exactly as the previous worker release reads it (docs/worker-protocol.md)
WIRE_ITEM: dict[str, Any] = {"measure_id": 7, "template": "dense.x86", "template_version": 1,
             "workload": DENSE, "target": "llvm -mcpu=znver3",
             "config": {"index": 5, "entity": [["tile_x", "sp", [-1, 8]]]},
             "options": MeasureOptions(repeat=2).to_json(), "threads": 2}


@pytest.mark.parametrize("text", ["llvm", "llvm -mcpu=znver4", "cuda -arch=sm_90",
                                  "llvm -mcpu=znver4 -mattr=+avx2"])
def test_a_target_round_trips_through_its_text(text: str) -> None:
    target = Target.parse(text)
    assert str(target) == text and Target.parse(str(target)) == target
    assert target.kind == text.split()[0]


def test_a_target_is_split_once_whatever_its_spacing() -> None:
    assert Target.parse("  cuda   -arch=sm_80 ") == Target("cuda", ("-arch=sm_80",))
    for bad in ("", "   "):
        with pytest.raises(MessageError):
            Target.parse(bad)


def test_target_options_are_read_and_set_by_name() -> None:
    target = Target.parse("cuda -arch=sm_80 -O3")
    assert target.option("-arch") == "sm_80" and target.option("-mcpu") is None
    assert str(target.with_option("-arch", "sm_90")) == "cuda -O3 -arch=sm_90"
    assert str(Target("cuda").with_option("-arch", "sm_90")) == "cuda -arch=sm_90"


@pytest.mark.parametrize(("worker", "job", "serves"), [
    ("cuda -arch=sm_90", "cuda", True),
    ("cuda -arch=sm_90", "cuda -arch=sm_90", True),
    ("cuda -arch=sm_90", "cuda -arch=sm_80", False),
    ("cuda", "cuda -arch=sm_90", False),
    ("llvm", "cuda", False),
    ("llvm -mcpu=znver3", "llvm", True),
    ("llvm -mattr=+avx2 -mcpu=znver3", "llvm -mcpu=znver3", True),
])
def test_a_worker_serves_a_job_of_its_kind_whose_options_it_has(worker: str, job: str,
                                                                 serves: bool) -> None:
    assert Target.parse(worker).serves(Target.parse(job)) is serves
    # the claim's SQL form says the same thing
    assert (job in Target.parse(worker).served()) is serves


def test_a_claim_item_reads_and_writes_the_previous_wire_format() -> None:
    item = ClaimItem.from_json(WIRE_ITEM)
    assert item.measure_id == 7 and item.threads == 2
    assert item.candidate == Candidate("dense.x86", DENSE, WIRE_ITEM["config"], 1)
    assert item.target == Target("llvm", ("-mcpu=znver3",))
    assert item.options == MeasureOptions(repeat=2)
    assert item.to_json() == WIRE_ITEM
    assert pickle.loads(pickle.dumps(item)) == item  # it crosses into the measuring child


def test_a_claim_item_accepts_the_short_forms_older_servers_send() -> None:
    item = ClaimItem.from_json({"measure_id": "m1", "template": "dense.x86", "workload": DENSE,
                                "target": "llvm", "config": 3})
    assert item.candidate.config == {"index": 3} and item.candidate.index == 3
    assert item.candidate.template_version is None
    assert item.threads == 1 and item.options == MeasureOptions()


@pytest.mark.parametrize(("change", "words"), [
    ({"measure_id": True}, "measure_id"),
    ({"template": ""}, "template"),
    ({"workload": 3}, "workload"),
    ({"target": " "}, "target"),
    ({"config": "3"}, "config"),
    ({"threads": 0}, "threads"),
    ({"template_version": "1"}, "template_version"),
])
def test_a_malformed_item_names_what_is_wrong(change: dict[str, object], words: str) -> None:
    with pytest.raises(MessageError, match=words):
        ClaimItem.from_json({**WIRE_ITEM, **change})
    assert measure_id_of({**WIRE_ITEM, **change}) == (None if "measure_id" in change else 7)


def test_a_candidate_decodes_against_this_processes_templates() -> None:
    template = get_template("dense")
    workload = parse_workload(DENSE)
    config = template.default_config(workload)
    candidate = Candidate.of(template, workload, config)
    assert candidate == Candidate(template.name, workload.key, config.to_json(),
                                  template.version)
    decoded = candidate.decode()
    assert (decoded.template, decoded.workload, decoded.config) == (template, workload, config)


@pytest.mark.parametrize(("change", "error", "words"), [
    ({"config": {"index": 10**12}}, InvalidConfigError, "outside"),
    ({"template_version": 99}, InvalidConfigError, "version"),
    ({"template": "no.such"}, InvalidConfigError, "unknown template"),
    ({"template": "conv2d.x86"}, InvalidConfigError, "handles conv2d"),
    ({"workload": "dense:M=4"}, InvalidWorkloadError, "dense"),
])
def test_a_candidate_that_does_not_fit_is_refused(change: dict[str, object],
                                                  error: type[Exception], words: str) -> None:
    template = template_by_name("dense.x86")
    workload = parse_workload(DENSE)
    good = Candidate.of(template, workload, template.default_config(workload))
    with pytest.raises(error, match=words):
        dataclasses.replace(good, **change).decode()  # type: ignore[arg-type]


def test_a_config_whose_entities_disagree_with_its_index_is_refused() -> None:
    template = template_by_name("dense.x86")
    workload = parse_workload(DENSE)
    space = template.cached_space(workload)
    one, other = (space.get(i).to_json() for i in space.sample(2, np.random.default_rng(0)))
    with pytest.raises(InvalidConfigError, match="disagrees"):
        Candidate(template.name, DENSE, {"index": one["index"], "entity": other["entity"]}
                  ).decode()
    assert Candidate(template.name, DENSE, one).decode().config.index == one["index"]


def test_spaces_and_workloads_are_built_once_per_key() -> None:
    template = template_by_name("dense.x86")
    assert parse_workload(DENSE) is parse_workload(DENSE)
    workload = parse_workload(DENSE)
    assert template.cached_space(workload) is template.cached_space(workload)


def test_a_report_writes_the_result_fields_the_server_reads() -> None:
    result = MeasureResult(costs=(0.5, 0.25), compile_time_s=1.0, wall_time_s=2.0)
    sent = Report(3, result, 10.0, "cpu:x", 2, {"build_s": 0.5}).to_json()
    assert sent == {"measure_id": 3, **result.to_json(), "peak_gflops": 10.0,
                    "device_class": "cpu:x", "threads": 2, "timings": {"build_s": 0.5}}
    failed = Report("m", MeasureResult.failure(ErrorKind.RUNTIME, "boom")).to_json()
    assert "timings" not in failed and failed["error_kind"] == int(ErrorKind.RUNTIME)
    assert MeasureResult.from_json(failed).error is ErrorKind.RUNTIME
