"""Full-range (8-bit) quantized models in onnxruntime's own arithmetic: ``--int8 auto`` sums
byte pairs in saturating 16 bits where this host has no VNNI (as onnxruntime's kernels do
there) and exactly where it has, so every 8-bit tensor matches onnxruntime's on either host."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

from schedule_templates.templates import x86_dot_gemm
from schedule_templates.workloads import parse_workload
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import BuildError, LibraryError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.extract import extract_tasks
from tuner_service.compiler.frontend.int8_arithmetic import at_int8, resolve_int8

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")

SHAPE = (1, 3, 16, 16)


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).normal(0, 1, SHAPE).astype(np.float32)}


class _Reader:
    def __init__(self) -> None:
        self._feeds = iter([_feeds(s) for s in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def _full_range_model(tmp: Path) -> Path:
    """An RGB stem (Conv 7x7 stride 2, 3 -> 32) -> Relu -> Conv 1x1 -> Relu -> Flatten ->
    MatMul, quantized by ``quantize_static`` with 8-bit weights (no ``reduce_range``): pairs
    of large weights of one sign meet large activations, which onnxruntime saturates without
    VNNI (pairing the stem's values across taps)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(1)
    inits = [nh.from_array(rng.normal(0, s, shape).astype(np.float32), name) for name, shape, s
             in (("w1", (32, 3, 7, 7), 0.2), ("w2", (32, 32, 1, 1), 0.3),
                 ("w3", (32 * 8 * 8, 16), 0.05))]
    nodes = [oh.make_node("Conv", ["x", "w1"], ["c1"], "conv1", pads=[3, 3, 3, 3],
                          strides=[2, 2]),
             oh.make_node("Relu", ["c1"], ["r1"], "relu1"),
             oh.make_node("Conv", ["r1", "w2"], ["c2"], "conv2"),
             oh.make_node("Relu", ["c2"], ["r2"], "relu2"),
             oh.make_node("Flatten", ["r2"], ["f"], "flat"),
             oh.make_node("MatMul", ["f", "w3"], ["y"], "mm")]
    graph = oh.make_graph(nodes, "full_range", [oh.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, SHAPE)], [oh.make_tensor_value_info(
            "y", onnx.TensorProto.FLOAT, [1, 16])], inits)
    source, target = tmp / "float.onnx", tmp / "int8.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8),
              source)
    quantize_static(source, target, _Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True, reduce_range=False)
    return target


def _mismatches(model: Path, out: Path, int8: str) -> tuple[dict[str, float], dict]:
    """Per uint8 tensor, the share of bytes that differ from onnxruntime's; the manifest."""
    manifest = build_library(model, ConfigBook(), out, int8=int8)
    runner = ModelRunner(model, KernelLibrary(out))
    proto = onnx.shape_inference.infer_shapes(onnx.load(model))
    names = [v.name for v in proto.graph.value_info
             if v.type.tensor_type.elem_type == onnx.TensorProto.UINT8]
    proto.graph.output.extend(oh.make_empty_tensor_value_info(n) for n in names)
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    shares: dict[str, list[float]] = {}
    for seed in (5, 6):
        x = _feeds(seed)
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, x),
                        strict=True))
        env = {**runner.constants, **x}
        for step in runner.steps:
            step(env)
            for name in step.outputs:
                if name in names:
                    shares.setdefault(name, []).append(float(np.mean(env[name] != want[name])))
    assert len(shares) >= 2
    return {name: max(values) for name, values in shares.items()}, manifest


def test_full_range_int8_tensors_match_onnxruntime(tmp_path: Path) -> None:
    model = _full_range_model(tmp_path)
    shares, manifest = _mismatches(model, tmp_path / "lib", "auto")
    assert shares and not any(shares.values()), shares
    vnni = x86_dot_gemm.int8_instruction() is x86_dot_gemm.VNNI
    assert manifest.get("int8_arithmetic", "exact") == ("exact" if vnni else "sat16")
    keys = [k["workload"] for k in manifest["int8_kernels"] if "workload" in k]
    assert keys and all(("weights=sat16" in k) != vnni for k in keys), keys


@pytest.mark.skipif(x86_dot_gemm.int8_instruction() is x86_dot_gemm.VNNI,
                    reason="onnxruntime sums exactly on a host with VNNI")
def test_exact_sums_part_from_onnxruntime_without_vnni(tmp_path: Path) -> None:
    """The model saturates: exact int32 sums give other bytes than onnxruntime's here."""
    shares, manifest = _mismatches(_full_range_model(tmp_path), tmp_path / "lib", "exact")
    assert any(shares.values()), shares
    assert "int8_arithmetic" not in manifest


def test_extract_names_the_arithmetic_s_tasks(tmp_path: Path) -> None:
    model = _full_range_model(tmp_path)
    keys = {t.workload.key for t in extract_tasks(model, int8="sat16").tasks}
    assert keys and all("weights=sat16" in k for k in keys if "_int8" in k)
    exact = {t.workload.key for t in extract_tasks(model, int8="exact").tasks}
    assert not any("sat16" in k for k in exact)


def test_a_library_runs_in_the_arithmetic_its_manifest_names(tmp_path: Path) -> None:
    model = _full_range_model(tmp_path)
    build_library(model, ConfigBook(), tmp_path / "lib", int8="sat16")
    manifest_path = tmp_path / "lib" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["int8_arithmetic"] == "sat16"
    runner = ModelRunner(model, KernelLibrary(tmp_path / "lib"))
    assert runner.run(_feeds(1))["y"].shape == (1, 16)
    manifest["int8_arithmetic"] = "fuzzy"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(LibraryError, match="unknown int8 arithmetic"):
        ModelRunner(model, KernelLibrary(tmp_path / "lib"))


def test_unknown_arithmetic_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="unknown int8 arithmetic"):
        resolve_int8("fast")
    with pytest.raises(BuildError, match="unknown int8 arithmetic"):
        build_library(tmp_path / "missing.onnx", ConfigBook(), tmp_path / "lib", int8="fast")


@pytest.mark.parametrize(("key", "changes"), [
    ("conv2d_int8:N=1,C=16,H=8,W=8,K=32,R=3,S=3,pad=1", True),
    ("dense_int8:M=1,N=16,K=2048,bias=s32", True),
    ("conv2d_int8:N=1,C=3,H=8,W=8,K=16,R=3,S=3,stride=2", True),  # an RGB stem: flat words
    ("conv2d_int8:N=1,C=6,H=8,W=8,K=16,R=3,S=3,groups=2", False),  # 3 channels a group
    ("conv2d_int8:N=1,C=16,H=8,W=8,K=16,R=3,S=3,groups=16", False),  # depthwise
    ("dense_int8:M=1,N=16,K=64,weights=narrow", False),  # never saturates
])
def test_sat16_applies_where_pairs_match_onnxruntime_s(key: str, changes: bool) -> None:
    workload = parse_workload(key)
    summed = at_int8(workload, "sat16")
    assert (summed is not workload) == changes
    assert at_int8(workload, "exact") is workload
    if changes:
        assert summed.key == f"{key},weights=sat16"


def test_a_flat_stem_keeps_nchw_in_a_channels_last_plan(tmp_path: Path) -> None:
    """Channels-last planning (VNNI hosts' blocked plans) passes over a sat16 stem, whose flat
    words are NCHW only; the layer after it still reads NCHW."""
    from tuner_service.compiler.frontend.int8_arithmetic import apply_int8_arithmetic
    from tuner_service.compiler.frontend.loading import load_model
    from tuner_service.compiler.frontend.quantized_layout import plan_channels_last
    from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN, int8_layer_workload

    proto = load_model(_full_range_model(tmp_path))
    assert apply_int8_arithmetic(proto, "sat16") >= 3
    plan_channels_last(proto)
    keys = [int8_layer_workload(n).key for n in proto.graph.node
            if n.domain == INT8_DOMAIN and n.op_type == "Int8Layer"]
    stem = [k for k in keys if k.startswith("conv2d_int8:N=1,C=3,")]
    assert stem and "nhwc" not in stem[0] and "weights=sat16" in stem[0]


def test_clients_send_the_arithmetic_of_a_cpu_library_built_here() -> None:
    from tuner_service.tuning.remote import host_int8

    assert host_int8("cuda") == "exact"  # CUDA kernels sum exactly
    vnni = x86_dot_gemm.int8_instruction() is x86_dot_gemm.VNNI
    assert host_int8("llvm") == ("exact" if vnni else "sat16") == resolve_int8("auto")
