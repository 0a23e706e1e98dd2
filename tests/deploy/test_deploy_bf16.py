"""``tuner build --precision bf16``: dense and convolution layers on bfloat16 products, fp32
between layers.

Which layers are cast is decided from shapes alone (tested everywhere); building and running
needs AVX-512 BF16 and skips, with the reason, on CPUs without it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from schedule_templates.codegen.llvm_jit import host_features
from schedule_templates.templates.choose import host_registers
from schedule_templates.templates.x86_winograd import default_winograd
from schedule_templates.workloads import parse_workload
from tests.deploy.conftest import make_model, onnxruntime_outputs
from tuner_service.cli.main import main
from tuner_service.compiler.deploy import library as library_module
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.errors import BuildError, LibraryError
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.precision import at_precision
from tuner_service.compiler.frontend.samples import build_sample_model, sample_model_bytes

needs_bf16 = pytest.mark.skipif("+avx512bf16" not in host_features().split(","),
                                reason="this CPU lacks AVX-512 BF16 (vdpbf16ps)")


@pytest.fixture(autouse=True)
def vector_host_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which layers take bf16 as on a host without AMX tiles (the kernels themselves still run
    on tiles where this host has them); ``test_amx_hosts_cast_only_what_runs_on_tiles`` has
    the rules of a host with them."""
    monkeypatch.setattr("tuner_service.compiler.frontend.precision.host_amx",
                        lambda dot="tdpbusd": False)


@pytest.mark.parametrize("key, expected", [
    ("dense:M=128,N=768,K=768,epilogue=bias+gelu",
     "dense_bf16:M=128,N=768,K=768,data=f32,epilogue=bias+gelu"),
    ("dense:M=1,N=32,K=64", "dense_bf16:M=1,N=32,K=64,data=f32"),
    ("dense:M=1,N=1000,K=512,epilogue=bias", None),  # N not whole 16-lane registers
    ("dense:M=4,N=32,K=7", None),  # K not whole pairs
    ("batch_matmul:B=12,M=128,N=128,K=64", "batch_matmul_bf16:B=12,M=128,N=128,K=64"),
    ("batch_matmul:B=3,M=5,N=40,K=9", None),  # too small to pay for packing both operands
    ("conv2d:N=1,C=8,H=6,W=6,K=16,R=3,S=3,pad=1",
     "conv2d_bf16:N=1,C=8,H=6,W=6,K=16,R=3,S=3,pad=1"),
    ("conv2d:N=1,C=64,H=56,W=56,K=256,R=1,S=1,epilogue=bias+residual+relu",
     "conv2d_bf16:N=1,C=64,H=56,W=56,K=256,R=1,S=1,epilogue=bias+residual+relu"),
    ("depthwise_conv2d:N=1,C=32,H=14,W=14,R=3,S=3,pad=1", None),
    ("group_conv2d:N=1,C=32,H=14,W=14,K=32,R=3,S=3,pad=1,groups=4",
     "conv2d_bf16:N=1,C=32,H=14,W=14,K=32,R=3,S=3,pad=1,groups=4"),
])
def test_which_layers_bf16_casts(key: str, expected: str | None) -> None:
    workload = parse_workload(key)
    assert at_precision(workload, "fp32") is workload
    assert at_precision(workload, "bf16").key == (expected or key)


@pytest.mark.parametrize("key, expected", [
    ("dense:M=128,N=768,K=768,epilogue=bias+gelu",
     "dense_bf16:M=128,N=768,K=768,data=f32,epilogue=bias+gelu"),
    ("dense:M=1,N=48,K=64", None),  # 48 columns: not whole 32-column blocks
    ("batch_matmul:B=12,M=128,N=128,K=64", None),  # no tile form: vdpbf16ps is slow there
    ("conv2d:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3",  # a stem: expanded planes
     "conv2d_bf16:N=1,C=3,H=224,W=224,K=64,R=7,S=7,stride=2,pad=3"),
    ("conv2d:N=1,C=8,H=56,W=56,K=64,R=1,S=1", None),  # 4 words: too few for a tile step
    ("conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1",  # on tiles, even over Winograd
     "conv2d_bf16:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1"),
    ("group_conv2d:N=1,C=64,H=14,W=14,K=64,R=3,S=3,pad=1,groups=2",
     "conv2d_bf16:N=1,C=64,H=14,W=14,K=64,R=3,S=3,pad=1,groups=2"),
    ("group_conv2d:N=1,C=32,H=14,W=14,K=32,R=3,S=3,pad=1,groups=4", None),
])
def test_amx_hosts_cast_only_what_runs_on_tiles(monkeypatch: pytest.MonkeyPatch, key: str,
                                                expected: str | None) -> None:
    monkeypatch.setattr("tuner_service.compiler.frontend.precision.host_amx",
                        lambda dot="tdpbusd": True)
    assert at_precision(parse_workload(key), "bf16").key == (expected or key)


@pytest.mark.parametrize("tiles", [False, True])
def test_a_winograd_layer_keeps_fp32_unless_bf16_runs_on_tiles(
        monkeypatch: pytest.MonkeyPatch, tiles: bool) -> None:
    # a 3x3 layer whose fp32 default is Winograd does a quarter to half the multiplies: that
    # beats bf16's twice the rate, so it stays fp32; AMX tiles run bf16 several times faster
    monkeypatch.setattr("tuner_service.compiler.frontend.precision.host_amx",
                        lambda dot="tdpbusd": tiles)
    key = "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1,epilogue=bias+relu"
    workload = parse_workload(key)
    winograd = default_winograd(workload, host_registers())  # type: ignore[arg-type]
    fp32 = winograd is not None and not tiles
    expected = key if fp32 else key.replace("conv2d:", "conv2d_bf16:")
    assert at_precision(workload, "bf16").key == expected


def test_winograd_layers_on_small_maps_take_bf16() -> None:
    # 14x14 (196 pixels): the transformed weights are read for few tiles, bf16 direct wins
    key = "conv2d:N=1,C=256,H=14,W=14,K=256,R=3,S=3,pad=1,epilogue=bias+relu"
    assert at_precision(parse_workload(key), "bf16").key == key.replace("conv2d:", "conv2d_bf16:")


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ModelError, match="unknown precision 'fp8'"):
        at_precision(parse_workload("dense:M=1,N=32,K=64"), "fp8")
    with pytest.raises(BuildError, match="unknown precision 'fp8'"):
        build_library(sample_model_bytes("bert_block"), ConfigBook(), Path("unused"),
                      precision="fp8")


def test_bf16_is_refused_on_a_cpu_without_the_instructions(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(library_module, "host_features", lambda: "+avx512f,-avx512bf16")
    with pytest.raises(BuildError, match="needs a CPU with AVX-512 BF16"):
        build_library(sample_model_bytes("bert_block"), ConfigBook(), tmp_path / "lib",
                      precision="bf16")
    assert not (tmp_path / "lib").exists()


@pytest.mark.parametrize("fp32, bf16, tiles, warned", [
    (174.0, 86.0, None, True),  # Emerald Rapids without AMX exposed: vdpbf16ps at half rate
    (272.0, 537.0, None, False),  # Zen 5
    (157.0, 86.0, 570.0, False),  # Emerald Rapids with AMX: the layers run on tdpbf16ps
])
def test_bf16_warns_where_its_dot_product_does_not_outrun_the_fmas(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fp32: float,
        bf16: float, tiles: float | None, warned: bool) -> None:
    peaks = {"fma": fp32, "dpbf16ps": bf16}
    monkeypatch.setattr("schedule_templates.peak.measure_peak_gflops",
                        lambda threads=1, repeat=15, instruction="fma": peaks[instruction])
    monkeypatch.setattr("schedule_templates.peak.measure_tile_peak_gops",
                        lambda threads=1, dot="tdpbusd", repeat=7: tiles)
    monkeypatch.setattr("schedule_templates.templates.x86_amx_gemm.host_amx",
                        lambda dot="tdpbusd": tiles is not None)
    monkeypatch.setattr(library_module, "host_features", lambda: "+avx512f,+avx512bf16")
    library_module.warn_if_bf16_is_slow.cache_clear()
    with caplog.at_level("WARNING", logger=library_module.__name__):
        library_module.check_build_precision("bf16")
        library_module.check_build_precision("bf16")  # a second build: no second warning
    library_module.warn_if_bf16_is_slow.cache_clear()
    assert sum("slower in bf16" in r.getMessage() for r in caplog.records) == int(warned)
    caplog.clear()
    with caplog.at_level("WARNING", logger=library_module.__name__):
        library_module.check_build_precision("fp32")  # fp32 measures nothing
    assert not caplog.records


@needs_bf16
def test_bf16_peak_loops_run_on_this_cpu() -> None:
    advice = library_module.bf16_advice()  # the real loops: a verdict, not an error
    assert advice is None or ("GFLOPS" in advice and "fp32 FMAs" in advice)


@needs_bf16
def test_bf16_bert_block_is_close_to_fp32_and_really_bf16(tmp_path: Path) -> None:
    model = build_sample_model("bert_block")
    manifest = build_library(model, ConfigBook(), tmp_path / "lib", precision="bf16")
    assert manifest["precision"] == "bf16"
    ops = [parse_workload(layer["workload"]) for layer in manifest["layers"]]
    dense = [w for w in ops if w.op == "dense_bf16"]
    assert len(dense) == 6 and all(w.data == "f32" for w in dense)  # type: ignore[attr-defined]
    assert {w.op for w in ops} == {"dense_bf16", "batch_matmul_bf16"}
    assert any(w.epilogue_spec.activation is not None for w in dense)  # GELU stays fused
    assert_bf16_close(model, tmp_path / "lib")


def conv_model() -> object:
    """3x3 conv + ReLU, a 1x1 conv whose sum with the first one's output is fused, a depthwise
    conv (stays fp32), and a strided 3x3 conv (odd channel count on the way in)."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
        helper.make_node("Add", ["c2", "r1"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["r2"]),
        helper.make_node("Conv", ["r2", "wd"], ["d3"], group=16, pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["d3", "w4", "b4"], ["y"], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
    ]
    weights = {"w1": w(16, 5, 3, 3), "b1": w(16), "w2": w(16, 16, 1, 1), "b2": w(16),
               "wd": w(16, 1, 3, 3), "w4": w(24, 16, 3, 3), "b4": w(24)}
    return make_model(nodes, {"x": (1, 5, 20, 18)}, {"y": None}, weights)


@needs_bf16
def test_bf16_convolutions_are_close_to_fp32_and_really_bf16(tmp_path: Path) -> None:
    model = conv_model()
    manifest = build_library(model, ConfigBook(), tmp_path / "lib", precision="bf16")
    ops = sorted(parse_workload(layer["workload"]).op for layer in manifest["layers"])
    assert ops == ["conv2d_bf16", "conv2d_bf16", "conv2d_bf16", "depthwise_conv2d"]
    fused = [layer["workload"] for layer in manifest["layers"]
             if "residual" in layer["workload"]]
    assert fused and fused[0].startswith("conv2d_bf16:")  # the addition stays fused
    assert_bf16_close(model, tmp_path / "lib")


def assert_bf16_close(model: object, library: Path) -> None:
    """At 1 and 2 threads, every output off onnxruntime's fp32 by what bf16 costs: 8 bits of
    mantissa, well off fp32's 1e-6, well within 1e-2."""
    for threads in (1, 2):
        runner = ModelRunner(model, KernelLibrary(library), threads)
        feeds = runner.random_feeds(0)
        ours, expected = runner.run(feeds), onnxruntime_outputs(model, feeds)
        for name, want in expected.items():
            error = float(np.max(np.abs(ours[name] - want))) / float(np.max(np.abs(want)))
            assert 1e-5 < error < 1e-2, (name, error)


@needs_bf16
def test_cli_builds_bf16_and_runs_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    model = tmp_path / "bert.onnx"
    model.write_bytes(sample_model_bytes("bert_block"))
    out = tmp_path / "lib"
    assert main(["build", str(model), "-o", str(out), "--precision", "bf16", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # 6 dense layers and the 2 attention products
    assert summary["precision"] == "bf16" and summary["bf16_layers"] == 8
    assert main(["run", str(model), "--library", str(out), "--iterations", "2", "--check",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 0 < report["check"]["max_rel_error"] < 1e-2


def test_a_library_naming_an_unknown_precision_is_refused(tmp_path: Path) -> None:
    model = build_sample_model("bert_block")
    build_library(model, ConfigBook(), tmp_path / "lib")
    manifest_path = tmp_path / "lib" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert "precision" not in manifest  # fp32 builds are as before
    manifest["precision"] = "fp8"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(LibraryError, match="unknown precision 'fp8'"):
        ModelRunner(model, KernelLibrary(tmp_path / "lib"), 1)
