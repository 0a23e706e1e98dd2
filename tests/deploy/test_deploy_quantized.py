"""Quantized models run by ``tuner build`` + ``tuner run`` match onnxruntime: int8 tensors
exactly (with 7-bit weights, where onnxruntime's own AVX2 kernel is exact too), fp32 outputs
to within one output quantization step."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.frontend.quantized_models import feeds, quantized
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _runner(model: Path, out: Path) -> ModelRunner:
    build_library(model, ConfigBook(), out)
    return ModelRunner(model, KernelLibrary(out))


def _quantized_tensors(model: Path) -> list[str]:
    """Every uint8 tensor the model computes (QuantizeLinear / QLinear* outputs)."""
    proto = onnx.shape_inference.infer_shapes(onnx.load(model))
    return [v.name for v in proto.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.UINT8]


@pytest.mark.parametrize("form", ["qdq", "qoperator", "dynamic"])
def test_quantized_model_matches_onnxruntime(tmp_path: Path, form: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    model = quantized(tmp_path, form)
    with caplog.at_level(logging.WARNING):
        runner = _runner(model, tmp_path / "lib")
    assert "int8 reference" in caplog.text  # the numpy int8 steps are reported
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for seed in (11, 12, 13):
        x = feeds(seed)
        want = session.run(None, x)[0]
        got = runner.run(x)["y"]
        assert got.dtype == want.dtype == np.float32
        # int8 layers are exact; the fp32 output is the last dequantized int8 tensor, so
        # equal int8 results give equal outputs (dynamic: fp32 scales of runtime ranges)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_int8_tensors_match_onnxruntime_exactly(tmp_path: Path) -> None:
    """Every intermediate uint8 tensor of the QOperator model, not only the output."""
    model = quantized(tmp_path, "qoperator")
    names = _quantized_tensors(model)
    assert len(names) >= 3
    proto = onnx.load(model)
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    runner = _runner(model, tmp_path / "lib")
    x = feeds(5)
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, x),
                    strict=True))
    env = {**runner.constants, **x}
    for step in runner.steps:
        step(env)
    for name in names:
        assert env[name].dtype == np.uint8
        np.testing.assert_array_equal(env[name], want[name], err_msg=name)


def test_full_range_weights_stay_within_onnxruntime_saturation(tmp_path: Path) -> None:
    """8-bit weights: our integer results are exact; onnxruntime's AVX2 kernel saturates pairs
    of products in int16 on hosts without VNNI, so compare with its exact (VNNI-free)
    computation: the DequantizeLinear -> fp32 model within one output step."""
    model = quantized(tmp_path, "qdq", reduce_range=False)
    runner = _runner(model, tmp_path / "lib")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    y_scale = next(float(onnx.numpy_helper.to_array(t)) for t in onnx.load(model).graph.initializer
                   if t.name == "y_scale")
    for seed in (1, 2):
        x = feeds(seed)
        diff = np.abs(runner.run(x)["y"] - session.run(None, x)[0])
        assert diff.max() <= 2 * y_scale + 1e-6
