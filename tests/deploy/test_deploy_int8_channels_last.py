"""Channels-last int8 activations between int8 convolutions (``frontend.quantized_layout``,
built with ``--layout nchwc``): which tensors the plan lays out, the same bytes as the NCHW
plan on every output (native and Python paths), onnxruntime's bytes, and a manifest that names
an int8 layout the runner does not know refused with a clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from schedule_templates.workloads import parse_workload
from tests.frontend.quantized_models import feeds, quantized
from tuner_service.compiler.deploy import library
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.int8_step import Int8KernelStep
from tuner_service.compiler.deploy.layout_choice import _blocks_anything
from tuner_service.compiler.deploy.library import MANIFEST_FILE, build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.extract import extract_tasks
from tuner_service.compiler.frontend.layout_plans import plan_indices
from tuner_service.compiler.frontend.loading import load_model
from tuner_service.compiler.frontend.quantized_layout import plan_channels_last
from tuner_service.compiler.frontend.quantized_ops import int8_layer_workload

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


@pytest.fixture(autouse=True)
def _any_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plan channels-last whatever this host multiplies with (on AMX or vpmaddwd hosts the
    build would not choose it, but the kernels are exact there too)."""
    monkeypatch.setattr(library, "int8_channels_last", lambda proto: True)


def _layouts(proto: onnx.ModelProto) -> dict[str, tuple[str, str, str]]:
    return {node.name: (w.in_layout, w.out_layout, w.residual_layout)
            for node in proto.graph.node if node.op_type == "Int8Layer"
            and (w := int8_layer_workload(node)).op == "conv2d_int8"}  # type: ignore[attr-defined]


def test_the_plan_lays_out_what_only_convolutions_read(tmp_path: Path) -> None:
    """The residual sample: the stem's output feeds the 3x3 layer and the 1x1 shortcut (both
    read it channels-last, the stem writes it so from its NCHW image), the shortcut's output is
    only added by the 3x3 layer (channels-last), and the block's output goes to a Flatten
    (NCHW). With a MaxPool after the stem, the stem's output stays NCHW."""
    proto = load_model(quantized(tmp_path, "qdq", residual=True))
    assert plan_channels_last(proto) == 2
    assert _layouts(proto) == {"conv1": ("nchw", "nhwc", "nchw"),
                               "conv2": ("nhwc", "nchw", "nhwc"),
                               "shortcut": ("nhwc", "nhwc", "nchw")}
    again = _layouts(proto)
    plan_channels_last(proto)  # the load-time pass on a planned graph changes nothing
    assert _layouts(proto) == again

    pooled = load_model(quantized(tmp_path, "qdq", residual=True, pool=True))
    plan_channels_last(pooled)
    assert _layouts(pooled)["conv1"] == ("nchw", "nchw", "nchw")
    assert _layouts(pooled)["shortcut"] == ("nchw", "nhwc", "nchw")


def test_channels_last_build_gives_the_nchw_bytes(tmp_path: Path) -> None:
    model = onnx.load(quantized(tmp_path, "qdq", residual=True))
    inner = next(n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"
                 and n.input[0] == "c3")  # the shortcut's channels-last output, made visible
    model.graph.output.append(onnx.helper.make_tensor_value_info(
        inner, onnx.TensorProto.UINT8, [1, 16, 4, 4]))
    path = tmp_path / "residual-inner.onnx"
    onnx.save(model, path)
    manifest = build_library(path, ConfigBook(), tmp_path / "laid", layout="nchwc")
    assert manifest["layout"]["int8"] == "nhwc" and _blocks_anything(manifest)
    laid = ModelRunner(path, KernelLibrary(tmp_path / "laid"))
    build_library(path, ConfigBook(), tmp_path / "plain", layout="nchw")
    plain = ModelRunner(path, KernelLibrary(tmp_path / "plain"))
    keys = [s.kernel.workload.key for s in laid.steps if isinstance(s, Int8KernelStep)]
    assert any("in_layout=nhwc" in key for key in keys)
    assert all("layout" not in s.kernel.workload.key for s in plain.steps
               if isinstance(s, Int8KernelStep))
    for seed in range(4):
        x = feeds(seed)
        got, want = laid.run(x), plain.run(x)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        python = laid.run(x, native=False)
        for name in want:
            np.testing.assert_array_equal(python[name], want[name], err_msg=name)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = feeds(7)
    np.testing.assert_array_equal(laid.run(x)["y"], session.run(["y"], x)[0])


def test_an_unknown_int8_layout_in_the_manifest_is_refused(tmp_path: Path) -> None:
    path = quantized(tmp_path, "qdq", residual=True)
    build_library(path, ConfigBook(), tmp_path / "lib", layout="nchwc")
    manifest_path = tmp_path / "lib" / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    manifest["layout"]["int8"] = "nc4hw4"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(LibraryError, match=r"unknown int8 layout 'nc4hw4'.*rebuild"):
        ModelRunner(path, KernelLibrary(tmp_path / "lib"))


def test_a_channels_last_library_loaded_without_the_plan_is_refused(tmp_path: Path) -> None:
    """A manifest whose int8 entry was dropped would run channels-last kernels on NCHW
    tensors: the kernels' workloads no longer match the layers, which is refused."""
    path = quantized(tmp_path, "qdq", residual=True)
    build_library(path, ConfigBook(), tmp_path / "lib", layout="nchwc")
    manifest_path = tmp_path / "lib" / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    del manifest["layout"]["int8"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(LibraryError, match="rebuild"):
        ModelRunner(path, KernelLibrary(tmp_path / "lib"))


def test_tasks_of_a_blocked_plan_carry_the_int8_layouts(tmp_path: Path) -> None:
    """``tuner tune --layout nchwc`` tunes the channels-last workloads the build runs; ``auto``
    both plans' (each int8 convolution and its channels-last twin), which an estimate counts
    as two plans, not one sum."""
    path = quantized(tmp_path, "qdq", residual=True)
    plain = [t.workload.key for t in extract_tasks(path).tasks]
    laid = [t.workload.key for t in extract_tasks(path, layout="nchwc", block=16).tasks]
    both = [t.workload.key for t in extract_tasks(path, layout="auto", block=16).tasks]
    assert not any("layout=nhwc" in key for key in plain)
    convs = [key for key in laid if key.startswith("conv2d_int8")]
    assert len(convs) == 3 and all("layout=nhwc" in key for key in convs)
    assert set(both) == set(plain) | set(laid)
    # machines of block 8 (AVX2: no VNNI) never plan channels-last int8: no twins to tune
    assert [t.workload.key for t in extract_tasks(path, layout="auto", block=8).tasks
            if t.workload.op == "conv2d_int8"] == [k for k in plain if "conv2d_int8" in k]
    plans = plan_indices(both)
    assert len(plans) == 2
    assert {both[i] for i in plans[0]} == set(plain)
    assert {both[i] for i in plans[1]} == set(laid)
    workloads = {key: parse_workload(key) for key in laid}
    built = build_library(path, ConfigBook(), tmp_path / "lib", layout="nchwc")
    assert {k["workload"] for k in built["int8_kernels"] if "workload" in k
            and k["workload"].startswith("conv2d_int8")} == {
        key for key, w in workloads.items() if w.op == "conv2d_int8"}

