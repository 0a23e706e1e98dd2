"""The native executor: planned buffers, one C call per kernel segment, the same bits as the
step-by-step path, and the standalone C entry point (its example program built with cc)."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import assert_close, make_model, onnxruntime_outputs
from tuner_service.cli.main import main
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.kernel_step import ArgKind, KernelStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary
from tuner_service.compiler.deploy.memory_plan import BufferRequest, check_plan, plan_memory
from tuner_service.compiler.deploy.native import NativeError
from tuner_service.compiler.deploy.native_export import PROGRAM_FILE, WEIGHTS_FILE, export_model
from tuner_service.compiler.frontend.samples import SAMPLE_MODELS, build_sample_model


def conv_relu_gemm(middle: str | None = None) -> Any:
    """Conv + Relu, Flatten (a view), Gemm; ``middle`` puts that numpy operator after Relu."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu")]
    last = "r"
    if middle is not None:
        nodes.append(helper.make_node(middle, ["r"], ["m"], name="middle"))
        last = "m"
    nodes += [helper.make_node("Flatten", [last], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    weights = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
               "fc_w": rng.standard_normal((10, 8 * 6 * 6)).astype(np.float32) * 0.1,
               "fc_b": rng.standard_normal(10).astype(np.float32)}
    return make_model(nodes, {"x": (1, 3, 6, 6)}, {"y": (1, 10)}, weights)


def runner_for(model: Any, out: Path, threads: int = 1) -> ModelRunner:
    build_library(model, ConfigBook(), out)
    return ModelRunner(model, KernelLibrary(out), threads)


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# -- the memory plan -------------------------------------------------------------------------


def test_the_plan_never_overlaps_two_live_buffers() -> None:
    rng = np.random.default_rng(0)
    for _ in range(300):
        count = int(rng.integers(1, 30))
        requests = []
        for i in range(count):
            first = int(rng.integers(0, 40))
            requests.append(BufferRequest(f"b{i}", int(rng.integers(0, 5000)), first,
                                          first + int(rng.integers(0, 12))))
        plan = plan_memory(requests)
        check_plan(plan, requests)  # raises on an overlap or a misaligned offset
        peak = max(sum(r.size for r in requests if r.first <= t <= r.last) for t in range(52))
        assert peak <= plan.arena_bytes <= plan.total_bytes


def test_a_chain_reuses_memory_once_the_reader_ran() -> None:
    requests = [BufferRequest(f"t{i}", 1000, i, i + 1) for i in range(6)]
    plan = plan_memory(requests)
    check_plan(plan, requests)
    assert plan.arena_bytes == 2 * 1024  # two alive at a time, each rounded to 64 bytes
    assert plan.total_bytes == 6 * 1024
    # a reader never shares memory with what it writes (step i reads t(i-1), writes t(i))
    assert plan.offsets["t0"] != plan.offsets["t1"]


# -- the native path against the step path ------------------------------------------------


def test_views_do_not_split_the_program(tmp_path: Path) -> None:
    model = conv_relu_gemm()
    runner = runner_for(model, tmp_path)
    assert runner.native is not None
    assert [s.native for s in runner.plan.segments] == [True]  # Flatten became an alias
    feeds = runner.random_feeds(1)
    native = runner.run(feeds)
    assert_same(native, runner.run(feeds, native=False))
    assert_close(native, onnxruntime_outputs(model, feeds), rtol=1e-5)


def test_numpy_steps_split_the_program_into_segments(tmp_path: Path) -> None:
    model = conv_relu_gemm(middle="Sin")  # no kernel for Sin: it runs in numpy
    runner = runner_for(model, tmp_path)
    assert [s.native for s in runner.plan.segments] == [True, False, True]
    feeds = runner.random_feeds(2)
    first = runner.run(feeds)
    assert_same(first, runner.run(feeds, native=False))
    assert_same(first, runner.run(feeds))  # a second run rebinds the same buffers
    assert_close(first, onnxruntime_outputs(model, feeds), rtol=1e-5)


def test_a_concat_of_many_inputs_runs_natively(tmp_path: Path) -> None:
    """DenseNet-121's last concats join 25 tensors (26 pointer arguments with the output); the
    runtime dispatched at most 24 and ran the whole model step by step. 40 inputs here."""
    rng = np.random.default_rng(5)
    count = 40
    nodes = [helper.make_node("Relu", [f"x{i}"], [f"r{i}"], name=f"relu{i}")
             for i in range(count)]
    nodes.append(helper.make_node("Concat", [f"r{i}" for i in range(count)], ["y"],
                                  name="concat", axis=1))
    model = make_model(nodes, {f"x{i}": (1, 2, 3, 5) for i in range(count)},
                       {"y": (1, 2 * count, 3, 5)}, {})
    runner = runner_for(model, tmp_path)
    assert runner.native is not None and all(s.native for s in runner.plan.segments)
    feeds = {f"x{i}": rng.standard_normal((1, 2, 3, 5)).astype(np.float32) for i in range(count)}
    native = runner.run(feeds)
    assert_same(native, runner.run(feeds, native=False))
    assert_close(native, onnxruntime_outputs(model, feeds), rtol=1e-6)


@pytest.mark.parametrize("name", SAMPLE_MODELS)
def test_samples_run_natively_with_the_step_paths_results(tmp_path: Path, name: str) -> None:
    runner = runner_for(build_sample_model(name), tmp_path)
    assert runner.native is not None
    feeds = runner.random_feeds(0)
    assert_same(runner.run(feeds), runner.run(feeds, native=False))
    memory = runner.plan.memory
    if name == "resnet18":
        assert memory.arena_bytes < memory.total_bytes / 1.5


# -- the standalone program and the C example ----------------------------------------------


@pytest.fixture
def standalone(tmp_path: Path) -> tuple[Path, Any]:
    """A conv + relu + gemm library with its program, written by `tuner build --standalone`."""
    model = conv_relu_gemm()
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "lib"
    assert main(["build", str(path), "-o", str(out), "--standalone"]) == 0
    assert (out / PROGRAM_FILE).is_file() and (out / WEIGHTS_FILE).is_file()
    return out, model


def test_the_c_example_matches_the_python_runner(standalone: tuple[Path, Any], example: Path,
                                                 tmp_path: Path) -> None:
    out, model = standalone
    runner = ModelRunner(model, KernelLibrary(out), 1)
    feeds = runner.random_feeds(5)
    (tmp_path / "in.bin").write_bytes(feeds["x"].tobytes())
    done = subprocess.run([str(example), str(out), "-i", str(tmp_path / "in.bin"), "-o",
                           str(tmp_path / "out.bin"), "-n", "3"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "output y: 10 floats" in done.stdout and "median" in done.stdout
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32)
    np.testing.assert_allclose(got, runner.run(feeds)["y"].reshape(-1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["nchw", "nchwc"])
def test_the_c_example_runs_a_quantized_model(example: Path, tmp_path: Path, layout: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A QDQ model in the standalone program: its int8 kernels and glue read and write uint8
    buffers of the arena, their packed weights are bytes of the weights file; the C example
    gives the Python runner's output exactly, with int8 activations channels-last too
    (``nchwc``, planned here whatever the host multiplies with)."""
    from tests.frontend.quantized_models import feeds, quantized
    from tuner_service.compiler.deploy import library
    from tuner_service.compiler.deploy.int8_step import Int8KernelStep

    monkeypatch.setattr(library, "int8_channels_last", lambda proto: True)
    path = quantized(tmp_path, "qdq", residual=True)
    out = tmp_path / "lib"
    assert main(["build", str(path), "-o", str(out), "--layout", layout, "--standalone"]) == 0
    runner = ModelRunner(path, KernelLibrary(out), 1)
    laid = [s for s in runner.steps if isinstance(s, Int8KernelStep)
            and "in_layout=nhwc" in s.kernel.workload.key]
    assert bool(laid) == (layout == "nchwc")
    x = feeds(3)
    (tmp_path / "in.bin").write_bytes(np.ascontiguousarray(x["x"], np.float32).tobytes())
    done = subprocess.run([str(example), str(out), "-i", str(tmp_path / "in.bin"), "-o",
                           str(tmp_path / "out.bin"), "-n", "2"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32)
    np.testing.assert_array_equal(got, runner.run(x)["y"].reshape(-1))


def _open(directory: Path) -> int:
    lib = ctypes.CDLL(str(directory / "libmodel.so"))
    handle = ctypes.c_void_p()
    lib.tuner_model_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    code = int(lib.tuner_model_open(str(directory).encode(), ctypes.byref(handle)))
    if code == 0:
        lib.tuner_model_free.argtypes = [ctypes.c_void_p]
        lib.tuner_model_free(handle)
    return code


def test_malformed_files_are_error_codes(standalone: tuple[Path, Any], example: Path) -> None:
    out, _ = standalone
    program, weights = (out / PROGRAM_FILE).read_bytes(), (out / WEIGHTS_FILE).read_bytes()
    assert _open(out) == 0
    cases = {  # what is written -> the code tuner_model_open returns
        "truncated program": (program[: len(program) // 2], weights, 2),
        "flipped byte": (program[:40] + bytes([program[40] ^ 1]) + program[41:], weights, 2),
        "empty program": (b"", weights, 2),
        "truncated weights": (program, weights[:-100], 2),
        "other weights": (program, weights[:-4] + b"\x00\x00\x80\x3f", 3),
    }
    for case, (p, w, code) in cases.items():
        (out / PROGRAM_FILE).write_bytes(p)
        (out / WEIGHTS_FILE).write_bytes(w)
        assert _open(out) == code, case
    done = subprocess.run([str(example), str(out)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1 and "code 3" in done.stderr  # a message, not a crash
    (out / WEIGHTS_FILE).unlink()
    assert _open(out) == 1


def test_a_model_with_numpy_steps_cannot_be_exported(tmp_path: Path) -> None:
    model = conv_relu_gemm(middle="Sin")
    build_library(model, ConfigBook(), tmp_path)
    with pytest.raises(NativeError, match="Sin"):
        export_model(model, tmp_path)


def test_a_tensor_that_is_not_dense_is_copied_into_its_planned_buffer(tmp_path: Path) -> None:
    runner = runner_for(conv_relu_gemm(), tmp_path)
    assert runner.native is not None
    feeds = runner.random_feeds(4)
    want = runner.run(feeds)
    env = {**runner.constants, "x": np.asfortranarray(feeds["x"])}  # not C-contiguous: staged
    runner.native.run(env)
    np.testing.assert_array_equal(env["y"], want["y"])


def test_a_library_without_the_runtime_runs_step_by_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import tuner_service.compiler.deploy.executor as executor

    def refuse(*args: Any) -> Any:
        raise NativeError("libmodel.so has no native runtime")

    monkeypatch.setattr(executor, "NativeProgram", refuse)
    model = conv_relu_gemm()
    runner = runner_for(model, tmp_path)
    assert runner.native is None and "step by step" in caplog.text
    feeds = runner.random_feeds(0)
    assert_close(runner.run(feeds), onnxruntime_outputs(model, feeds), rtol=1e-5)


def test_kernels_that_over_read_read_their_inputs_in_place(tmp_path: Path) -> None:
    """197 rows (prime) are computed as 200: a dense over-reads its input and residual by 3
    rows. Before, the program copied each such input into a buffer with slack (95 MB a run of
    ViT-B/16); now the planned buffer itself carries the slack, zeroed before the read, and
    only that slack is written: the same bits as the step path, which still copies."""
    rng = np.random.default_rng(11)
    rows, width, hidden = 197, 48, 80
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),  # generated: no slack
             helper.make_node("MatMul", ["r", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="fc1_bias"),
             helper.make_node("MatMul", ["hb", "w2"], ["o"], name="fc2"),  # reads a kernel's
             helper.make_node("Add", ["o", "r"], ["y"], name="residual")]  # and relu's output
    weights = {"w1": rng.standard_normal((width, hidden)).astype(np.float32) * 0.2,
               "b1": rng.standard_normal(hidden).astype(np.float32),
               "w2": rng.standard_normal((hidden, width)).astype(np.float32) * 0.2}
    model = make_model(nodes, {"x": (1, rows, width)}, {"y": (1, rows, width)}, weights)
    runner = runner_for(model, tmp_path)
    assert runner.native is not None
    plan = runner.plan
    assert plan.read_extent, "no kernel over-reads: the test lost its subject"
    copied = [r.aux for s in plan.segments for r in s.records if r.kind == 1]
    assert copied and max(copied) <= 3 * hidden * 4  # slack rows only, never a whole tensor
    for seed in (0, 1):
        feeds = runner.random_feeds(seed)
        native = runner.run(feeds)
        assert_same(native, runner.run(feeds, native=False))
        assert_close(native, onnxruntime_outputs(model, feeds), rtol=1e-5)
    staging = [a.buffer for s in runner.steps if isinstance(s, KernelStep) for a in s.args
               if a.kind is ArgKind.STAGED and a.tensor in plan.roots]
    assert staging and not any(b.any() for b in staging)  # the step path read in place too
