"""Quantized models with fewer passes and the same bytes: a bias addition fused into the
``dense_int8`` layer before it (``frontend.quantized_bias``), a shortcut addition fused into
the ``conv2d_int8`` layer before it (``frontend.quantized_residual``), and 8-bit transposes on a
generated kernel inside the native program (``deploy.int8_glue``). Each model runs both ways
(the rewrite or kernel switched off) and must give identical outputs, its 8-bit tensors too;
an 8-bit MaxPool also against its fp32 evaluation between a DequantizeLinear and a
QuantizeLinear."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import pytest

from tests.frontend.quantized_models import feeds, quantized
from tuner_service.compiler.deploy import int8_glue
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.executor import ModelRunner, NumpyStep
from tuner_service.compiler.deploy.int8_glue import QuantGlueStep
from tuner_service.compiler.deploy.int8_step import Int8KernelStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend import quantized_bias, quantized_glue, quantized_residual

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


def _same_bytes(fused: ModelRunner, plain: ModelRunner, model: Path, out: str) -> None:
    """Every output of the fused and the unfused runs equal, the fused 8-bit ``out`` varied,
    the same in the Python path, and equal to onnxruntime's."""
    for seed in (0, 1, 2, 3):
        x = feeds(seed)
        got, want = fused.run(x), plain.run(x)
        assert got[out].dtype == np.uint8 and len(np.unique(got[out])) > 4
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(fused.run(x, native=False)[out], got[out])
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = feeds(5)
    np.testing.assert_array_equal(fused.run(x)[out], session.run([out], x)[0])


@pytest.mark.parametrize("residual", [False, True])
def test_bias_add_fused_into_the_dense_layer_gives_the_unfused_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, residual: bool) -> None:
    model, bias_out = _with_bias_output(quantized(tmp_path, "qdq", residual=residual))
    fused = _runner(model, tmp_path / "fused")
    mm = next(s for s in fused.steps if isinstance(s, Int8KernelStep) and s.layer == "mm")
    assert mm.kernel.workload.key == "dense_int8:M=1,N=32,K=256,weights=narrow,add=u8"
    assert "Int8Add" not in _glue(fused) or residual  # a residual addition has no layer
    assert list(mm.outputs) == [bias_out]

    monkeypatch.setattr(quantized_bias, "fused_bias_adds", lambda view: iter(()))
    plain = _runner(model, tmp_path / "plain")
    assert _glue(plain).count("Int8Add") == _glue(fused).count("Int8Add") + 1
    _same_bytes(fused, plain, model, bias_out)


def test_shortcut_add_fused_into_the_conv_layer_gives_the_unfused_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The residual block's ``Int8Add`` (3x3 conv + 1x1 shortcut conv, no Relu once
    quantized) runs inside the 3x3 layer's output stage: one kernel and one pass fewer, the
    bytes of the layer then the addition's own kernel, and onnxruntime's."""
    model = onnx.load(quantized(tmp_path, "qdq", residual=True))
    add_out = next(n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"
                   and n.input[0] == "r2")  # the Relu after the Add is gone
    model.graph.output.append(onnx.helper.make_tensor_value_info(
        add_out, onnx.TensorProto.UINT8, [1, 16, 4, 4]))
    path = tmp_path / "residual-out.onnx"
    onnx.save(model, path)
    fused = _runner(path, tmp_path / "fused")
    conv = next(s for s in fused.steps if isinstance(s, Int8KernelStep) and s.layer == "conv2")
    assert conv.kernel.workload.key.endswith(",residual=u8")
    assert list(conv.outputs) == [add_out] and "Int8Add" not in _glue(fused)
    assert [s.native for s in fused.plan.segments] == [True]

    monkeypatch.setattr(quantized_residual, "fused_residual_adds", lambda view: iter(()))
    plain = _runner(path, tmp_path / "plain")
    assert _glue(plain).count("Int8Add") == 1
    _same_bytes(fused, plain, path, add_out)


def test_a_library_built_without_the_fusion_is_refused_not_run_wrong(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library whose int8 kernel computes less than the model's layer now asks for (built
    by a version that did not fuse the addition) would leave the addition out: a clear error
    that says to rebuild, not wrong bytes."""
    model = quantized(tmp_path, "qdq", residual=True)
    with monkeypatch.context() as patch:
        patch.setattr(quantized_residual, "fused_residual_adds", lambda view: iter(()))
        build_library(model, ConfigBook(), tmp_path / "old")
    with pytest.raises(LibraryError, match="rebuild it with tuner build"):
        ModelRunner(model, KernelLibrary(tmp_path / "old"))


def test_a_quantized_product_is_not_fused_as_a_shortcut(tmp_path: Path) -> None:
    """Only additions fold into a layer's output stage: the gate (``Int8Mul``) of the same
    block stays a kernel of its own, after a plain layer."""
    runner = _runner(quantized(tmp_path, "qdq", residual=True, product=True), tmp_path / "lib")
    assert "Int8Mul" in _glue(runner)
    assert not [s for s in runner.steps if isinstance(s, Int8KernelStep)
                and "residual=" in s.kernel.workload.key]


def test_byte_transpose_runs_on_its_kernel_in_the_native_program(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Reshape -> Transpose -> Reshape`` of the quantized heads: the reshapes are views, the
    transpose a uint8 copy kernel, so nothing splits the native program; the bytes are numpy's
    transpose, and the model matches onnxruntime as before."""
    model = quantized(tmp_path, "qdq", heads=True)
    runner = _runner(model, tmp_path / "lib")
    moves = [s for s in runner.steps if isinstance(s, QuantGlueStep) and s.op.kind == "transpose"]
    assert len(moves) == 1 and moves[0].op.dtype == "uint8"
    assert moves[0].op.output_shape() == (1, 8, 4)
    assert not [s for s in runner.steps if isinstance(s, NumpyStep)
                and s.node.op_type == "Transpose"]
    assert [s.native for s in runner.plan.segments] == [True]

    monkeypatch.setattr(int8_glue, "MOVES", frozenset())
    plain = _runner(model, tmp_path / "plain")
    assert [s.node.op_type for s in plain.steps if isinstance(s, NumpyStep)
            and s.node.op_type == "Transpose"] == ["Transpose"]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for seed in (0, 1, 2):
        x = feeds(seed)
        got = runner.run(x)["y"]
        np.testing.assert_array_equal(got, plain.run(x)["y"])
        np.testing.assert_allclose(got, session.run(None, x)[0], rtol=1e-5, atol=1e-5)


def test_byte_max_pool_runs_on_the_bytes_in_the_native_program(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``DequantizeLinear -> MaxPool -> QuantizeLinear`` of one scale and zero point: the pool
    runs on the uint8 tensor (one generated byte kernel, no dequantization, no fp32 pool),
    and gives the bytes of the fp32 pool between the two conversions."""
    model = quantized(tmp_path, "qdq", pool=True)
    runner = _runner(model, tmp_path / "lib")
    pools = [s for s in runner.steps if isinstance(s, QuantGlueStep)
             and s.op.kind == "byte_pool2d"]
    assert len(pools) == 1 and pools[0].op.dtype == "uint8"
    assert [s.native for s in runner.plan.segments] == [True]

    monkeypatch.setattr(int8_glue, "MOVES", frozenset({"Transpose"}))
    numpy_pool = _runner(model, tmp_path / "numpy")  # the 8-bit MaxPool as a numpy step
    assert [s.node.op_type for s in numpy_pool.steps if isinstance(s, NumpyStep)
            and s.node.op_type == "MaxPool"] == ["MaxPool"]
    monkeypatch.setattr(quantized_glue, "_MOVES", ("Reshape", "Transpose", "Flatten"))
    fp32_pool = _runner(model, tmp_path / "fp32")  # dequantize, fp32 pool, quantize
    assert not [s for s in fp32_pool.steps if isinstance(s, QuantGlueStep)
                and s.op.kind == "byte_pool2d"]
    # the fp32 pool dequantizes before it and quantizes after it; the byte pool does neither
    for kind in ("DequantizeLinear", "QuantizeLinear"):
        assert _glue(fp32_pool).count(kind) == _glue(runner).count(kind) + 1
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for seed in (0, 1, 2):
        x = feeds(seed)
        got = runner.run(x)["y"]
        np.testing.assert_array_equal(got, numpy_pool.run(x)["y"])
        np.testing.assert_array_equal(got, fp32_pool.run(x)["y"])
        np.testing.assert_allclose(got, session.run(None, x)[0], rtol=1e-5, atol=1e-5)
