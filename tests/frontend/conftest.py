"""Fixtures for the ONNX frontend tests: sample models (built once) and a tiny-graph factory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

TinyModel = Callable[..., Any]


@pytest.fixture(scope="session")
def sample_model() -> Callable[[str], Any]:
    """Build each sample model at most once per session (ResNet-18 takes most of a second)."""
    from tuner_service.compiler.frontend.samples import build_sample_model

    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            cache[name] = build_sample_model(name)
        return cache[name]

    return get


def _value(name: str, shape: Sequence[int | str], elem_type: int) -> Any:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def build_tiny_model(
    nodes: Sequence[Any],
    inputs: dict[str, Sequence[int | str]],
    outputs: dict[str, Sequence[int | str] | None],
    weights: dict[str, np.ndarray] | None = None,
    elem_type: int = 1,
    opset: int = 17,
) -> Any:
    """A one-graph model; outputs with shape None get the shape inference gives them (the
    checker wants every graph output to have a shape)."""
    graph = helper.make_graph(
        list(nodes),
        "tiny",
        [_value(n, s, elem_type) for n, s in inputs.items()],
        [
            helper.make_tensor_value_info(n, elem_type, None if s is None else list(s))
            for n, s in outputs.items()
        ],
        initializer=[numpy_helper.from_array(a, n) for n, a in (weights or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    if all(shape is not None for shape in outputs.values()):
        return model
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
    for output in model.graph.output:
        if output.name in inferred and not output.type.tensor_type.HasField("shape"):
            output.CopyFrom(inferred[output.name])
    return model


@pytest.fixture
def tiny_model() -> TinyModel:
    return build_tiny_model
