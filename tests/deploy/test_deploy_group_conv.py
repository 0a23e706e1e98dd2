"""Grouped and 1-D convolutions in a built library: they become group_conv2d / conv2d kernels
(not numpy steps), with their epilogues fused, and the model matches onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tests.deploy.conftest import RunModel, assert_close, make_model
from tuner_service.compiler.deploy.configs import ConfigBook, TunedEntry

RNG = np.random.default_rng(11)


def _w(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _conv_bn(x: str, name: str, cin: int, cout: int, kernel: int, out: str,
             **attrs: Any) -> tuple[list[Any], dict[str, np.ndarray]]:
    group = attrs.get("group", 1)
    nodes = [
        helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.c"], name=name, **attrs),
        helper.make_node("BatchNormalization",
                         [f"{name}.c", *(f"{name}.bn.{k}" for k in "sbmv")], [out],
                         name=f"{name}.bn"),
    ]
    weights = {f"{name}.w": _w(cout, cin // group, kernel, kernel),
               f"{name}.bn.s": RNG.uniform(0.5, 1.5, cout).astype(np.float32),
               f"{name}.bn.b": _w(cout), f"{name}.bn.m": _w(cout),
               f"{name}.bn.v": RNG.uniform(0.5, 1.5, cout).astype(np.float32)}
    return nodes, weights


def resnext_block() -> Any:
    """1x1 -> grouped 3x3 stride 2 (8 groups of 4) -> 1x1, a strided 1x1 shortcut, add, relu;
    odd spatial sizes so the grouped layer's tiles do not divide evenly."""
    parts = [
        _conv_bn("x", "a", 16, 32, 1, "a.o"),
        ([helper.make_node("Relu", ["a.o"], ["a.r"], name="a.relu")], {}),
        _conv_bn("a.r", "b", 32, 32, 3, "b.o", group=8, strides=[2, 2], pads=[1, 1, 1, 1]),
        ([helper.make_node("Relu", ["b.o"], ["b.r"], name="b.relu")], {}),
        _conv_bn("b.r", "c", 32, 32, 1, "c.o"),
        _conv_bn("x", "short", 16, 32, 1, "s.o", strides=[2, 2]),
        ([helper.make_node("Add", ["c.o", "s.o"], ["sum"], name="add"),
          helper.make_node("Relu", ["sum"], ["y"], name="relu")], {}),
    ]
    nodes = [n for part, _ in parts for n in part]
    weights = {k: v for _, part in parts for k, v in part.items()}
    return make_model(nodes, {"x": (1, 16, 9, 11)}, {"y": (1, 32, 5, 6)}, weights)


def conv1d_stack() -> Any:
    """A grouped 1-D conv (bias, dilation, padding) with ReLU, then a plain strided one."""
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", group=4,
                         pads=[2, 2], dilations=[2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", strides=[2],
                         auto_pad="SAME_UPPER"),
    ]
    weights = {"w1": _w(24, 3, 3), "b1": _w(24), "w2": _w(16, 24, 5)}
    return make_model(nodes, {"x": (2, 12, 37)}, {"y": None}, weights)


def _manifest(tmp_path: Path) -> dict[str, Any]:
    (path,) = sorted(tmp_path.glob("lib*/manifest.json"))[-1:]
    return json.loads(path.read_text())


def _kernel_ops(manifest: dict[str, Any]) -> dict[str, str]:
    return {layer["name"]: layer["workload"] for layer in manifest["layers"]}


@pytest.mark.parametrize("threads", [1, 2])
def test_resnext_block_runs_grouped_kernel(run_model: RunModel, tmp_path: Path,
                                           threads: int) -> None:
    got, want = run_model(resnext_block(), threads=threads)
    assert_close(got, want, rtol=1e-4)
    layers = _kernel_ops(_manifest(tmp_path))
    assert layers["b"] == ("group_conv2d:N=1,C=32,H=9,W=11,K=32,R=3,S=3,stride=2,pad=1,"
                           "groups=8,epilogue=scale+bias+relu")
    assert len(layers) == 4  # every Conv is a kernel; nothing is left to numpy


def test_conv1d_layers_are_kernels(run_model: RunModel, tmp_path: Path) -> None:
    got, want = run_model(conv1d_stack())
    assert_close(got, want, rtol=1e-4)
    layers = _kernel_ops(_manifest(tmp_path))
    assert layers == {
        "conv1": "group_conv2d:N=2,C=12,H=1,W=37,K=24,R=1,S=3,pad=0x2x0x2,dilation=1x2,"
                 "groups=4,epilogue=bias+relu",
        "conv2": "conv2d:N=2,C=24,H=1,W=37,K=16,R=1,S=5,stride=1x2,pad=0x2x0x2",
    }


@pytest.mark.parametrize("vector", ["k", "w"])
def test_tuned_grouped_config_of_the_base_workload_is_used(run_model: RunModel,
                                                           tmp_path: Path, vector: str) -> None:
    """A config tuned for the unfused workload serves the fused layer, with either vector axis."""
    base = parse_workload("group_conv2d:N=1,C=32,H=9,W=11,K=32,R=3,S=3,stride=2,pad=1,groups=8")
    template = get_template(base.op)
    space = template.space(base)
    index = next(i for i in space.sample(200, np.random.default_rng(1))
                 if space.get(i)["vector"] == vector)
    entry = TunedEntry(workload=base.key, template=template.name,
                       template_version=template.version, config={"index": index},
                       mean_cost=1e-4)
    got, want = run_model(resnext_block(), book=ConfigBook([entry]))
    assert_close(got, want, rtol=1e-4)
    (kernel,) = [k for k in _manifest(tmp_path)["kernels"] if k["op"] == "group_conv2d"]
    assert kernel["config"]["index"] == index and kernel["config_source"] == "tuned"


def test_runtime_weight_is_not_packed_as_zeros(run_model: RunModel, tmp_path: Path) -> None:
    """A Conv whose weight is a graph input has no kernel (kernels pack constant weights)."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=2, pads=[1, 1, 1, 1])
    got, want = run_model(make_model([node], {"x": (1, 4, 6, 6), "w": (8, 2, 3, 3)},
                                     {"y": None}))
    assert_close(got, want, rtol=1e-4)
    assert _manifest(tmp_path)["layers"] == []
