"""Turn untrusted upload bytes into a checked, shape-inferred ``onnx.ModelProto``.

Every failure of onnx or protobuf on a bad input becomes a ``ModelError`` with a sentence the
uploader can act on. Tensors stored outside the model (external data) are refused before onnx
sees them: resolving them would read paths named by the uploader from the server's disk.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import onnx
import onnx.checker
import onnx.inliner
import onnx.shape_inference
from google.protobuf.message import DecodeError

from tuner_service.frontend.errors import ModelError

logger = logging.getLogger(__name__)

# What onnx's C++ core raises for a model it rejects; nothing here is a bug of ours.
_ONNX_REJECTIONS: tuple[type[Exception], ...] = (
    onnx.checker.ValidationError,
    onnx.shape_inference.InferenceError,
    ValueError,
    RuntimeError,
)


def load_model(model: bytes | bytearray | memoryview | onnx.ModelProto) -> onnx.ModelProto:
    """Parse (if bytes), check, inline local functions and infer every intermediate shape.

    The returned proto is a new object; a ``ModelProto`` passed in is not modified. onnx's
    checker and shape inference are given serialized bytes: for a model of tens of MB that is
    several times faster than handing them a Python proto, which they would serialize again.
    """
    data, proto = _parse(model)
    refuse_external_data(proto)
    refuse_negative_dims(proto)
    _check(data)
    if len(proto.functions):
        data = _inline_functions(proto).SerializeToString()
    return _infer_shapes(data)


def _parse(
    model: bytes | bytearray | memoryview | onnx.ModelProto,
) -> tuple[bytes, onnx.ModelProto]:
    """The model as bytes and as a proto (for our own inspection)."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString(), model
    if not isinstance(model, bytes | bytearray | memoryview):
        raise TypeError(f"expected ONNX bytes or an onnx.ModelProto, got {type(model).__name__}")
    data = bytes(model)
    if not data:
        raise ModelError("the model file is empty")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        raise ModelError(
            f"not an ONNX model: the {len(data)}-byte file is not a valid ONNX protobuf "
            "(corrupt, truncated, or another format)"
        ) from e
    if not proto.HasField("graph") or not proto.ir_version:
        raise ModelError("not an ONNX model: the file has no graph or no IR version")
    return data, proto


def refuse_external_data(proto: onnx.ModelProto) -> None:
    """Raise ModelError if any tensor points at data outside the uploaded bytes."""
    for where, tensor in _all_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            raise ModelError(
                f"tensor {tensor.name or '(unnamed)'!r} in {where} stores its data in an external "
                "file; upload a self-contained model (onnx.save with save_as_external_data=False)"
            )


def refuse_negative_dims(proto: onnx.ModelProto) -> None:
    """Raise ModelError for a declared negative dimension (onnx's checker lets them pass)."""
    graph = proto.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if not info.type.HasField("tensor_type"):
            continue
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise ModelError(f"tensor {info.name!r} declares dimension {dim.dim_value} at "
                                 f"axis {axis}; dimensions cannot be negative")
    for tensor in graph.initializer:
        if any(d < 0 for d in tensor.dims):
            raise ModelError(f"initializer {tensor.name!r} declares negative dimensions "
                             f"{list(tensor.dims)}")


def _all_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    yield from _graph_tensors(proto.graph, f"graph {proto.graph.name or '(unnamed)'!r}")
    for function in proto.functions:
        where = f"function {function.name!r}"
        for node in function.node:
            yield from _node_tensors(node, where)


def _graph_tensors(graph: onnx.GraphProto, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    for tensor in graph.initializer:
        yield where, tensor
    for sparse in graph.sparse_initializer:
        yield where, sparse.values
        yield where, sparse.indices
    for node in graph.node:
        yield from _node_tensors(node, where)


def _node_tensors(node: onnx.NodeProto, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield where, attr.t
        yield from ((where, t) for t in attr.tensors)
        if attr.HasField("sparse_tensor"):
            yield where, attr.sparse_tensor.values
            yield where, attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield where, sparse.values
            yield where, sparse.indices
        # Control-flow bodies (If, Loop, Scan) carry their own initializers and constants.
        subgraphs = [attr.g] if attr.HasField("g") else []
        for sub in [*subgraphs, *attr.graphs]:
            yield from _graph_tensors(sub, f"subgraph {sub.name or '(unnamed)'!r} of {where}")


def _check(data: bytes) -> None:
    try:
        onnx.checker.check_model(data)
    except _ONNX_REJECTIONS as e:
        raise ModelError(f"invalid ONNX model: {_first_line(e)}") from e


def _inline_functions(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Inline model-local functions so that their Conv/MatMul nodes are visible to extraction."""
    try:
        return onnx.inliner.inline_local_functions(proto)
    except _ONNX_REJECTIONS as e:
        raise ModelError(f"cannot inline the model's local functions: {_first_line(e)}") from e


def _infer_shapes(data: bytes) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(
            data, check_type=True, strict_mode=True, data_prop=True
        )
    except _ONNX_REJECTIONS as e:
        raise ModelError(f"the model's tensor shapes cannot be inferred: {_first_line(e)}") from e


def _first_line(error: Exception) -> str:
    """onnx's messages are multi-line dumps; the first line is the sentence that matters."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
