"""Grouped convolutions on blocked activations in a model library: a RegNet-style block (1x1,
grouped 3x3 with groups of 8 channels, squeeze-excite, 1x1 with a shortcut) runs blocked from
end to end, its grouped layer a ``group_conv2d_nchwc`` kernel with no layout transform around
it; groups that do not meet block boundaries stay NCHW. Outputs equal onnxruntime's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import make_model, onnxruntime_outputs
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.layout import host_block
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.extract import extract_tasks


def regnet_block(width: int, group_width: int) -> Any:
    """x (24 channels) -> 1x1 to ``width`` + relu -> grouped 3x3 stride 2 + relu -> SE ->
    1x1 + a strided 1x1 shortcut of x -> add -> relu; odd spatial sizes."""
    rng = np.random.default_rng(4)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    groups = width // group_width
    squeeze = max(1, width // 4)
    nodes = [
        helper.make_node("Conv", ["x", "wa", "ba"], ["a"]),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["ar", "wb", "bb"], ["b"], group=groups, strides=[2, 2],
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["br"]),
        helper.make_node("GlobalAveragePool", ["br"], ["se.p"]),
        helper.make_node("Conv", ["se.p", "ws1", "bs1"], ["se.1"]),
        helper.make_node("Relu", ["se.1"], ["se.r"]),
        helper.make_node("Conv", ["se.r", "ws2", "bs2"], ["se.2"]),
        helper.make_node("Sigmoid", ["se.2"], ["se.s"]),
        helper.make_node("Mul", ["br", "se.s"], ["se"]),
        helper.make_node("Conv", ["se", "wc", "bc"], ["c"]),
        helper.make_node("Conv", ["x", "wd"], ["d"], strides=[2, 2]),
        helper.make_node("Add", ["c", "d"], ["sum"]),
        helper.make_node("Relu", ["sum"], ["y"]),
    ]
    weights = {"wa": w(width, 24, 1, 1), "ba": w(width),
               "wb": w(width, group_width, 3, 3), "bb": w(width),
               "ws1": w(squeeze, width, 1, 1), "bs1": w(squeeze),
               "ws2": w(width, squeeze, 1, 1), "bs2": w(width),
               "wc": w(width, width, 1, 1), "bc": w(width), "wd": w(width, 24, 1, 1)}
    return make_model(nodes, {"x": (1, 24, 13, 15)}, {"y": (1, width, 7, 8)}, weights)


def _check(model: Any, out: Path, threads: int) -> dict[str, Any]:
    manifest = build_library(model, ConfigBook(), out, layout="nchwc")
    runner = ModelRunner(model, KernelLibrary(out), threads)
    feeds = runner.random_feeds(2)
    want = onnxruntime_outputs(model, feeds)
    for got in (runner.run(feeds), runner.run(feeds, native=False)):
        scale = float(np.abs(want["y"]).max())
        assert float(np.abs(got["y"] - want["y"]).max()) <= 1e-5 * scale
    return manifest


def _transforms(manifest: dict[str, Any]) -> list[str]:
    return [g["op"]["kind"] for g in manifest["generated"]
            if g["op"]["kind"] in ("to_nchwc", "from_nchwc")]


@pytest.mark.parametrize("threads", [1, 2])
def test_narrow_groups_run_blocked_without_transforms(tmp_path: Path, threads: int) -> None:
    if host_block() < 8:
        pytest.skip("blocks of 8 channels or more hold whole groups of 8")
    manifest = _check(regnet_block(48, 8), tmp_path, threads)
    grouped = [k["workload"] for k in manifest["kernels"] if "groups=" in k["workload"]]
    assert grouped and all(key.startswith("group_conv2d_nchwc:") for key in grouped)
    assert _transforms(manifest) == ["to_nchwc", "from_nchwc"]  # the model's input and output


def test_groups_across_blocks_stay_plain(tmp_path: Path) -> None:
    """Groups of 12 channels never meet blocks of 8 or 16: the grouped layer stays NCHW, read
    and written through transforms."""
    manifest = _check(regnet_block(48, 12), tmp_path, 1)
    grouped = [k["workload"] for k in manifest["kernels"] if "groups=" in k["workload"]]
    assert grouped and all(key.startswith("group_conv2d:") for key in grouped)
    assert len(_transforms(manifest)) > 2


def test_blocked_plan_tasks_name_the_blocked_grouped_operator() -> None:
    if host_block() < 8:
        pytest.skip("blocks of 8 channels or more hold whole groups of 8")
    tasks = extract_tasks(regnet_block(48, 8), layout="auto", block=host_block()).tasks
    keys = [t.workload.key for t in tasks]
    (plain,) = [k for k in keys if k.startswith("group_conv2d:")]
    (twin,) = [k for k in keys if k.startswith("group_conv2d_nchwc:")]
    assert keys.index(twin) == keys.index(plain) + 1
    assert f"block={host_block()}" in twin and twin.replace("_nchwc", "", 1).startswith(
        plain.partition(",epilogue")[0].partition(",groups")[0])
