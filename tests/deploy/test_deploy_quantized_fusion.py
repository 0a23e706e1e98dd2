"""Quantized models with fewer passes and the same bytes: a bias addition fused into the
``dense_int8`` layer before it (``frontend.quantized_bias``). Each model runs both ways (the
rewrite switched off) and must give identical outputs, its 8-bit tensors too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import pytest

from tests.frontend.quantized_models import feeds, quantized
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.int8_glue import QuantGlueStep
from tuner_service.compiler.deploy.int8_step import Int8KernelStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend import quantized_bias

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _runner(model: Path, out: Path) -> ModelRunner:
    build_library(model, ConfigBook(), out)
    return ModelRunner(model, KernelLibrary(out))


def _with_bias_output(model: Path) -> tuple[Path, str]:
    """The model with the bias addition's 8-bit output as a graph output too."""
    proto = onnx.load(model)
    name = next(n.output[0] for n in proto.graph.node
                if n.op_type == "QuantizeLinear" and n.input[0] == "a")
    proto.graph.output.append(onnx.helper.make_tensor_value_info(
        name, onnx.TensorProto.UINT8, [1, 32]))
    path = model.with_name(f"{model.stem}-bias-out.onnx")
    onnx.save(proto, path)
    return path, name


def _glue(runner: ModelRunner) -> list[str]:
    return [s.node.op_type for s in runner.steps if isinstance(s, QuantGlueStep)]


@pytest.mark.parametrize("residual", [False, True])
def test_bias_add_fused_into_the_dense_layer_gives_the_unfused_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, residual: bool) -> None:
    model, bias_out = _with_bias_output(quantized(tmp_path, "qdq", residual=residual))
    fused = _runner(model, tmp_path / "fused")
    mm = next(s for s in fused.steps if isinstance(s, Int8KernelStep) and s.layer == "mm")
    assert mm.kernel.workload.key == "dense_int8:M=1,N=32,K=256,add=u8"
    assert "Int8Add" not in _glue(fused) or residual  # a residual addition has no layer
    assert list(mm.outputs) == [bias_out]

    monkeypatch.setattr(quantized_bias, "fused_bias_adds", lambda view: iter(()))
    plain = _runner(model, tmp_path / "plain")
    assert _glue(plain).count("Int8Add") == _glue(fused).count("Int8Add") + 1
    for seed in (0, 1, 2, 3):
        x = feeds(seed)
        got, want = fused.run(x), plain.run(x)
        assert got[bias_out].dtype == np.uint8 and len(np.unique(got[bias_out])) > 4
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(fused.run(x, native=False)[bias_out], got[bias_out])
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = feeds(5)
    np.testing.assert_array_equal(fused.run(x)[bias_out], session.run([bias_out], x)[0])
