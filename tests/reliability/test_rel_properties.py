"""Property-based tests of the parsers that face untrusted input: workload keys, config
decoding, and record import (on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schedule_templates.errors import InvalidConfigError, InvalidWorkloadError
from schedule_templates.templates.base import all_templates, template_by_name
from schedule_templates.workloads import make_workload, parse_workload, workload_class
from schedule_templates.workloads.base import workload_ops

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
#: values that break parsers: extremes, non-finite numbers, long text, wrong shapes
NASTY = st.one_of(
    JSON, st.sampled_from([1e300, -1e300, 2**63, -(2**63), 10**30, True, "", "x" * 600]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(min_size=200, max_size=400),
    st.lists(JSON, min_size=1, max_size=3),
    st.dictionaries(st.text(max_size=4), JSON, min_size=1, max_size=3))


@st.composite
def workloads(draw: st.DrawFn) -> Any:
    """Any registered operator, its parameters drawn by kind (others keep their defaults)."""
    op = draw(st.sampled_from(workload_ops()))
    values: dict[str, Any] = {}
    for name, (kind, _default) in workload_class(op).params.items():
        low = 0 if name == "pad" else 1
        one = st.integers(min_value=low, max_value=4 if name in ("stride", "pad", "dilation",
                                                                  "R", "S") else 48)
        if kind == "int":
            values[name] = draw(one)
        elif kind == "pair":
            values[name] = draw(st.tuples(one, one))
        elif kind == "quad":
            values[name] = draw(st.tuples(one, one, one, one))
    try:
        return make_workload(op, **values)
    except InvalidWorkloadError:
        assume(False)


@settings(max_examples=300, deadline=None)
@given(workloads(), st.randoms(use_true_random=False))
def test_workload_keys_round_trip_in_any_order(workload: Any, rnd: Any) -> None:
    assert parse_workload(workload.key) == workload
    op, _, body = workload.key.partition(":")
    parts = body.split(",") if body else []
    rnd.shuffle(parts)
    reordered = f" {op} : " + " , ".join(parts)
    assert parse_workload(reordered) == workload
    assert parse_workload(reordered).key == workload.key  # one canonical key


KEY_TEXT = st.one_of(
    st.text(max_size=60),
    st.builds(lambda op, body: f"{op}:{body}", st.sampled_from([*workload_ops(), "x", ""]),
              st.text(alphabet="MNKBCHWRS=,x0123456789-_ ()padstridelation", max_size=60)),
)


@settings(max_examples=500, deadline=None)
@given(KEY_TEXT)
def test_any_text_parses_or_raises_invalid_workload(text: str) -> None:
    try:
        workload = parse_workload(text)
    except InvalidWorkloadError as e:
        assert str(e)
        return
    assert parse_workload(workload.key) == workload  # whatever parses is canonicalizable


SPACES = [(t.name, key) for t in all_templates() if t.target_kind == "llvm"
          for key in ("dense:M=16,N=48,K=32", "batch_matmul:B=2,M=8,N=16,K=24",
                      "conv2d:N=1,C=8,H=14,W=14,K=16,R=3,S=3,pad=1",
                      "depthwise_conv2d:N=1,C=8,H=14,W=14,R=3,S=3,pad=1")
          if parse_workload(key).op == t.op]


def _space(template: str, key: str) -> Any:
    return template_by_name(template).space(parse_workload(key))


@pytest.mark.parametrize(("template", "key"), SPACES)
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_configs_round_trip_through_json(template: str, key: str, data: st.DataObject) -> None:
    space = _space(template, key)
    index = data.draw(st.integers(min_value=0, max_value=space.size - 1))
    config = space.get(index)
    encoded = json.loads(json.dumps(config.to_json()))  # what travels over HTTP
    assert space.from_json(encoded) == config
    assert space.from_json({"entity": encoded["entity"]}) == config
    assert space.from_json(index) == config


@pytest.mark.parametrize(("template", "key"), SPACES)
@settings(max_examples=150, deadline=None)
@given(JSON | st.fixed_dictionaries({}, optional={"index": JSON, "entity": JSON}))
def test_any_json_decodes_to_a_config_or_an_invalid_config_error(
        template: str, key: str, value: Any) -> None:
    space = _space(template, key)
    try:
        config = space.from_json(value)
    except InvalidConfigError as e:
        assert str(e)
        return
    assert 0 <= config.index < space.size and space.get(config.index) == config


# ---- record import ----------------------------------------------------------------------------

@pytest.fixture
def import_db(any_url: str) -> Iterator[Any]:
    from tuner_service.db.engine import Database

    db = Database(any_url)
    yield db
    db.dispose()


def _valid_record(draw: st.DrawFn) -> dict[str, Any]:
    template, key = draw(st.sampled_from(SPACES))
    space = _space(template, key)
    index = draw(st.integers(min_value=0, max_value=space.size - 1))
    assume(space.is_valid(index))
    kind = draw(st.sampled_from([0, 0, 0, 1, 2, 4, 5, 6, 7]))
    costs = draw(st.lists(st.floats(min_value=1e-9, max_value=10.0), min_size=1, max_size=4))
    return {"uid": draw(st.uuids()).hex, "workload": key, "target": "llvm",
            "template": template, "template_version": int(template_by_name(template).version),
            "config": space.get(index).to_json(),
            "result": {"costs": costs if kind == 0 else [], "error_kind": kind},
            "device_key": draw(st.none() | st.sampled_from(["a", "b"]))}


@st.composite
def record_lines(draw: st.DrawFn) -> str:
    """A JSON line: a valid record with some fields replaced by arbitrary JSON, or junk."""
    record = _valid_record(draw)
    for field in draw(st.lists(st.sampled_from([*sorted(record), "timestamp"]), min_size=1,
                               max_size=2)):
        record[field] = draw(NASTY)
    if draw(st.integers(0, 3)) == 0:
        record["result"] = {**(record["result"] if isinstance(record["result"], dict) else {}),
                            draw(st.sampled_from(["costs", "error_kind", "peak_gflops",
                                                  "wall_time_s"])): draw(NASTY)}
    text = json.dumps(record)  # NaN and Infinity go out as JSON's common extension
    return text if draw(st.integers(0, 9)) else text[: draw(st.integers(0, len(text)))]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(record_lines(), min_size=1, max_size=4))
def test_any_records_import_cleanly_or_are_refused_whole(import_db: Any, lines: list[str]
                                                         ) -> None:
    from tuner_service.errors import InvalidInputError
    from tuner_service.jobs.records import import_lines

    session_cm = import_db.session()
    session = session_cm.__enter__()
    try:
        try:
            answer = import_lines(session, "\n".join(lines), 100)
        except InvalidInputError as e:
            assert e.args[0]["errors"]
            return
        assert answer["imported"] + answer["duplicates"] == len([x for x in lines if x.strip()])
        session.flush()
    finally:
        session.rollback()
        session_cm.__exit__(None, None, None)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.composite(_valid_record)(), min_size=1, max_size=6,
                unique_by=lambda r: r["uid"]))
def test_exported_records_import_back_unchanged(import_db: Any,
                                                records: list[dict[str, Any]]) -> None:
    from tuner_service.jobs.records import export_lines, import_lines

    with import_db.session() as session:
        try:
            first = import_lines(session, "\n".join(map(json.dumps, records)), 100)
            assert first == {"imported": len(records), "duplicates": 0}
            again = import_lines(session, "\n".join(map(json.dumps, records)), 100)
            assert again == {"imported": 0, "duplicates": len(records)}
            exported = [json.loads(line) for line in export_lines(session, None, None, None)]
            by_uid = {r["uid"]: r for r in exported}
            for record in records:
                out = by_uid[record["uid"]]
                assert out["config"] == record["config"] and out["workload"] == record["workload"]
                assert out["result"]["error_kind"] == record["result"]["error_kind"]
                assert all(math.isclose(a, b) for a, b in zip(
                    out["result"]["costs"], record["result"]["costs"], strict=True))
        finally:
            session.rollback()
