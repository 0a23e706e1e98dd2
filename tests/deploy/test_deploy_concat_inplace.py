"""Channel concats written in place (``deploy/concat_inplace.py``): the kernels that produce a
concat's inputs write into its buffer, the concat copies nothing, and every path (native, step
by step, the standalone C program) gives onnxruntime's results."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import helper

from tests.deploy.conftest import assert_close, make_model, onnxruntime_outputs
from tuner_service.cli.main import main
from tuner_service.compiler.deploy.concat_inplace import PlacedConcat
from tuner_service.compiler.deploy.configs import ConfigBook
from tuner_service.compiler.deploy.executor import ModelRunner
from tuner_service.compiler.deploy.generated_step import GeneratedStep
from tuner_service.compiler.deploy.library import build_library
from tuner_service.compiler.deploy.loader import KernelLibrary

RNG = np.random.default_rng(8)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def fire(batch: int = 1, size: int = 9) -> Any:
    """SqueezeNet's fire module: squeeze 1x1, then 1x1 and 3x3 expansions concatenated, then a
    1x1 conv reading the concat (and the concat is an output too)."""
    nodes = [
        helper.make_node("Conv", ["x", "ws", "bs"], ["s"]),
        helper.make_node("Relu", ["s"], ["sr"]),
        helper.make_node("Conv", ["sr", "we1", "be1"], ["e1"]),
        helper.make_node("Relu", ["e1"], ["e1r"]),
        helper.make_node("Conv", ["sr", "we3", "be3"], ["e3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["e3"], ["e3r"]),
        helper.make_node("Concat", ["e1r", "e3r"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "wo"], ["y"]),
    ]
    weights = {"ws": _w(16, 32, 1, 1), "bs": _w(16), "we1": _w(32, 16, 1, 1), "be1": _w(32),
               "we3": _w(32, 16, 3, 3), "be3": _w(32), "wo": _w(16, 64, 1, 1)}
    return make_model(nodes, {"x": (batch, 32, size, size)},
                      {"y": (batch, 16, size, size), "cat": (batch, 64, size, size)}, weights)


def dense_block() -> Any:
    """DenseNet's pattern: each layer reads the concat of every earlier feature map."""
    nodes = [helper.make_node("Conv", ["x", "w0"], ["f0"]),
             helper.make_node("Conv", ["f0", "w1"], ["f1"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["f0", "f1"], ["c1"], axis=1),
             helper.make_node("Relu", ["c1"], ["c1r"]),
             helper.make_node("Conv", ["c1r", "w2"], ["f2"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["f0", "f1", "f2"], ["c2"], axis=1),
             helper.make_node("Relu", ["c2"], ["c2r"]),
             helper.make_node("Conv", ["c2r", "w3"], ["f3"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["f0", "f1", "f2", "f3"], ["c3"], axis=1),
             helper.make_node("GlobalAveragePool", ["c3"], ["y"])]
    weights = {"w0": _w(32, 8, 1, 1), "w1": _w(16, 32, 3, 3), "w2": _w(16, 48, 3, 3),
               "w3": _w(16, 64, 3, 3)}
    return make_model(nodes, {"x": (1, 8, 8, 8)}, {"y": (1, 80, 1, 1), "c1": (1, 48, 8, 8)},
                      weights)


def _runner(model: Any, out: Path, layout: str = "nchw", threads: int = 1) -> ModelRunner:
    build_library(model, ConfigBook(), out, layout=layout)
    return ModelRunner(model, KernelLibrary(out), threads)


def _check(runner: ModelRunner, model: Any) -> None:
    feeds = runner.random_feeds(3)
    native = runner.run(feeds)
    step_by_step = runner.run(feeds, native=False)
    for name in native:
        np.testing.assert_array_equal(native[name], step_by_step[name], err_msg=name)
    assert_close(native, onnxruntime_outputs(model, feeds), rtol=1e-5)


def _copies(runner: ModelRunner) -> int:
    return sum(1 for s in runner.steps if isinstance(s, GeneratedStep) and s.op.kind == "concat")


@pytest.mark.parametrize("layout, threads", [("nchw", 1), ("nchw", 2), ("nchwc", 1)])
def test_fire_module_writes_its_concat_in_place(tmp_path: Path, layout: str,
                                                threads: int) -> None:
    model = fire()
    runner = _runner(model, tmp_path, layout, threads)
    assert _copies(runner) == 0 and len(runner.plan.in_place.views) == 1
    assert sum(isinstance(s, PlacedConcat) for s in runner.steps) == 1
    assert runner.native is not None and all(s.native for s in runner.plan.segments)
    plan = runner.plan
    (cat,) = plan.in_place.views.values()
    parts = [name for name, (root, _) in plan.in_place.placed.items() if root == cat and
             name != cat]
    assert len(parts) == 2
    offsets = sorted(plan.offset_of(name) for name in parts)
    assert offsets[0] == plan.offset_of(cat) and offsets[1] > offsets[0]
    _check(runner, model)


def test_a_dense_block_places_every_feature_map_once(tmp_path: Path) -> None:
    """The longest concat owns the buffer; the shorter ones are views of its first bytes."""
    model = dense_block()
    runner = _runner(model, tmp_path)
    in_place = runner.plan.in_place
    assert _copies(runner) == 0 and len(in_place.views) == 3 and list(in_place.root_bytes) == [
        "c3"]
    assert {in_place.placed[name] for name in ("c1", "c2")} == {("c3", 0)}
    sizes = [4 * n * 64 for n in (32, 16, 16)]  # f0, f1, f2 bytes
    assert [in_place.placed[f][1] for f in ("f0", "f1", "f2", "f3")] == [
        0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
    _check(runner, model)


@pytest.mark.parametrize("order", ["inner_first", "outer_first"])
def test_a_concat_of_a_concat_keeps_every_slice_written(tmp_path: Path, order: str) -> None:
    """``inner = [a, b]`` feeds ``outer = [inner, c]`` (and a Relu): whichever concat claims
    the tensors first, every byte of both outputs is written."""
    # the longer list claims first: three inputs against two
    inner, outer = (["a", "b", "d"], ["inner", "c"]) if order == "inner_first" else (
        ["a", "b"], ["inner", "c", "d"])
    nodes = [helper.make_node("Conv", ["x", f"w{t}"], [t]) for t in "abcd"]
    nodes += [helper.make_node("Concat", inner, ["inner"], axis=1),
              helper.make_node("Concat", outer, ["outer"], axis=1),
              helper.make_node("Relu", ["inner"], ["y"])]
    model = make_model(nodes, {"x": (1, 16, 4, 4)},
                       {"y": (1, 16 * len(inner), 4, 4), "outer": (1, 64, 4, 4)},
                       {f"w{t}": _w(16, 16, 1, 1) for t in "abcd"})
    runner = _runner(model, tmp_path)
    assert runner.plan.in_place.views  # one of the two is written in place
    _check(runner, model)


@pytest.mark.parametrize("case", ["batch", "graph_input", "duplicate", "unaligned"])
def test_concats_that_cannot_be_placed_still_copy(tmp_path: Path, case: str) -> None:
    if case == "batch":  # two images: the inputs interleave in the output
        model = fire(batch=2)
    else:
        # unaligned: 3 x 5 x 5 floats, the second input would start off a 64-byte boundary
        channels = 3 if case == "unaligned" else 16
        second = {"graph_input": "x", "duplicate": "a", "unaligned": "b"}[case]
        model = make_model(
            [helper.make_node("Conv", ["x", "w"], ["a"]),
             helper.make_node("Conv", ["x", "w"], ["b"]),
             helper.make_node("Concat", ["a", second], ["cat"], axis=1),
             helper.make_node("Relu", ["cat"], ["y"])],
            {"x": (1, 16, 5, 5)}, {"y": (1, 16 + channels if case == "graph_input"
                                        else 2 * channels, 5, 5)},
            {"w": _w(channels, 16, 1, 1)})
    runner = _runner(model, tmp_path)
    assert _copies(runner) == 1 and not runner.plan.in_place.views
    _check(runner, model)


def test_the_c_example_runs_a_concat_written_in_place(example: Path, tmp_path: Path) -> None:
    model = fire()
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "lib"
    assert main(["build", str(path), "-o", str(out), "--standalone", "--layout", "nchw"]) == 0
    runner = ModelRunner(model, KernelLibrary(out), 1)
    assert runner.plan.in_place.views
    feeds = runner.random_feeds(6)
    want = runner.run(feeds)
    (tmp_path / "in.bin").write_bytes(feeds["x"].tobytes())
    done = subprocess.run([str(example), str(out), "-i", str(tmp_path / "in.bin"), "-o",
                           str(tmp_path / "out.bin"), "-n", "2"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = np.fromfile(tmp_path / "out.bin", dtype=np.float32)
    expected = np.concatenate([want[o.name].reshape(-1) for o in model.graph.output])
    np.testing.assert_array_equal(got, expected)
