"""Tasks of a blocked library (``extract_tasks(layout=..., block=...)``): the workloads the
``nchwc`` plan runs, so a library built blocked finds tuned records of its own kernels."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from schedule_templates.workloads.conv_nchwc import BlockedWindow  # noqa: E402
from tuner_service.compiler.frontend.errors import ModelError  # noqa: E402
from tuner_service.compiler.frontend.extract import extract_tasks, is_blocked  # noqa: E402
from tuner_service.compiler.frontend.fusion import plan_layers  # noqa: E402
from tuner_service.compiler.frontend.generated import plan_generated  # noqa: E402
from tuner_service.compiler.frontend.layout import blocked_workload, plan_layout  # noqa: E402
from tuner_service.compiler.frontend.loading import load_model  # noqa: E402
from tuner_service.compiler.frontend.samples import build_sample_model  # noqa: E402


@pytest.fixture(scope="module")
def mobilenet() -> bytes:
    return bytes(build_sample_model("mobilenet_v2").SerializeToString())


def test_nchwc_tasks_are_the_workloads_the_blocked_plan_runs(mobilenet: bytes) -> None:
    result = extract_tasks(mobilenet, layout="nchwc", block=8)
    assert {t.workload.op for t in result.tasks} == {
        "conv2d_nchwc", "depthwise_conv2d_nchwc", "dense"}
    proto = load_model(mobilenet)
    layers = plan_layers(proto)
    plan = plan_layout(proto, layers, plan_generated(proto, layers), 8)
    # every layer of the blocked plan is one of the tasks' fused variants, and nothing else is
    assert {key for t in result.tasks for key in t.variants} == {
        layer.workload.key for layer in plan.layers}
    assert sum(t.weight for t in result.tasks) == len(plan.layers)
    assert all(t.workload.block == 8 for t in result.tasks
               if isinstance(t.workload, BlockedWindow))
    assert result.total_flops() == extract_tasks(mobilenet).total_flops()


def test_auto_gives_both_plans_each_blocked_twin_after_its_plain_task(mobilenet: bytes) -> None:
    plain = extract_tasks(mobilenet).tasks
    blocked = extract_tasks(mobilenet, layout="nchwc", block=16).tasks
    auto = extract_tasks(mobilenet, layout="auto", block=16)
    assert [t for t in auto.tasks if not is_blocked(t.workload)] == plain
    assert set(auto.tasks) == set(plain) | set(blocked)
    assert len(auto.tasks) == len(plain) + sum(is_blocked(t.workload) for t in blocked)
    for before, task in zip(auto.tasks, auto.tasks[1:], strict=False):
        if is_blocked(task.workload):
            assert blocked_workload(before.workload, 16) == task.workload
            assert (before.nodes, before.weight) == (task.nodes, task.weight)
    # one inference's FLOPs: the twins compute the same layers as their plain tasks
    assert auto.total_flops() == extract_tasks(mobilenet).total_flops()


def test_a_depthwise_conv_with_a_channel_multiplier_stays_plain() -> None:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (16, 1, 3, 3)), ("w2", (8, 16, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["d"], group=8, pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["d", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 6, 6])],
        initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ops = [t.workload.op for t in extract_tasks(model, layout="nchwc", block=8).tasks]
    assert ops == ["depthwise_conv2d", "conv2d_nchwc"]


@pytest.mark.parametrize(("layout", "block", "message"), [
    ("nhwc", 8, "unknown layout 'nhwc'"),
    ("nchwc", None, "needs the channel block"),
    ("auto", 12, "not 12"),
])
def test_a_bad_layout_or_block_is_refused(mobilenet: bytes, layout: str, block: int | None,
                                          message: str) -> None:
    with pytest.raises(ModelError, match=message):
        extract_tasks(mobilenet, layout=layout, block=block)

