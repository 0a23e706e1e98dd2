"""Blocked activations in a model library (``tuner build --layout nchwc``): conv-family layers
and the elementwise chains between them run NCHW[b]c, transforms only at the boundaries, and
the outputs equal onnxruntime's and the plain build's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import make_model, onnxruntime_outputs
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import BuildError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.generated_step import GeneratedStep
from tuner_service.compiler.deploy.layout import host_block
from tuner_service.compiler.deploy.layout_choice import build_with_layout
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary


def _model() -> Any:
    """5 input channels (not a block multiple) -> conv -> depthwise s2 -> 1x1 conv with a
    residual -> per-channel scale + sigmoid chain -> add -> GAP; the chain is an output too."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], group=12, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"]),
        helper.make_node("Add", ["c3", "r2"], ["a3"]),
        helper.make_node("Mul", ["a3", "scale"], ["m4"]),
        helper.make_node("Sigmoid", ["m4"], ["s4"]),
        helper.make_node("Add", ["s4", "a3"], ["y"]),
        helper.make_node("GlobalAveragePool", ["y"], ["g"]),
        helper.make_node("Flatten", ["g"], ["out"]),
    ]
    weights = {"w1": w(12, 5, 3, 3), "b1": w(12), "w2": w(12, 1, 3, 3), "b2": w(12),
               "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
               "w3": w(12, 12, 1, 1), "scale": w(1, 12, 1, 1)}
    return make_model(nodes, {"x": (1, 5, 11, 13)}, {"out": (1, 12), "y": (1, 12, 6, 7)},
                      weights)


def _build(model: Any, out: Path, layout: str) -> tuple[dict[str, Any], ModelRunner]:
    manifest = build_library(model, ConfigBook(), out, layout=layout)
    return manifest, ModelRunner(model, KernelLibrary(out), 1)


def test_nchwc_library_matches_onnxruntime_and_the_plain_build(tmp_path: Path) -> None:
    model = _model()
    manifest, runner = _build(model, tmp_path / "blocked", "nchwc")
    _, plain = _build(model, tmp_path / "plain", "nchw")
    assert manifest["layout"] == {"mode": "nchwc", "block": host_block()}
    assert {k["op"] for k in manifest["kernels"]} == {"conv2d_nchwc", "depthwise_conv2d_nchwc"}
    kinds = [g["op"]["kind"] for g in manifest["generated"]]
    # one transform in (the model input), out: y (a graph output) and the pooled g (Flatten)
    assert kinds.count("to_nchwc") == 1 and kinds.count("from_nchwc") == 2
    (pool,) = [g["op"] for g in manifest["generated"] if g["op"]["kind"] == "reduce"]
    assert pool["inner"] == host_block()  # the global pool reduces blocked pixels
    # the scale + sigmoid + add chain runs blocked
    assert [len(g["op"]["shape"]) for g in manifest["generated"]
            if g["op"]["kind"] == "elementwise"] == [5]
    feeds = runner.random_feeds(3)
    want = onnxruntime_outputs(model, feeds)
    for got in (runner.run(feeds), runner.run(feeds, native=False), plain.run(feeds)):
        for name, expected in want.items():
            assert got[name].shape == expected.shape
            scale = float(np.abs(expected).max())
            assert float(np.abs(got[name] - expected).max()) <= 1e-5 * scale, name


def test_blocked_steps_read_blocked_tensors(tmp_path: Path) -> None:
    _, runner = _build(_model(), tmp_path, "nchwc")
    transforms = [s for s in runner.steps if isinstance(s, GeneratedStep)
                  and s.op.kind in ("to_nchwc", "from_nchwc")]
    assert [s.op.kind for s in transforms] == ["to_nchwc", "from_nchwc", "from_nchwc"]
    assert transforms[0].inputs == ["x"] and transforms[1].outputs == ["y"]
    assert transforms[2].outputs == ["g"]
    assert runner.steps[0] is transforms[0]  # a model input's transform runs first


def test_plain_default_has_no_layout_entry(tmp_path: Path) -> None:
    manifest, _ = _build(_model(), tmp_path, "nchw")
    assert "layout" not in manifest
    assert all(k["op"] in ("conv2d", "depthwise_conv2d") for k in manifest["kernels"])


def test_bad_layout_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="unknown layout"):
        build_library(_model(), ConfigBook(), tmp_path, layout="nhwc")
    with pytest.raises(BuildError, match="generated"):
        build_library(_model(), ConfigBook(), tmp_path, layout="nchwc", generated=False)


def test_auto_keeps_the_faster_measured_layout(tmp_path: Path) -> None:
    model = _model()
    manifest = build_with_layout(model, ConfigBook(), tmp_path, layout="auto")
    choice = manifest["layout_choice"]
    timed = {name[:-3]: ms for name, ms in choice.items() if name.endswith("_ms")}
    # the two plans, or a mixed one (some conv layers kept plain) where its time was lower
    assert {"nchw", "nchwc"} <= set(timed) and choice["chosen"] in timed
    assert timed["nchw"] > 0 and timed[choice["chosen"]] == min(timed.values())
    mode = manifest.get("layout", {"mode": "nchw"})["mode"]
    assert mode == ("nchw" if choice["chosen"] == "nchw" else "nchwc")
    runner = ModelRunner(model, KernelLibrary(tmp_path), 1)
    feeds = runner.random_feeds(1)
    want = onnxruntime_outputs(model, feeds)
    got = runner.run(feeds)
    assert float(np.abs(got["out"] - want["out"]).max()) <= 1e-5 * float(
        np.abs(want["out"]).max())


def test_cli_build_takes_the_layout(tmp_path: Path) -> None:
    import onnx

    from tuner_service.cli.main import main

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    assert main(["build", str(path), "-o", str(tmp_path / "out"), "--layout", "nchwc"]) == 0
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["layout"]["mode"] == "nchwc"


def test_blocked_channel_concat_matches_onnxruntime(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    weights = {"w1": rng.standard_normal((16, 8, 1, 1)).astype(np.float32),
               "w2": rng.standard_normal((8, 8, 3, 3)).astype(np.float32),
               "w3": rng.standard_normal((4, 24, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w3"], ["y"])]
    model = make_model(nodes, {"x": (1, 8, 5, 6)}, {"y": (1, 4, 5, 6)}, weights)
    manifest, runner = _build(model, tmp_path, "nchwc")
    assert [g["op"]["kind"] for g in manifest["generated"]].count("concat") == 1
    feeds = runner.random_feeds(2)
    want = onnxruntime_outputs(model, feeds)["y"]
    got = runner.run(feeds)["y"]
    assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max())


def _stem_reads_plain(h: int, w: int) -> bool:
    """Whether a 3-channel convolution on an h x w map reads NCHW at this host's block."""
    from schedule_templates.workloads import make_workload
    from tuner_service.compiler.frontend.layout import reads_plain

    stem = make_workload("conv2d", N=1, C=3, H=h, W=w, K=8, R=3, S=3)
    return reads_plain(stem, host_block())


def test_pools_of_blocked_tensors_run_blocked(tmp_path: Path) -> None:
    # conv -> relu -> max pool (padded, ceil mode) -> conv -> average pool -> conv: both pools
    # pool channel blocks, so the only transform is the output's (the 3-channel first conv
    # reads the plain input: ``layout.reads_plain``)
    rng = np.random.default_rng(4)
    weights = {"w1": rng.standard_normal((20, 3, 3, 3)).astype(np.float32),
               "w2": rng.standard_normal((24, 20, 1, 1)).astype(np.float32),
               "w3": rng.standard_normal((8, 24, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], strides=[2, 2]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1], ceil_mode=1),
             helper.make_node("Conv", ["p", "w2"], ["b"]),
             helper.make_node("AveragePool", ["b"], ["q"], kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Conv", ["q", "w3"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, {"x": (1, 3, 37, 35)}, {"y": (1, 8, 5, 4)}, weights)
    manifest, runner = _build(model, tmp_path, "nchwc")
    kinds = [g["op"]["kind"] for g in manifest["generated"]]
    assert kinds.count("blocked_pool2d") == 2 and "pool2d" not in kinds
    # a 3-channel stem reads NCHW where its block is wide (AVX-512's 16), not AVX2's 8
    plain_stem = _stem_reads_plain(37, 35)
    assert kinds.count("to_nchwc") == (0 if plain_stem else 1)
    assert kinds.count("from_nchwc") == 1
    assert ("in_layout=nchw" in manifest["kernels"][0]["workload"]) == plain_stem
    feeds = runner.random_feeds(3)
    want = onnxruntime_outputs(model, feeds)["y"]
    got = runner.run(feeds)["y"]
    assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max())


def test_a_sliver_of_a_block_on_a_large_map_is_read_plain(tmp_path: Path) -> None:
    # x (3 channels) -> conv to 2 channels -> conv: both convs read a plain input; the second's
    # comes from a blocked conv, so it is converted back once. The 3-channel 1 x 1 map after
    # the global pool (a squeeze-excite vector) stays blocked from producer to consumer.
    rng = np.random.default_rng(6)
    weights = {"w1": rng.standard_normal((2, 3, 3, 3)).astype(np.float32),
               "w2": rng.standard_normal((16, 2, 3, 3)).astype(np.float32),
               "w3": rng.standard_normal((3, 16, 1, 1)).astype(np.float32),
               "w4": rng.standard_normal((16, 3, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["a", "w2"], ["b"], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["b"], ["g"]),
             helper.make_node("Conv", ["g", "w3"], ["s"]),
             helper.make_node("Conv", ["s", "w4"], ["y"])]
    model = make_model(nodes, {"x": (1, 3, 40, 36)}, {"y": (1, 16, 1, 1)}, weights)
    manifest, runner = _build(model, tmp_path, "nchwc")
    plain = sorted(",".join(k["workload"].split(",")[1:3]) for k in manifest["kernels"]
                   if "in_layout=nchw" in k["workload"])
    plain_stem = _stem_reads_plain(40, 36)  # the 3-channel input: on AVX-512 hosts only
    assert plain == ["C=2,H=40", *(["C=3,H=40"] if plain_stem else [])], plain
    kinds = [g["op"]["kind"] for g in manifest["generated"]]
    assert kinds.count("to_nchwc") == (0 if plain_stem else 1)
    assert kinds.count("from_nchwc") == 2  # conv 2's input and the output
    feeds = runner.random_feeds(2)
    want = onnxruntime_outputs(model, feeds)["y"]
    got = runner.run(feeds)["y"]
    assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max())


def test_auto_builds_a_model_without_convs_once_in_the_plain_layout(tmp_path: Path) -> None:
    weight = np.random.default_rng(2).standard_normal((16, 24)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]),
                        helper.make_node("Relu", ["m"], ["out"])],
                       {"x": (4, 16)}, {"out": (4, 24)}, {"w": weight})
    manifest = build_with_layout(model, ConfigBook(), tmp_path)  # the default: auto
    assert "layout_choice" not in manifest and "layout" not in manifest
    runner = ModelRunner(model, KernelLibrary(tmp_path), 1)
    feeds = runner.random_feeds(3)
    np.testing.assert_allclose(runner.run(feeds)["out"],
                               onnxruntime_outputs(model, feeds)["out"], rtol=1e-5, atol=1e-5)


# -- tuned configs in each layout ------------------------------------------------------------

def _tuned_book(model: Any, layout: str) -> ConfigBook:
    """A tuned config (not the template default) for every task ``tuner tune --layout
    LAYOUT`` would tune on this host."""
    from schedule_templates.templates.base import get_template
    from tuner_service.compiler.deploy.configs import TunedEntry
    from tuner_service.compiler.frontend.extract import extract_tasks

    entries = []
    for task in extract_tasks(model, layout=layout, block=host_block()).tasks:
        template = get_template(task.workload.op)
        space = template.space(task.workload)
        default = template.default_config(task.workload).index
        index = next(i for i in range(space.size - 1, -1, -1)
                     if i != default and space.is_valid(i))
        entries.append(TunedEntry(task.workload.key, template.name, template.version,
                                  space.get(index).to_json(), 1e-4, "llvm"))
    return ConfigBook(entries)


def _sources(manifest: dict[str, Any]) -> dict[str, str]:
    return {k["workload"]: k["config_source"] for k in manifest["kernels"]}


def test_a_blocked_build_uses_the_tuned_configs_of_its_blocked_workloads(
        tmp_path: Path) -> None:
    model = _model()
    book = _tuned_book(model, "nchwc")
    tuned = {e.workload: e.config for e in book.entries()}
    manifest = build_library(model, book, tmp_path / "blocked", layout="nchwc")
    assert set(_sources(manifest).values()) == {"tuned"}
    for kernel in manifest["kernels"]:
        assert kernel["op"].endswith("_nchwc")
        assert kernel["config"] == tuned[kernel["tuned_key"]]
    # the plain plan's layers are other workloads: the blocked records are not theirs
    plain = build_library(model, book, tmp_path / "plain", layout="nchw")
    assert set(_sources(plain).values()) == {"default"}
    runner = ModelRunner(model, KernelLibrary(tmp_path / "blocked"), 1)
    feeds = runner.random_feeds(4)
    want = onnxruntime_outputs(model, feeds)["out"]
    assert float(np.abs(runner.run(feeds)["out"] - want).max()) <= 1e-5 * float(
        np.abs(want).max())


def test_auto_with_plain_tuned_configs_still_times_the_blocked_plan(tmp_path: Path) -> None:
    model = _model()
    manifest = build_with_layout(model, _tuned_book(model, "nchw"), tmp_path, layout="auto")
    choice = manifest["layout_choice"]  # both were built and timed, not plain by fiat
    kernels = len(manifest["kernels"])
    assert (choice["nchw_tuned"], choice["nchwc_tuned"]) == (kernels, 0)
    # the kept library says which of its configs were tuned: all of the plain plan's, none
    # of the blocked one's, and a mixed plan's plain layers only (which plan wins is timed)
    sources = [k["config_source"] for k in manifest["kernels"]]
    if choice["chosen"] in ("nchw", "nchwc"):
        assert set(sources) == {"tuned" if choice["chosen"] == "nchw" else "default"}
    assert sources.count("tuned") == choice[f"{choice['chosen']}_tuned"]


def test_auto_with_both_layouts_tuned_keeps_tuned_configs_either_way(tmp_path: Path) -> None:
    model = _model()
    book = _tuned_book(model, "auto")
    manifest = build_with_layout(model, book, tmp_path, layout="auto")
    choice = manifest["layout_choice"]
    kernels = len(manifest["kernels"])
    assert choice["nchw_tuned"] == choice["nchwc_tuned"] == kernels
    assert set(_sources(manifest).values()) == {"tuned"}
    mode = manifest.get("layout", {"mode": "nchw"})["mode"]
    assert mode == ("nchw" if choice["chosen"] == "nchw" else "nchwc")  # or a mixed plan


def test_keeping_a_faster_plan_with_fewer_tuned_kernels_is_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from tuner_service.compiler.deploy import layout_choice

    monkeypatch.setattr(layout_choice, "_time_libraries",
                        lambda *_: {"nchw": 2e-3, "nchwc": 1e-3})
    model = _model()
    with caplog.at_level(logging.WARNING, logger="tuner_service.compiler.deploy"):
        manifest = build_with_layout(model, _tuned_book(model, "nchw"), tmp_path)
    assert manifest["layout_choice"]["chosen"] == "nchwc"
    assert set(_sources(manifest).values()) == {"default"}
    assert "layout auto kept nchwc" in caplog.text and "tuner tune --layout nchwc" in caplog.text
