"""``tuner build`` output: the manifest, deduplicated kernels, config lookup and fallbacks, the
checks at load time, and clear errors for operators the runner cannot execute."""

from __future__ import annotations

import ctypes
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tests.deploy.conftest import assert_close, make_model, onnxruntime_outputs
from tuner_service.compiler.deploy.configs import ConfigBook, TunedEntry, load_configs_file
from tuner_service.compiler.deploy.errors import LibraryError, UnsupportedOperatorError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary

CONV_KEY = "conv2d:N=1,C=8,H=8,W=8,K=16,R=3,S=3,pad=1"


def two_convs(names: tuple[str, str] = ("conv_a", "conv_b")) -> Any:
    """Two identical convolutions (one kernel after dedupe) feeding a Concat."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a"], name=names[0], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "wb"], ["b"], name=names[1], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "b"], ["y"], name="concat", axis=1),
    ]
    weights = {n: rng.standard_normal((16, 8, 3, 3)).astype(np.float32) for n in ("wa", "wb")}
    return make_model(nodes, {"x": (1, 8, 8, 8)}, {"y": (1, 32, 8, 8)}, weights)


def tuned_book(key: str = CONV_KEY, index: int | None = None) -> tuple[ConfigBook, int]:
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    default = template.default_config(workload).index
    chosen = index if index is not None else next(
        i for i in range(space.size) if space.is_valid(i) and i != default)
    entry = TunedEntry(workload.key, template.name, template.version,
                       space.get(chosen).to_json(), 1e-4, "llvm")
    return ConfigBook([entry]), chosen


def test_manifest_describes_every_kernel_and_layer(tmp_path: Path) -> None:
    book, index = tuned_book()
    manifest = build_library(two_convs(), book, tmp_path, threads=2)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert manifest["format_version"] == 1 and manifest["threads"] == 2
    assert manifest["host"]["cpu"] and manifest["host"]["features"]
    assert [layer["name"] for layer in manifest["layers"]] == ["conv_a", "conv_b"]
    (kernel,) = manifest["kernels"]  # two identical layers share one kernel
    assert kernel["workload"] == CONV_KEY
    assert kernel["template"] == "conv2d.x86" and kernel["template_version"] >= 1
    assert kernel["config"]["index"] == index and kernel["config_source"] == "tuned"
    assert kernel["layers"] == ["conv_a", "conv_b"]
    roles = [(a["name"], a["role"]) for a in kernel["args"]]
    assert roles[0] == ("data", "input") and ("out", "output") in roles
    assert roles[-1][1] == "workspace"  # the zero-bordered copy for padding
    assert kernel["workspace_bytes"] == 4 * kernel["args"][-1]["elements"]
    lib = ctypes.CDLL(str(tmp_path / manifest["library"]))
    assert getattr(lib, kernel["symbol"])  # exported with the manifest's name


def test_missing_config_falls_back_to_default_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tuner_service.compiler.deploy")
    manifest = build_library(two_convs(("first", "second")), ConfigBook(), tmp_path)
    (kernel,) = manifest["kernels"]
    template = get_template("conv2d")
    assert kernel["config_source"] == "default"
    assert kernel["config"]["index"] == template.default_config(parse_workload(CONV_KEY)).index
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "first" in warned and "second" in warned and "default" in warned


def test_a_config_of_another_template_version_is_not_used(tmp_path: Path) -> None:
    book, _ = tuned_book()
    (entry,) = book.entries()
    stale = ConfigBook([TunedEntry(entry.workload, entry.template, entry.template_version + 1,
                                   entry.config, entry.mean_cost)])
    manifest = build_library(two_convs(), stale, tmp_path)
    assert manifest["kernels"][0]["config_source"] == "default"


def test_fused_workloads_use_the_base_workloads_records() -> None:
    workload = parse_workload(CONV_KEY)
    if not hasattr(workload, "with_epilogue"):
        pytest.skip("this tree has no fused epilogues")
    from schedule_templates.workloads.epilogue import parse_epilogue

    fused = workload.with_epilogue(parse_epilogue("bias+relu"))
    book, index = tuned_book()
    from tuner_service.compiler.deploy.library import fallback_keys

    choice = book.choose(fused, get_template("conv2d"), fallback_keys(fused))
    assert choice is not None and choice.config.index == index
    assert choice.tuned_key == CONV_KEY


@pytest.mark.parametrize("form", ["fetch", "log", "records", "autotvm"])
def test_configs_files_in_every_published_format(tmp_path: Path, form: str) -> None:
    book, index = tuned_book()
    (e,) = book.entries()
    slow = {**e.__dict__, "mean_cost": 1.0, "config": {"index": 0}}
    rows = [e.__dict__, slow]
    if form == "fetch":
        text = json.dumps({"job_id": 1, "tasks": [
            {"workload": r["workload"], "template": r["template"],
             "template_version": r["template_version"], "config": r["config"],
             "best_latency_s": r["mean_cost"]} for r in rows]})
    elif form == "log":
        text = json.dumps(rows)
    elif form == "records":
        text = "\n".join(json.dumps({**r, "result": {"costs": [r["mean_cost"]],
                                                     "error_kind": 0}}) for r in rows)
    else:
        text = "\n".join(json.dumps({"input": ["llvm", r["template"], [r["workload"]], {}],
                                     "config": r["config"],
                                     "result": [[r["mean_cost"]], 0, 1.0, 0]}) for r in rows)
    path = tmp_path / "configs.json"
    path.write_text(text)
    loaded = load_configs_file(path)
    choice = loaded.choose(parse_workload(CONV_KEY), get_template("conv2d"))
    assert choice is not None and choice.config.index == index  # the faster one wins


def test_operator_nobody_implements_is_refused_naming_operator_and_node(
        tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="fine"),
             helper.make_node("Frobnicate", ["r"], ["y"], name="the_frob", domain="com.example")]
    graph = helper.make_graph(
        nodes, "custom", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    build_library(model, ConfigBook(), tmp_path)
    with pytest.raises(UnsupportedOperatorError,
                       match=r"Frobnicate.*the_frob.*com\.example.*reference evaluator"):
        ModelRunner(model, KernelLibrary(tmp_path))


def test_attribute_our_numpy_refuses_moves_the_node_to_the_reference_evaluator(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="wrap_pad", mode="wrap")
    model = make_model([node], {"x": (2, 3)}, {"y": None},
                       {"pads": np.array([1, 1, 1, 1], np.int64)}, opset=19)
    build_library(model, ConfigBook(), tmp_path)
    runner = ModelRunner(model, KernelLibrary(tmp_path))
    feeds = runner.random_feeds()
    with caplog.at_level("WARNING"):
        got = runner.run(feeds)
    assert "Pad" in caplog.text and "wrap_pad" in caplog.text and "wrap" in caplog.text
    assert_close(got, onnxruntime_outputs(model, feeds), rtol=1e-6)
    assert [row["op"] for row in runner.fallback_report()] == ["Pad"]


def test_library_of_another_model_is_refused(tmp_path: Path) -> None:
    build_library(two_convs(), ConfigBook(), tmp_path)
    other = two_convs(("renamed_a", "renamed_b"))
    with pytest.raises(LibraryError, match="another model"):
        ModelRunner(other, KernelLibrary(tmp_path))


def test_missing_or_foreign_manifest_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LibraryError, match=r"manifest\.json is missing"):
        KernelLibrary(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(LibraryError, match="format version 99"):
        KernelLibrary(tmp_path)


def test_winograd_and_direct_layers_share_one_scratch_arena(tmp_path: Path) -> None:
    """A 3x3 conv tuned to Winograd, a padded direct conv of another size and a second Winograd
    layer run in one model: all carve their workspaces from one arena, and a second run with
    other inputs is still right (no layer depends on what another left in the scratch)."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="wino_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"], name="relu"),
        helper.make_node("Conv", ["ar", "w2"], ["b"], name="direct_s2", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Conv", ["b", "w3"], ["y"], name="wino_b", pads=[1, 1, 1, 1]),
    ]
    shapes = {"w1": (16, 8, 3, 3), "w2": (16, 16, 3, 3), "w3": (8, 16, 3, 3)}
    weights = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    model = make_model(nodes, {"x": (1, 8, 12, 12)}, {"y": (1, 8, 6, 6)}, weights)
    entries = []
    for key, algorithm in (("conv2d:N=1,C=8,H=12,W=12,K=16,R=3,S=3,pad=1", "winograd4"),
                           ("conv2d:N=1,C=16,H=6,W=6,K=8,R=3,S=3,pad=1", "winograd2")):
        workload = parse_workload(key)
        template = get_template(workload.op)
        default = dict((n, v) for n, _, v in template.default_config(workload).entities)
        config = template.space(workload).from_entities(dict(default, algorithm=algorithm))
        entries.append(TunedEntry(workload.key, template.name, template.version,
                                  config.to_json(), 1e-4, "llvm"))
    manifest = build_library(model, ConfigBook(entries), tmp_path)
    assert sorted(k["config_source"] for k in manifest["kernels"]) == [
        "default", "tuned", "tuned"]
    runner = ModelRunner(model, KernelLibrary(tmp_path), threads=2)
    arena_bytes = 4 * runner.scratch.buffer.size
    assert arena_bytes >= max(k["workspace_bytes"] for k in manifest["kernels"]) > 0
    for seed in (0, 1):
        feeds = runner.random_feeds(seed)
        assert_close(runner.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-4)
