"""The layout pass on plans: which layers run blocked and where transforms go."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tuner_service.compiler.frontend.fusion import plan_layers
from tuner_service.compiler.frontend.generated import plan_generated
from tuner_service.compiler.frontend.layout import blocked_name, plan_layout
from tuner_service.compiler.frontend.loading import load_model
from tuner_service.compiler.frontend.samples import build_sample_model


def _plan(model: onnx.ModelProto, block: int = 8):  # type: ignore[no-untyped-def]
    proto = load_model(model)
    layers = plan_layers(proto)
    return layers, plan_layout(proto, layers, plan_generated(proto, layers), block)


def test_mobilenet_v2_is_blocked_between_its_input_and_its_pooling() -> None:
    layers, plan = _plan(build_sample_model("mobilenet_v2"))
    ops = [layer.workload.op for layer in plan.layers]
    assert ops.count("dense") == 1  # the classifier stays plain
    assert all(op.endswith("_nchwc") for op in ops if op != "dense")
    transforms = [g for g in plan.generated if g.op.kind in ("to_nchwc", "from_nchwc")]
    assert [g.op.kind for g in transforms] == ["to_nchwc", "from_nchwc"]
    assert plan.transforms == 2 and transforms[0].last_index == -1
    # every blocked conv reads blocked activations (its residual too) and writes one
    for before, after in zip(layers, plan.layers, strict=True):
        if after.workload.op.endswith("_nchwc"):
            assert after.output == blocked_name(before.output, 8)
            assert after.inputs["data"].endswith("@nchw8c")
            assert after.inputs.get("residual", "@nchw8c").endswith("@nchw8c")
            if "bias" in after.constants:
                assert after.constants["bias"].size % 8 == 0


def test_a_chain_that_could_make_padding_nan_stays_plain() -> None:
    w = numpy_helper.from_array(np.ones((16, 16, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("Div", ["c", "c"], ["d"]),  # 0 / 0 in a padded lane
             helper.make_node("Conv", ["d", "w"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16, 4, 4])],
        initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _, plan = _plan(model)
    kinds = [g.op.kind for g in plan.generated]
    # the Div chain reads c plain (a from_nchwc) and feeds the second conv through a to_nchwc;
    # the output y goes back to NCHW
    assert kinds.count("from_nchwc") == 2 and kinds.count("to_nchwc") == 2
    div = next(g for g in plan.generated if g.op.kind == "elementwise")
    assert set(div.inputs.values()) == {"c"} and div.output == "d"
