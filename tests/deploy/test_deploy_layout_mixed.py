"""Per-layer layouts (``deploy.layout_mixed``): a blocked plan that keeps chosen conv layers
plain runs transforms around them, matches onnxruntime and the whole plans, is re-planned from
the manifest at load, and ``--layout auto`` proposes such plans from measured layer times and
keeps one only when it times fastest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from schedule_templates.ops.layout import FromBlocked, ToBlocked
from tests.deploy.conftest import onnxruntime_outputs
from tests.deploy.test_deploy_layout import _model
from tuner_service.compiler.deploy import layout_choice
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.generated_step import GeneratedStep
from tuner_service.compiler.deploy.layout_choice import build_with_layout
from tuner_service.compiler.deploy.layout_mixed import (
    FALLBACK_TRANSFORM_S,
    LayerTimes,
    candidates,
    layer_times,
    transform_rate,
)
from tuner_service.compiler.deploy.library import MANIFEST_FILE, build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.fusion import plan_layers
from tuner_service.compiler.frontend.loading import load_model


def _conv_outputs(model: Any) -> list[str]:
    return [layer.output for layer in plan_layers(load_model(model))]


def _check(model: Any, runner: ModelRunner) -> None:
    feeds = runner.random_feeds(5)
    want = onnxruntime_outputs(model, feeds)
    for got in (runner.run(feeds), runner.run(feeds, native=False)):
        for name, expected in want.items():
            scale = float(np.abs(expected).max())
            assert float(np.abs(got[name] - expected).max()) <= 1e-5 * scale, name


def test_a_blocked_plan_keeps_the_named_conv_layer_plain(tmp_path: Path) -> None:
    model = _model()
    first, middle, last = _conv_outputs(model)
    manifest = build_library(model, ConfigBook(), tmp_path, layout="nchwc",
                             plain_layers=[middle])
    assert manifest["layout"]["plain"] == [middle]
    ops = {layer["output"].split("@", 1)[0]: layer["workload"].split(":", 1)[0]
           for layer in manifest["layers"]}
    assert ops[middle] == "depthwise_conv2d"  # plain, between two blocked layers
    assert ops[first] == ops[last] == "conv2d_nchwc"
    kinds = [g["op"]["kind"] for g in manifest["generated"]]
    # the whole blocked plan has one transform in and two out; the plain layer adds one each
    assert kinds.count("to_nchwc") == 2 and kinds.count("from_nchwc") == 3
    _check(model, ModelRunner(model, KernelLibrary(tmp_path), 1))


def test_a_manifest_naming_its_plain_layers_wrongly_is_refused(tmp_path: Path) -> None:
    model = _model()
    build_library(model, ConfigBook(), tmp_path, layout="nchwc",
                  plain_layers=[_conv_outputs(model)[1]])
    path = tmp_path / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["layout"]["plain"] = "c2"
    path.write_text(json.dumps(manifest))
    with pytest.raises(LibraryError, match="plain layers"):
        ModelRunner(model, KernelLibrary(tmp_path), 1)


def test_candidates_follow_the_layer_times_and_the_transform_cost() -> None:
    times = {"a": LayerTimes(plain_s=1e-3, blocked_s=2e-3, elements=1000),  # plain wins
             "b": LayerTimes(plain_s=2e-3, blocked_s=1e-3, elements=1000),  # blocked wins
             "c": LayerTimes(plain_s=1.00e-3, blocked_s=1.01e-3, elements=10_000)}  # a tie
    found = candidates(times, transform_s=1e-8)  # two transforms of c: 0.2 ms, more than 10 us
    assert found == {"mostly-blocked": frozenset({"a"}),
                     "mostly-plain": frozenset({"a", "c"})}
    # transforms dearer than any gain: only the whole plans remain
    assert candidates(times, transform_s=1e-5) == {}
    # every layer faster plain: that is the plain plan itself, not a mixed one
    assert candidates({"a": times["a"]}, transform_s=0.0) == {}


def test_the_transform_rate_weighs_each_transform_by_its_size() -> None:
    # a 3-channel input blocked (802,816 elements in 0.2 ms) and a 2048-element output (4 us):
    # elements over seconds together, not the median of two rates
    def step(op: object) -> GeneratedStep:
        s = object.__new__(GeneratedStep)
        s.op = op  # type: ignore[assignment]
        return s

    big, small = ToBlocked((1, 3, 224, 224), 16), FromBlocked((1, 2048, 1, 1), 16)
    rate = transform_rate([(step(big), 2e-4), (step(small), 4e-6), (object(), 1.0)])
    assert rate == pytest.approx(2.04e-4 / (16 * 224 * 224 + 2048))
    assert transform_rate([]) == FALLBACK_TRANSFORM_S
    # one small transform: its time is mostly the profile's per-step cost, not a rate
    assert transform_rate([(step(small), 4e-6)]) == FALLBACK_TRANSFORM_S


def test_layer_times_pair_each_blocked_layer_with_its_plain_twin(tmp_path: Path) -> None:
    model = _model()
    for mode in ("nchw", "nchwc"):
        build_library(model, ConfigBook(), tmp_path / mode, layout=mode)
    plain, blocked = (ModelRunner(model, KernelLibrary(tmp_path / mode), 1)
                      for mode in ("nchw", "nchwc"))
    times, rate = layer_times(plain, blocked, plain.random_feeds(0))
    assert set(times) == set(_conv_outputs(model))
    assert all(t.plain_s > 0 and t.blocked_s > 0 and t.elements > 0 for t in times.values())
    assert 0 < rate < 1e-6  # seconds per element of a transform


def test_auto_keeps_a_mixed_plan_when_it_times_fastest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    middle = _conv_outputs(model)[1]
    monkeypatch.setattr(layout_choice, "mixed_plans",
                        lambda plain, blocked: {"mostly-blocked": frozenset({middle})})
    speeds = {"nchw": 3e-3, "nchwc": 2e-3, "mostly-blocked": 1e-3}
    monkeypatch.setattr(layout_choice, "_time_libraries",
                        lambda model, dirs, shapes: {m: speeds[m] for m in dirs})
    manifest = build_with_layout(model, ConfigBook(), tmp_path / "out", layout="auto")
    assert manifest["layout_choice"]["chosen"] == "mostly-blocked"
    assert manifest["layout_choice"]["mostly-blocked_plain_layers"] == 1
    assert manifest["layout"]["plain"] == [middle]
    _check(model, ModelRunner(model, KernelLibrary(tmp_path / "out"), 1))

    speeds["nchwc"] = 0.5e-3  # the whole blocked plan faster: no per-layer entry
    manifest = build_with_layout(model, ConfigBook(), tmp_path / "again", layout="auto")
    assert manifest["layout_choice"]["chosen"] == "nchwc" and "plain" not in manifest["layout"]
