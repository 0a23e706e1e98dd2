"""The operators popular models use beyond the basic set (``ops_image``, ``ops_misc``) match
onnxruntime on odd shapes, and none of them silently falls back to the reference evaluator."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.deploy.conftest import RunModel, assert_close, make_model

RNG = np.random.default_rng(11)


def _single(op: str, x_shape: tuple[int, ...], extra: dict[str, np.ndarray] | None = None,
            opset: int = 18, outputs: int = 1, cast: bool = False, **attrs: Any) -> Any:
    """One ``op`` node on input x (plus constant ``extra`` inputs; an empty name keeps a slot
    empty); ``cast`` converts its (boolean or integer) outputs to float for the comparison."""
    extra = extra or {}
    names = [f"y{i}" if i else "y" for i in range(outputs)]
    produced = [f"raw{i}" for i in range(outputs)] if cast else names
    nodes = [helper.make_node(op, ["x", *extra], produced, name=f"the_{op.lower()}", **attrs)]
    if cast:
        nodes += [helper.make_node("Cast", [raw], [name], name=f"cast_{name}",
                                   to=onnx.TensorProto.FLOAT)
                  for raw, name in zip(produced, names, strict=True)]
    weights = {k: v for k, v in extra.items() if k}
    return make_model(nodes, {"x": x_shape}, dict.fromkeys(names), weights, opset=opset)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def _resize(shape: tuple[int, ...], scales: np.ndarray | None = None,
            sizes: np.ndarray | None = None, opset: int = 18, **attrs: Any) -> Any:
    extra = {"": np.zeros(0, np.float32), "scales": scales if scales is not None
             else np.zeros(0, np.float32)}
    if sizes is not None:
        extra = {"": np.zeros(0, np.float32), "scales_empty": np.zeros(0, np.float32),
                 "sizes": sizes}
    return _single("Resize", shape, extra, opset=opset, **attrs)


IMAGE = [
    _resize((1, 2, 5, 7), _f32(1, 1, 2, 2)),
    _resize((1, 2, 5, 7), _f32(1, 1, 2, 3), coordinate_transformation_mode="asymmetric",
            nearest_mode="floor"),
    _resize((1, 3, 5, 7), sizes=_i64(1, 3, 8, 11), mode="linear"),
    _resize((1, 3, 5, 7), sizes=_i64(1, 3, 9, 4), mode="linear",
            coordinate_transformation_mode="align_corners"),
    _resize((2, 3, 9, 7), _f32(1, 1, 0.5, 0.75), mode="linear",
            coordinate_transformation_mode="pytorch_half_pixel"),
    _resize((1, 2, 5, 7), sizes=_i64(1, 2, 11, 6), nearest_mode="round_prefer_ceil",
            coordinate_transformation_mode="half_pixel_symmetric", opset=19),
    _single("Upsample", (1, 2, 3, 5), {"scales": _f32(1, 1, 2, 3)}, opset=9),
    _single("PRelu", (1, 3, 5, 7), {"slope": RNG.standard_normal((3, 1, 1)).astype(np.float32)}),
    _single("PRelu", (2, 5, 7), {"slope": _f32(0.25)}),
    _single("InstanceNormalization", (2, 3, 5, 7),
            {"s": RNG.uniform(0.5, 1.5, 3).astype(np.float32), "b": _f32(0.1, -0.2, 0.3)},
            epsilon=1e-3),
    _single("LRN", (1, 7, 4, 5), size=5, alpha=1e-2, beta=0.75, bias=2.0),
    _single("LRN", (1, 6, 3, 3), size=3),
    _single("DepthToSpace", (1, 8, 3, 5), blocksize=2),
    _single("DepthToSpace", (1, 8, 3, 5), blocksize=2, mode="CRD"),
    _single("SpaceToDepth", (1, 3, 6, 4), blocksize=2),
    _single("Einsum", (2, 3, 5), {"w": RNG.standard_normal((2, 5, 7)).astype(np.float32)},
            equation="bij, bjk -> bik"),
    _single("Einsum", (2, 3, 5, 4), {"k": RNG.standard_normal((2, 3, 6, 4)).astype(np.float32)},
            equation="bhqd,bhkd->bhqk"),
]

ELEMENTWISE = [
    *(_single(op, (3, 5, 7)) for op in ("Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish",
                                          "Sin", "Cos", "Sign", "Round")),
    _single("Elu", (3, 5), alpha=0.5),
    _single("ThresholdedRelu", (3, 5), alpha=0.3),
    _single("GreaterOrEqual", (3, 5), {"c": _f32(0.1)}, cast=True),
    _single("LessOrEqual", (3, 5), {"c": _f32(-0.1)}, cast=True),
    _single("IsNaN", (3, 5), cast=True),
    _single("IsInf", (3, 5), cast=True, detect_negative=0),
    _single("Mean", (3, 5), {"m": RNG.standard_normal((1, 5)).astype(np.float32)}),
]

REDUCTIONS = [
    _single(op, (3, 5, 7), {"axes": _i64(axis)}, keepdims=keep)
    for op, axis, keep in (("ReduceL1", 1, 1), ("ReduceL2", -1, 0), ("ReduceProd", 0, 1),
                           ("ReduceSumSquare", 2, 0), ("ReduceLogSumExp", 1, 1))
]

INDEXING = [
    _single("CumSum", (3, 5, 7), {"axis": _i64(1)}),
    _single("CumSum", (3, 5, 7), {"axis": _i64(-1)}, exclusive=1, reverse=1),
    _single("ArgMax", (3, 5, 7), cast=True, axis=1, keepdims=0),
    _single("ArgMin", (3, 5, 7), cast=True, axis=-1, select_last_index=1),
    _single("TopK", (3, 7, 5), {"k": _i64(3)}, outputs=2, cast=True, axis=1),
    _single("TopK", (3, 7), {"k": _i64(2)}, outputs=2, cast=True, largest=0),
    _single("Trilu", (2, 5, 7), {"k": _i64(1)}),
    _single("Trilu", (5, 7), {"k": _i64(-2)}, upper=0),
    _single("GatherElements", (3, 5), {"i": RNG.integers(-3, 3, (3, 4)).astype(np.int64)},
            axis=0),
    _single("GatherND", (3, 5, 7), {"i": np.array([[[1, -1], [0, 2]]], np.int64)}),
    _single("GatherND", (2, 5, 7), {"i": np.array([[[4], [0]], [[1], [3]]], np.int64)},
            batch_dims=1),
    _single("GatherND", (2, 3, 5), {"i": np.array([[1, 2, 4], [0, 0, -1]], np.int64)}),
    _single("Size", (3, 5, 7), cast=True),
]


def _after_round(op: str, outputs: int, extra: dict[str, np.ndarray] | None = None,
                 **attrs: Any) -> Any:
    """``op`` on Round(x): standard-normal inputs rounded tie a lot, which exercises the
    tie-breaking rules (select_last_index, TopK's lower index first)."""
    extra = extra or {}
    names = [f"y{i}" if i else "y" for i in range(outputs)]
    raws = [f"raw{i}" for i in range(outputs)]
    nodes = [helper.make_node("Round", ["x"], ["r"], name="round"),
             helper.make_node(op, ["r", *extra], raws, name=f"tied_{op.lower()}", **attrs),
             *(helper.make_node("Cast", [raw], [name], name=f"cast_{name}",
                                to=onnx.TensorProto.FLOAT)
               for raw, name in zip(raws, names, strict=True))]
    return make_model(nodes, {"x": (4, 9)}, dict.fromkeys(names), extra, opset=18)


TIES = [
    _after_round("ArgMax", 1, axis=1, select_last_index=1),
    _after_round("ArgMin", 1, axis=0, keepdims=0),
    _after_round("TopK", 2, {"k": _i64(5)}, axis=1),
    _after_round("TopK", 2, {"k": _i64(3)}, axis=0, largest=0),
]


def _id(model: Any) -> str:
    node = model.graph.node[1 if model.graph.node[0].name == "round" else 0]
    extra = ",".join(f"{a.name}={helper.get_attribute_value(a)!r}" for a in node.attribute
                     if a.name != "equation")
    return f"{node.op_type}[{extra}]"


@pytest.mark.parametrize("model", IMAGE + ELEMENTWISE + REDUCTIONS + INDEXING + TIES, ids=_id)
def test_operator_matches_onnxruntime(run_model: RunModel, model: Any,
                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="tuner_service.compiler.deploy"):
        got, want = run_model(model)
    assert "reference evaluator" not in caplog.text  # ours ran it, not the fallback
    assert_close(got, want, rtol=2e-5)


def test_cubic_resize_is_refused_by_ours_and_runs_in_the_reference_evaluator(
        run_model: RunModel, caplog: pytest.LogCaptureFixture) -> None:
    model = _resize((1, 2, 5, 7), _f32(1, 1, 2, 2), mode="cubic")
    with caplog.at_level("WARNING", logger="tuner_service.compiler.deploy"):
        got, want = run_model(model)
    assert "Resize" in caplog.text and "reference evaluator" in caplog.text
    assert "cubic" in caplog.text
    assert_close(got, want, rtol=1e-4)
