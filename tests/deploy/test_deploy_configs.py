"""A tuned config serves every fused variant of its base workload; the thread count configs were
tuned at travels with them into the library, is its default, and a mismatch is a warning."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tests.deploy.conftest import make_model
from tuner_service.cli.main import main
from tuner_service.compiler.deploy.configs import ConfigBook, TunedEntry, load_configs_file
from tuner_service.compiler.deploy.errors import ConfigSourceError
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.frontend.fusion import plan_layers
from tuner_service.compiler.frontend.loading import load_model

BASE = "conv2d:N=1,C=8,H=6,W=6,K=8,R=3,S=3,pad=1"


def three_variants() -> Any:
    """The same 3x3 conv three times with different fused epilogues: Relu; bias + residual +
    Relu; bias alone."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv_relu", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv_residual",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s2"], name="add"),
        helper.make_node("Relu", ["s2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="conv_bias",
                         pads=[1, 1, 1, 1]),
    ]
    weights = {f"w{i}": rng.standard_normal((8, 8, 3, 3)).astype(np.float32) for i in (1, 2, 3)}
    weights.update({f"b{i}": rng.standard_normal(8).astype(np.float32) for i in (2, 3)})
    return make_model(nodes, {"x": (1, 8, 6, 6)}, {"y": (1, 8, 6, 6)}, weights)


def layer_keys(model: Any) -> dict[str, str]:
    return {layer.nodes[0]: layer.workload.key for layer in plan_layers(load_model(model))}


def entry(key: str, index: int, cost: float, threads: int | None = None) -> TunedEntry:
    workload = parse_workload(key)
    template = get_template(workload.op)
    return TunedEntry(workload.key, template.name, template.version,
                      template.space(workload).get(index).to_json(), cost, "llvm", threads)


def valid_indices(key: str, count: int) -> list[int]:
    workload = parse_workload(key)
    template = get_template(workload.op)
    space = template.space(workload)
    default = template.default_config(workload).index
    found = [i for i in range(0, space.size, 7) if space.is_valid(i) and i != default]
    return found[:count]


def test_the_three_layers_are_distinct_fused_variants_of_one_base() -> None:
    keys = layer_keys(three_variants())
    assert len(set(keys.values())) == 3
    assert {parse_workload(k).base_key for k in keys.values()} == {BASE}


def test_a_config_tuned_for_one_variant_serves_every_variant(tmp_path: Path) -> None:
    keys = layer_keys(three_variants())
    [index] = valid_indices(BASE, 1)
    book = ConfigBook([entry(keys["conv_residual"], index, 1e-4)])
    manifest = build_library(three_variants(), book, tmp_path)
    assert len(manifest["kernels"]) == 3
    for kernel in manifest["kernels"]:
        assert kernel["config_source"] == "tuned", kernel["workload"]
        assert kernel["config"]["index"] == index
        assert kernel["tuned_key"] == keys["conv_residual"]


def test_the_exact_key_wins_then_the_base_then_the_fastest_sibling() -> None:
    keys = layer_keys(three_variants())
    exact, base, fast, slow = valid_indices(BASE, 4)
    template = get_template("conv2d")
    relu = parse_workload(keys["conv_relu"])
    siblings = [entry(keys["conv_residual"], slow, 3e-4), entry(keys["conv_bias"], fast, 1e-4)]
    book = ConfigBook(siblings)
    choice = book.choose(relu, template)
    assert choice is not None and (choice.config.index, choice.tuned_key) == (
        fast, keys["conv_bias"])
    book.add(entry(BASE, base, 9e-4))
    choice = book.choose(relu, template)
    assert choice is not None and choice.config.index == base
    book.add(entry(keys["conv_relu"], exact, 5e-4))
    choice = book.choose(relu, template)
    assert choice is not None and choice.config.index == exact


def test_a_sibling_of_another_shape_is_not_used() -> None:
    [index] = valid_indices(BASE, 1)
    other = BASE.replace("K=8", "K=16")
    book = ConfigBook([entry(other, 0, 1e-4)])
    assert book.choose(parse_workload(BASE), get_template("conv2d")) is None
    assert index >= 0


def _fetch_document(tmp_path: Path, threads: int | None, per_entry: int | None = None) -> Path:
    [index] = valid_indices(BASE, 1)
    e = entry(BASE, index, 1e-4)
    task = {"workload": e.workload, "template": e.template,
            "template_version": e.template_version, "config": e.config,
            "best_latency_s": e.mean_cost}
    if per_entry is not None:
        task["threads"] = per_entry
    document: dict[str, Any] = {"job_id": 1, "tasks": [task]}
    if threads is not None:
        document["threads"] = threads
    path = tmp_path / "configs.json"
    path.write_text(json.dumps(document))
    return path


def test_thread_count_travels_with_the_configs_into_the_manifest(tmp_path: Path) -> None:
    book = load_configs_file(_fetch_document(tmp_path, threads=2))
    assert book.threads == 2
    manifest = build_library(three_variants(), book, tmp_path / "lib")
    assert manifest["threads"] == 2 and manifest["tuned_threads"] == 2
    assert {k["tuned_threads"] for k in manifest["kernels"]} == {2}
    per_entry = load_configs_file(_fetch_document(tmp_path, threads=None, per_entry=3))
    assert per_entry.threads == 3
    unknown = load_configs_file(_fetch_document(tmp_path, threads=None))
    assert unknown.threads is None
    assert build_library(three_variants(), unknown, tmp_path / "lib1")["threads"] == 1


def test_another_thread_count_than_the_tuned_one_is_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    book = load_configs_file(_fetch_document(tmp_path, threads=2))
    with caplog.at_level(logging.WARNING, logger="tuner_service.compiler.deploy"):
        manifest = build_library(three_variants(), book, tmp_path / "lib", threads=1)
    assert manifest["threads"] == 1 and manifest["tuned_threads"] == 2
    assert "tuned at 2 thread(s)" in caplog.text


@pytest.mark.parametrize("bad", [0, -1, "2", 1.5, True])
def test_a_bad_thread_count_in_a_configs_file_is_refused(tmp_path: Path, bad: Any) -> None:
    path = _fetch_document(tmp_path, threads=None)
    document = json.loads(path.read_text())
    document["threads"] = bad
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigSourceError, match="threads must be a whole number"):
        load_configs_file(path)


def test_build_and_run_default_to_the_tuned_thread_count(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tuner run sets it; restore it afterwards
    model = tmp_path / "model.onnx"
    model.write_bytes(three_variants().SerializeToString())
    configs = _fetch_document(tmp_path, threads=2)
    out = tmp_path / "lib"
    # the plain layout: the configs are for its conv2d layers (auto may keep the blocked plan)
    assert main(["build", str(model), "--configs", str(configs), "-o", str(out), "--json",
                 "--layout", "nchw"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["threads"] == 2 and summary["tuned_threads"] == 2
    assert summary["tuned"] == summary["kernels"] == 3
    assert main(["run", str(model), "--library", str(out), "--iterations", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["threads"] == 2


def test_run_at_another_thread_count_than_the_tuned_one_warns(
        caplog: pytest.LogCaptureFixture) -> None:
    from tuner_service.cli.deploy import _run_threads

    manifest = {"threads": 2, "tuned_threads": 2}
    with caplog.at_level(logging.WARNING, logger="tuner_service.cli"):
        assert _run_threads(manifest, None) == 2
        assert not caplog.text
        assert _run_threads(manifest, 1) == 1
    assert "tuned at 2 thread(s); running at 1" in caplog.text


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_block"])
def test_a_tuned_config_per_extracted_task_covers_every_layer(name: str) -> None:
    """A job tunes one workload per task (its most frequent fused variant): with a config for
    each task, every layer of the build finds one (the quick start's 12 of 19 before)."""
    from tuner_service.compiler.deploy.library import fallback_keys
    from tuner_service.compiler.frontend.extract import extract_tasks
    from tuner_service.compiler.frontend.samples import build_sample_model

    model = build_sample_model(name)
    entries = []
    for task in extract_tasks(model.SerializeToString()).tasks:
        template = get_template(task.workload.op)
        config = template.default_config(task.workload)
        entries.append(TunedEntry(task.workload.key, template.name, template.version,
                                  config.to_json(), 1e-4, "llvm"))
    book = ConfigBook(entries)
    layers = plan_layers(load_model(model))
    missing = [layer.workload.key for layer in layers
               if book.choose(layer.workload, get_template(layer.workload.op),
                              fallback_keys(layer.workload)) is None]
    assert not missing, missing
