"""Quantized models run by ``tuner build`` + ``tuner run`` match onnxruntime: int8 tensors
exactly (with 7-bit weights, where onnxruntime's own AVX2 kernel is exact too), fp32 outputs
to within one output quantization step."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from schedule_templates.errors import InvalidWorkloadError
from tests.frontend.quantized_models import feeds, quantized
from tuner_service.compiler.deploy import int8_step
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner, NumpyStep
from tuner_service.compiler.deploy.int8_glue import QuantGlueStep
from tuner_service.compiler.deploy.int8_step import Int8KernelStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.deploy.node import NodeInfo
from tuner_service.compiler.deploy.ops_quant import DOMAIN_OPS
from tuner_service.compiler.frontend import quantized_residual
from tuner_service.compiler.frontend.loading import load_model
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")


def _runner(model: Path, out: Path, int8: str = "auto") -> ModelRunner:
    build_library(model, ConfigBook(), out, int8=int8)
    return ModelRunner(model, KernelLibrary(out))


def _quantized_tensors(model: Path) -> list[str]:
    """Every uint8 tensor the model computes (QuantizeLinear / QLinear* outputs)."""
    proto = onnx.shape_inference.infer_shapes(onnx.load(model))
    return [v.name for v in proto.graph.value_info
            if v.type.tensor_type.elem_type == onnx.TensorProto.UINT8]


def _int8_steps(runner: ModelRunner) -> tuple[list[str], list[str]]:
    """(Int8Layer nodes run by our kernels, those run by the numpy reference)."""
    kernels = [s.layer for s in runner.steps if isinstance(s, Int8KernelStep)]
    numpy = [s.info.name for s in runner.steps if isinstance(s, NumpyStep)
             and (s.node.domain, s.node.op_type) == (INT8_DOMAIN, "Int8Layer")]
    return kernels, numpy


@pytest.mark.parametrize("form", ["qdq", "qoperator", "dynamic"])
def test_quantized_model_matches_onnxruntime(tmp_path: Path, form: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    model = quantized(tmp_path, form)
    with caplog.at_level(logging.WARNING):
        runner = _runner(model, tmp_path / "lib")
    kernels, numpy = _int8_steps(runner)
    if form == "qdq":  # dense_int8 runs on every x86 host (VNNI or vpmaddwd)
        assert {"mm", "fc"} <= set(kernels)
    if numpy or form != "qdq":  # numpy int8 steps (and QGemm, MatMulInteger) are reported
        assert "int8 reference" in caplog.text
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    for seed in (11, 12, 13):
        x = feeds(seed)
        want = session.run(None, x)[0]
        got = runner.run(x)["y"]
        assert got.dtype == want.dtype == np.float32
        # int8 layers are exact; the fp32 output is the last dequantized int8 tensor, so
        # equal int8 results give equal outputs (dynamic: fp32 scales of runtime ranges)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_without_int8_kernels_the_numpy_reference_runs_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A host (or build) without an int8 template for the layers still runs the model."""
    def no_template(op: str, target: str = "llvm") -> None:
        raise InvalidWorkloadError(f"no template for {op} on target {target!r}")

    monkeypatch.setattr(int8_step, "get_template", no_template)
    model = quantized(tmp_path, "qdq")
    with caplog.at_level(logging.WARNING):
        runner = _runner(model, tmp_path / "lib")
    kernels, numpy = _int8_steps(runner)
    assert not kernels and len(numpy) == 3
    assert "3 int8 layer(s)" in caplog.text and "numpy int8 reference" in caplog.text
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = feeds(3)
    np.testing.assert_allclose(runner.run(x)["y"], session.run(None, x)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("form", ["qoperator", "qdq"])
def test_int8_tensors_match_onnxruntime_exactly(tmp_path: Path, form: str) -> None:
    """Every intermediate uint8 tensor, not only the output."""
    model = quantized(tmp_path, form)
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
    env, got = {**runner.constants, **x}, {}
    for step in runner.steps:
        step(env)
        # copied when made: planned activation buffers are reused by later steps
        got.update({n: env[n].copy() for n in step.outputs if n in names})
    # the MatMul's own 8-bit output is fused away with its bias addition (quantized_bias):
    # the addition's output, which is compared, is computed from it in registers
    assert len(set(names) - set(got)) == (1 if form == "qdq" else 0)
    for name in set(names) & set(got):
        assert got[name].dtype == np.uint8
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("product", [False, True])
def test_residual_addition_runs_on_its_generated_kernel_with_numpy_s_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, product: bool) -> None:
    """A quantized residual addition of two activations runs on its generated kernel (one
    per distinct operator), gives the numpy step's bytes exactly, and the model still matches
    onnxruntime's unfused evaluation within an output step. The same for a product of the two
    branches (``Int8Mul``). The bias addition after the MatMul is fused into its layer, and so
    would the addition be into the convolution before it, which is switched off here
    (``test_deploy_quantized_fusion`` tests both)."""
    monkeypatch.setattr(quantized_residual, "fused_residual_adds", lambda view: iter(()))
    model = quantized(tmp_path, "qdq", residual=True, product=product)
    binary = "Int8Mul" if product else "Int8Add"
    runner = _runner(model, tmp_path / "lib")
    glue = [s.node.op_type for s in runner.steps if isinstance(s, QuantGlueStep)]
    # the input's QuantizeLinear and the output's DequantizeLinear run on kernels too
    assert glue == ["QuantizeLinear", binary, "DequantizeLinear"]
    adds = [s for s in runner.steps if isinstance(s, QuantGlueStep)
            and s.node.op_type in ("Int8Add", "Int8Mul")]
    assert [(a.op.size, a.op.broadcast, a.op.period, a.op.operation) for a in adds] == [
        (16 * 4 * 4, "", 0, "mul" if product else "add")]
    # the rewritten graph's constants (a bias the step copied behind a fixed pointer)
    weights = {t.name: onnx.numpy_helper.to_array(t)
               for t in load_model(Path(model)).graph.initializer}
    for seed in (1, 2, 3):
        env = {**runner.constants, **feeds(seed)}
        for step in runner.steps:
            operands = [env.get(name, weights.get(name)) for name in step.node.input] \
                if step in adds else []
            step(env)
            if step in adds:
                info = NodeInfo.from_proto(step.node, step.layer, 17)
                numpy_op = DOMAIN_OPS[(INT8_DOMAIN, step.node.op_type)]
                want = numpy_op(operands, info)[0]
                np.testing.assert_array_equal(env[step.outputs[0]], want)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    y_scale = next(float(onnx.numpy_helper.to_array(t))
                   for t in onnx.load(model).graph.initializer if t.name == "y_scale")
    x = feeds(4)
    assert np.abs(runner.run(x)["y"] - session.run(None, x)[0]).max() <= 2 * y_scale + 1e-6


def test_full_range_weights_stay_within_onnxruntime_saturation(tmp_path: Path) -> None:
    """8-bit weights summed exactly (``--int8 exact``): onnxruntime's AVX2 kernel saturates
    pairs of products in int16 on hosts without VNNI (what ``--int8 auto`` reproduces there,
    test_deploy_int8_sat16), so compare with its exact (VNNI-free) computation: the
    DequantizeLinear -> fp32 model within one output step."""
    model = quantized(tmp_path, "qdq", reduce_range=False)
    runner = _runner(model, tmp_path / "lib", int8="exact")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    y_scale = next(float(onnx.numpy_helper.to_array(t)) for t in onnx.load(model).graph.initializer
                   if t.name == "y_scale")
    for seed in (1, 2):
        x = feeds(seed)
        diff = np.abs(runner.run(x)["y"] - session.run(None, x)[0])
        assert diff.max() <= 2 * y_scale + 1e-6


def test_cli_build_and_checked_run_of_a_quantized_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``tuner run --check`` hands onnxruntime the model as it is, not our rewritten graph."""
    from tuner_service.cli.main import main

    model = quantized(tmp_path, "qdq")
    out = tmp_path / "lib"
    assert main(["build", str(model), "-o", str(out), "--json"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert built["int8_kernels"] >= 2
    assert main(["run", str(model), "--library", str(out), "--iterations", "1", "--check",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["int8_layers"] >= 2
    # the input's QuantizeLinear and the output's DequantizeLinear (the bias addition is
    # fused into the MatMul's layer)
    assert report["int8_glue_steps"] == 2 and report["numpy_steps"] == 1  # the Flatten
    manifest = json.loads((out / "manifest.json").read_text())
    assert "dense_int8:M=1,N=32,K=256,weights=narrow,add=u8" in [e.get("workload")
                                                   for e in manifest["int8_kernels"]]
    assert report["check"]["max_rel_error"] < 1e-5


def test_numpy_quantize_of_a_scalar_constant() -> None:
    """A Constant's QuantizeLinear is folded at load by the numpy step: a 0-d value works
    (BERT's GELU adds a quantized 1.0)."""
    from tuner_service.compiler.deploy.ops_quant import quantize

    one = quantize(np.float32(1.0), np.array(0.0039, np.float32), np.array(0, np.uint8))
    assert one.dtype == np.uint8 and one.shape == () and int(one) == 255
    np.testing.assert_array_equal(
        quantize(np.array([1.0, 2.6], np.float32), np.array(0.5, np.float32),
                 np.array(3, np.uint8)), [5, 8])


def test_conversions_of_constants_are_folded_not_run(tmp_path: Path) -> None:
    """A QuantizeLinear of a Constant is folded at load, and so is the DequantizeLinear after
    it, although the build compiled a glue kernel for that one (its input was not constant
    there): nothing computable at load runs per call."""
    proto = onnx.load(quantized(tmp_path, "qdq"))
    graph = proto.graph
    x_q = next(n for n in graph.node if n.op_type == "QuantizeLinear")
    scale, zero = x_q.input[1], x_q.input[2]
    graph.node.insert(0, onnx.helper.make_node(
        "Constant", [], ["one"], "one", value=onnx.numpy_helper.from_array(
            np.ones((1, 3, 8, 8), np.float32))))
    graph.node.insert(1, onnx.helper.make_node("QuantizeLinear", ["one", scale, zero],
                                               ["one_q"], "one_q"))
    graph.node.insert(2, onnx.helper.make_node("DequantizeLinear", ["one_q", scale, zero],
                                               ["one_f"], "one_f"))
    graph.node.insert(3, onnx.helper.make_node("Add", ["x", "one_f"], ["x1"], "shift"))
    for node in graph.node[4:]:
        node.input[:] = ["x1" if name == "x" else name for name in node.input]
    path = tmp_path / "shifted.onnx"
    onnx.save(proto, path)
    runner = _runner(path, tmp_path / "lib")
    ran = {getattr(s, "layer", None) or getattr(s.info, "name", "") for s in runner.steps}
    assert not {"one_q", "one_f"} & ran and "shift" in ran


def _gelu_half_model(path: Path) -> None:
    """x (u8) -> DequantizeLinear -> Div sqrt(2) -> Erf -> QuantizeLinear -> DequantizeLinear:
    the unary part of a QDQ BERT's GELU, the Div's divisor a Constant node."""
    h = onnx.helper
    nh = onnx.numpy_helper
    inits = [nh.from_array(np.array(0.05, np.float32), "s_in"),
             nh.from_array(np.array(128, np.uint8), "z_in"),
             nh.from_array(np.array(1 / 127.5, np.float32), "s_out"),
             nh.from_array(np.array(128, np.uint8), "z_out")]
    nodes = [
        h.make_node("Constant", [], ["root2"], "root2",
                    value=nh.from_array(np.array(1.4142135, np.float32))),
        h.make_node("DequantizeLinear", ["x", "s_in", "z_in"], ["xf"], "dq"),
        h.make_node("Div", ["xf", "root2"], ["d"], "div"),
        h.make_node("Erf", ["d"], ["e"], "erf"),
        h.make_node("QuantizeLinear", ["e", "s_out", "z_out"], ["eq"], "q"),
        h.make_node("DequantizeLinear", ["eq", "s_out", "z_out"], ["y"], "dq_out"),
    ]
    graph = h.make_graph(nodes, "gelu_half",
                         [h.make_tensor_value_info("x", onnx.TensorProto.UINT8, [2, 3, 300])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3, 300])],
                         inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)


def test_a_unary_chain_between_dequantize_and_quantize_is_one_table(tmp_path: Path) -> None:
    """Div by a Constant and Erf between a DequantizeLinear and a QuantizeLinear become one
    Int8Table node: its table is the chain on all 256 inputs, its kernel looks every element
    up, and the model's output matches onnxruntime's unfused evaluation within one step."""
    from tuner_service.compiler.frontend.loading import load_model

    path = tmp_path / "gelu_half.onnx"
    _gelu_half_model(path)
    proto = load_model(path)
    assert [n.op_type for n in proto.graph.node] == ["Int8Table", "DequantizeLinear"]
    table = next(onnx.numpy_helper.to_array(t) for t in proto.graph.initializer
                 if t.name.endswith(".table"))
    x = np.arange(256).astype(np.float32)
    erf = np.vectorize(math.erf)(((x - 128) * np.float32(0.05)) / np.float32(1.4142135))
    want = np.clip(np.rint(erf.astype(np.float32) / np.float32(1 / 127.5)) + 128, 0, 255)
    assert table.dtype == np.uint8 and np.abs(table.astype(int) - want).max() <= 1
    runner = _runner(path, tmp_path / "lib")
    assert [s.node.op_type for s in runner.steps
            if isinstance(s, QuantGlueStep)] == ["Int8Table", "DequantizeLinear"]
    feed = {"x": np.random.default_rng(0).integers(0, 256, (2, 3, 300)).astype(np.uint8)}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got, reference = runner.run(feed)["y"], session.run(None, feed)[0]
    assert np.abs(got - reference).max() <= 1 / 127.5 + 1e-6


def _gelu_model(path: Path) -> None:
    """A QDQ BERT's whole GELU on a u8 tensor: t = erf(x / sqrt 2) (a table), t + 1 with the
    1 a QuantizeLinear of a Constant, x * that, then halved by an initializer's byte; every
    product between a DequantizeLinear and a QuantizeLinear, as quantize_static writes it."""
    h, nh = onnx.helper, onnx.numpy_helper
    inits = [nh.from_array(np.array(v, t), n) for n, v, t in (
        ("s_x", 0.05, np.float32), ("z_x", 128, np.uint8), ("s_e", 1 / 127.5, np.float32),
        ("z_e", 128, np.uint8), ("s_one", 1 / 255, np.float32), ("z_one", 0, np.uint8),
        ("s_p", 2 / 255, np.float32), ("z_p", 0, np.uint8), ("s_m", 0.06, np.float32),
        ("z_m", 100, np.uint8), ("half_q", 127, np.uint8), ("s_half", 0.5 / 127, np.float32),
        ("z_half", 0, np.uint8), ("s_y", 0.04, np.float32), ("z_y", 90, np.uint8))]

    def dq(x: str, s: str, z: str) -> Any:
        return h.make_node("DequantizeLinear", [x, s, z], [f"{x}_f"], f"dq_{x}")

    def q(x: str, s: str, z: str) -> Any:
        return h.make_node("QuantizeLinear", [x, s, z], [f"{x}_q"], f"q_{x}")

    nodes = [
        h.make_node("Constant", [], ["root2"], "root2",
                    value=nh.from_array(np.array(1.4142135, np.float32))),
        h.make_node("Constant", [], ["one"], "one", value=nh.from_array(np.array(1, np.float32))),
        dq("x", "s_x", "z_x"),
        h.make_node("Div", ["x_f", "root2"], ["d"], "div"),
        h.make_node("Erf", ["d"], ["e"], "erf"), q("e", "s_e", "z_e"), dq("e_q", "s_e", "z_e"),
        q("one", "s_one", "z_one"), dq("one_q", "s_one", "z_one"),
        h.make_node("Add", ["e_q_f", "one_q_f"], ["p"], "plus_one"), q("p", "s_p", "z_p"),
        dq("p_q", "s_p", "z_p"),
        h.make_node("Mul", ["x_f", "p_q_f"], ["m"], "gate"), q("m", "s_m", "z_m"),
        dq("m_q", "s_m", "z_m"), dq("half_q", "s_half", "z_half"),
        h.make_node("Mul", ["m_q_f", "half_q_f"], ["y"], "halve"), q("y", "s_y", "z_y"),
        dq("y_q", "s_y", "z_y"),
    ]
    graph = h.make_graph(nodes, "gelu",
                         [h.make_tensor_value_info("x", onnx.TensorProto.UINT8, [2, 3, 300])],
                         [h.make_tensor_value_info("y_q_f", onnx.TensorProto.FLOAT, [2, 3, 300])],
                         inits)
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)


def test_glue_with_a_scalar_constant_becomes_a_table_with_the_same_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``+ 1`` is composed into the erf table before it (one lookup), ``* 0.5`` becomes a table
    of its own, the gate (two activations) stays a binary kernel; every output byte is what the
    unrewritten glue gives, and the model matches onnxruntime's unfused evaluation."""
    from tuner_service.compiler.frontend import quantized_scalar

    path = tmp_path / "gelu.onnx"
    _gelu_model(path)
    runner = _runner(path, tmp_path / "lib")
    glue = [(s.node.op_type, s.node.name) for s in runner.steps if isinstance(s, QuantGlueStep)]
    assert glue == [("Int8Table", "plus_one"), ("Int8Mul", "gate"), ("Int8Table", "halve"),
                    ("DequantizeLinear", "dq_y_q")]
    feed = {"x": np.random.default_rng(3).integers(0, 256, (2, 3, 300)).astype(np.uint8)}
    got = runner.run(feed)["y_q_f"].copy()
    monkeypatch.setattr(quantized_scalar, "scalar_tables", lambda view: iter(()))
    monkeypatch.setattr(quantized_scalar, "composed_tables", lambda view: iter(()))
    plain = _runner(path, tmp_path / "plain")
    assert [s.node.op_type for s in plain.steps if isinstance(s, QuantGlueStep)] == [
        "Int8Table", "Int8Add", "Int8Mul", "Int8Mul", "DequantizeLinear"]
    np.testing.assert_array_equal(got, plain.run(feed)["y_q_f"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert np.abs(got - session.run(None, feed)[0]).max() <= 0.04 + 1e-6


@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_int8_steps_run_in_the_native_program_with_the_step_by_step_bytes(
        tmp_path: Path, form: str) -> None:
    """Int8 layers and their glue are kernel steps of typed arguments: the native program runs
    them (no Python step is left between the kernels of the QDQ model), on uint8 buffers planned
    in the same arena, and gives the step-by-step path's bytes."""
    model = quantized(tmp_path, form, residual=True)
    runner = _runner(model, tmp_path / "lib")
    assert runner.native is not None
    int8 = [s for s in runner.steps if isinstance(s, Int8KernelStep | QuantGlueStep)]
    assert int8 and all(s.in_program for s in int8)
    planned = {name for s in int8 for name in s.outputs}
    assert planned <= set(runner.plan.roots)  # in the arena, not buffers of their own
    assert any(runner.plan.views[n].dtype == np.uint8 for n in planned)
    if form == "qdq":
        assert [s.native for s in runner.plan.segments] == [True]
    for seed in (0, 1):
        x = feeds(seed)
        native = {k: v.copy() for k, v in runner.run(x).items()}
        stepwise = runner.run(x, native=False)
        for name, value in native.items():
            np.testing.assert_array_equal(value, stepwise[name])
