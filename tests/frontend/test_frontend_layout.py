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
    # the global pool runs blocked: the transform out is of the pooled 1x1 map
    assert transforms[1].op.shape[2:] == (1, 1)
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


def test_channel_concat_of_whole_blocks_stays_blocked() -> None:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (16, 8, 1, 1)), ("w2", (8, 8, 3, 3)), ("w3", (4, 24, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["a", "b"], ["c"], axis=1),
             helper.make_node("Conv", ["c", "w3"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 5, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 5, 5])],
        initializer=weights)
    _, plan = _plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    (concat,) = [g for g in plan.generated if g.op.kind == "concat"]
    assert concat.output == "c@nchw8c"
    assert set(concat.inputs.values()) == {"a@nchw8c", "b@nchw8c"}
    assert [g.op.kind for g in plan.generated if g.op.kind.endswith("nchwc")] == [
        "to_nchwc", "from_nchwc"]  # the input x and the output y only


def test_a_one_element_activation_read_as_a_scalar_keeps_its_plain_form() -> None:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
               for n, s in (("w1", (8, 8, 1, 1)), ("w2", (1, 8, 4, 4)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["s"]),  # (1, 1, 1, 1)
             helper.make_node("Mul", ["a", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 4, 4])],
        initializer=weights)
    _, plan = _plan(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    (mul,) = [g for g in plan.generated if g.op.kind == "elementwise"]
    assert mul.output == "y@nchw8c" and "s" in mul.inputs.values()
    back = [g for g in plan.generated if g.op.kind == "from_nchwc"]
    assert {g.output for g in back} == {"s", "y"}
