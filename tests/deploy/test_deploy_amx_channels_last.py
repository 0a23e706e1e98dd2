"""A quantized model whose channels-last layers take AMX tiles (``x86_amx_channels_last``),
built and run end to end: the native program and the Python path give onnxruntime's bytes. On
an AMX host the tile kernels run; elsewhere every tile product is replaced by its expansion
(the same sums lane by lane), so the kernels' indexing, the in-place reads with slack (a 1x1
layer over 90 pixels reads 96 rows) and the staged maps are checked on every host."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

from schedule_templates.ir.amx import TileMatmul
from schedule_templates.ir.nodes import Stmt
from schedule_templates.ir.visitor import StmtMutator
from schedule_templates.templates import x86_amx_gemm, x86_dot_gemm
from schedule_templates.templates.x86_conv2d_int8 import _channels_last_tiles
from schedule_templates.workloads import Conv2dInt8
from tuner_service.compiler.deploy import library
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.int8_step import Int8KernelStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

SHAPE = (1, 64, 10, 9)


def _float_model() -> onnx.ModelProto:
    """1x1 (NCHW input) -> 3x3 -> 1x1 + the first output -> 3x3 stride 2 -> pool -> Gemm,
    64 channels throughout (whole tile steps)."""
    rng = np.random.default_rng(4)

    def weight(name: str, shape: tuple[int, ...], std: float) -> onnx.TensorProto:
        return nh.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    inits = [weight("w1", (64, 64, 1, 1), 0.15), weight("b1", (64,), 0.1),
             weight("w2", (64, 64, 3, 3), 0.05), weight("w3", (64, 64, 1, 1), 0.15),
             weight("w4", (64, 64, 3, 3), 0.05), weight("w5", (10, 64), 0.2),
             weight("b5", (10,), 0.1)]
    nodes = [
        oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1"),
        oh.make_node("Relu", ["c1"], ["r1"], "relu1"),
        oh.make_node("Conv", ["r1", "w2"], ["c2"], "conv2", pads=[1, 1, 1, 1]),
        oh.make_node("Relu", ["c2"], ["r2"], "relu2"),
        oh.make_node("Conv", ["r2", "w3"], ["c3"], "conv3"),
        oh.make_node("Add", ["c3", "r1"], ["s3"], "residual"),
        oh.make_node("Relu", ["s3"], ["r3"], "relu3"),
        oh.make_node("Conv", ["r3", "w4"], ["c4"], "conv4", pads=[1, 1, 1, 1],
                     strides=[2, 2]),
        oh.make_node("Relu", ["c4"], ["r4"], "relu4"),
        oh.make_node("GlobalAveragePool", ["r4"], ["p"], "pool"),
        oh.make_node("Flatten", ["p"], ["f"], "flat"),
        oh.make_node("Gemm", ["f", "w5", "b5"], ["y"], "fc", transB=1),
    ]
    graph = oh.make_graph(nodes, "amx_channels_last",
                          [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, SHAPE)],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])],
                          inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, SHAPE).astype(np.float32)}


def _quantized(tmp: Path) -> Path:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    class Reader:
        def __init__(self) -> None:
            self.left = iter([_feeds(s) for s in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

    source, target = tmp / "float.onnx", tmp / "int8.onnx"
    onnx.save(_float_model(), source)
    # 7-bit weights: onnxruntime's own AVX2 kernel is exact with them (tests/frontend)
    quantize_static(source, target, Reader(), quant_format=QuantFormat.QDQ,  # type: ignore[arg-type]
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True, reduce_range=True)
    return target


class _Expand(StmtMutator):
    def visit_tile_matmul(self, s: TileMatmul) -> Stmt:
        return self.visit_stmt(s.expand())


@pytest.fixture
def tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Channels-last planned; tiles where the host has them, else their expansion."""
    monkeypatch.setattr(library, "int8_channels_last", lambda proto: True)
    if x86_amx_gemm.host_amx("tdpbusd"):
        return
    monkeypatch.setattr(x86_dot_gemm, "int8_instruction", lambda narrow=False: x86_dot_gemm.VNNI)
    monkeypatch.setattr(x86_amx_gemm, "host_amx", lambda dot="tdpbusd": True)
    real = x86_amx_gemm.amx_nest
    monkeypatch.setattr(x86_amx_gemm, "amx_nest",
                        lambda *args, **kwargs: _Expand().visit_stmt(real(*args, **kwargs)))


def test_channels_last_tiles_run_the_model_with_onnxruntimes_bytes(tiles: None,
                                                                  tmp_path: Path) -> None:
    path = _quantized(tmp_path)
    manifest = build_library(path, ConfigBook(), tmp_path / "lib", layout="nchwc")
    assert manifest["layout"]["int8"] == "nhwc"
    runner = ModelRunner(path, KernelLibrary(tmp_path / "lib"))
    steps = [s for s in runner.steps if isinstance(s, Int8KernelStep)]
    laid = [s.kernel.workload for s in steps if s.kernel.workload.op == "conv2d_int8"]
    assert len(laid) == 4 and all(isinstance(w, Conv2dInt8) and w.channels_last
                                  and _channels_last_tiles(w) for w in laid)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = _feeds(seed)
        want = session.run(["y"], x)[0]
        np.testing.assert_array_equal(runner.run(x)["y"], want)
        np.testing.assert_array_equal(runner.run(x, native=False)["y"], want)
