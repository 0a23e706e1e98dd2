"""Checking a layer plan against onnxruntime, shared by the fusion tests."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort

from schedule_templates.runtime import build
from schedule_templates.templates.base import get_template
from tuner_service.compiler.frontend.extract import extract_tasks
from tuner_service.compiler.frontend.fusion import Layer, plan_layers

ANCHORS = {"Conv", "Gemm", "MatMul"}


def ort_values(model: Any, feeds: dict[str, np.ndarray], names: set[str]) -> dict[str, Any]:
    """Every tensor in ``names`` as onnxruntime computes it (exposed as extra graph outputs)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output} | set(feeds)
    present |= {t.name for t in copy.graph.initializer}
    for name in sorted(names - present):
        copy.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                                    None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(copy.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    values = dict(zip(outputs, session.run(outputs, feeds), strict=True))
    values.update(feeds)
    values.update({t.name: onnx.numpy_helper.to_array(t) for t in copy.graph.initializer})
    return values


def kernel_inputs(layer: Layer, values: dict[str, Any]) -> dict[str, np.ndarray]:
    """The workload's inputs: constants first, else the named tensor reshaped."""
    shapes = layer.workload.input_shapes()
    out = {}
    for name, shape in shapes.items():
        if name in layer.constants:
            array = layer.constants[name]
            assert array.shape == shape and array.dtype == np.float32, name
        else:
            array = np.asarray(values[layer.inputs[name]], dtype=np.float32)
            assert array.size == int(np.prod(shape)), (name, array.shape, shape)
        out[name] = np.ascontiguousarray(array.reshape(shape))
    assert set(layer.inputs) | set(layer.constants) >= set(shapes)
    return out


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-3, atol=2e-4 * scale,
                               err_msg=what)


def check_plan(model: Any, feeds: dict[str, np.ndarray], compile_kernels: bool = False
               ) -> list[Layer]:
    layers = plan_layers(model)
    wanted = {layer.output for layer in layers}
    wanted |= {name for layer in layers for name in layer.inputs.values()}
    values = ort_values(model, feeds, wanted)
    for layer in layers:
        inputs = kernel_inputs(layer, values)
        want = values[layer.output]
        assert_close(layer.workload.reference(inputs), want, f"{layer.nodes}: numpy reference")
        if compile_kernels:
            assert_close(_run_kernel(layer, inputs), want, f"{layer.nodes}: compiled kernel")
    _check_structure(model, layers)
    return layers


def _run_kernel(layer: Layer, inputs: dict[str, np.ndarray]) -> np.ndarray:
    template = get_template(layer.workload.op)
    artifact = build(layer.workload, template, template.default_config(layer.workload))
    try:
        prepared = artifact.prepare(inputs)
        prepared.run()
        return np.array(prepared.output)
    finally:
        artifact.close()


def _check_structure(model: Any, layers: list[Layer]) -> None:
    nodes = {n.name or f"{n.op_type}_{i}": n for i, n in enumerate(model.graph.node)}
    covered = [name for layer in layers for name in layer.nodes]
    assert len(covered) == len(set(covered)), "a node belongs to two layers"
    for layer in layers:
        assert nodes[layer.nodes[0]].op_type in ANCHORS
        assert nodes[layer.nodes[-1]].output[0] == layer.output
    anchors = [layer.anchor_index for layer in layers]
    assert anchors == sorted(anchors)
    # one task per base workload, weighing every layer with that base, listing its variants
    weights = Counter(layer.workload.base_key for layer in layers)
    tasks = extract_tasks(model).tasks
    assert {t.workload.base_key: t.weight for t in tasks} == dict(weights)
    for task in tasks:
        keys = {layer.workload.key for layer in layers
                if layer.workload.base_key == task.workload.base_key}
        assert set(task.variants) == keys and task.workload.key in keys
