"""Turn an untrusted model (bytes, a proto, or a file path) into a checked, shape-inferred
``onnx.ModelProto`` with every dimension made static that can be.

Every failure of onnx or protobuf on a bad input becomes a ``ModelError`` with a sentence the
uploader can act on. Tensors stored outside the model (external data) are read only from the
model's own folder (a path) or from the archive it came in (``archive``), after checks that
keep the reads inside it (``external``); a model given as bare bytes may not reference files.
Pinned input shapes are written into the graph before inference, and shape computations are
folded after it (``shapes``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnx.checker
import onnx.inliner
import onnx.shape_inference
from google.protobuf.message import DecodeError

from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.external import (
    DataFiles,
    FolderFiles,
    all_tensors,
    embed_external_data,
)
from tuner_service.compiler.frontend.quantized import is_quantized, rewrite_quantized
from tuner_service.compiler.frontend.shapes import InputShapes, fold_shapes, pin_input_shapes

logger = logging.getLogger(__name__)

#: what ``load_model`` accepts: serialized bytes, a proto, or the path of a ``.onnx`` file
ModelInput = bytes | bytearray | memoryview | onnx.ModelProto | Path

# What onnx's C++ core raises for a model it rejects; nothing here is a bug of ours.
_ONNX_REJECTIONS: tuple[type[Exception], ...] = (
    onnx.checker.ValidationError,
    onnx.shape_inference.InferenceError,
    ValueError,
    RuntimeError,
)


def load_model(model: ModelInput, input_shapes: InputShapes | None = None,
               files: DataFiles | None = None, int8_layers: bool = True) -> onnx.ModelProto:
    """Parse (if bytes or a path), check, inline local functions, infer every intermediate
    shape and fold shape computations.

    ``input_shapes`` pins graph inputs (``{"input": (1, 3, 224, 224)}``). External data is read
    from ``files`` if given, else from the folder of a ``Path``; bytes or a proto without
    ``files`` must be self-contained. ``int8_layers=False`` keeps a quantized model as other
    runtimes read it (no ``Int8Layer`` rewrite, no folding). The returned proto is a new
    object; a ``ModelProto`` passed in is not modified. onnx's checker and shape inference are
    given serialized bytes: for a model of tens of MB that is several times faster than handing
    them a Python proto.
    """
    if isinstance(model, Path):
        model, files = _read_path(model, files)
    data, proto = _parse(model)
    if isinstance(model, onnx.ModelProto) and (files is not None or input_shapes):
        proto = _copy(data)
    if files is not None and embed_external_data(proto, files):
        data = b""
    files = None  # the tensors hold their bytes now; a folder's files need not stay in memory
    refuse_external_data(proto)
    refuse_negative_dims(proto)
    if input_shapes:
        pin_input_shapes(proto, input_shapes)
        data = b""
    data = data or _serialize(proto)
    _check(data)
    if len(proto.functions):
        data = _inline_functions(proto).SerializeToString()
    return _static_shapes(data, int8_layers)


def _read_path(path: Path, files: DataFiles | None) -> tuple[bytes, DataFiles]:
    """A ``.onnx`` file with its folder's files, or a zip/tar archive of one with its data
    files (the form uploads take; read with the upload limits' defaults)."""
    from tuner_service.compiler.frontend.archive import LOCAL_LIMITS, is_archive, read_archive

    try:
        data = path.read_bytes()
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from e
    if not is_archive(data):
        return data, files or FolderFiles(path.parent)
    archive = read_archive(data, LOCAL_LIMITS)
    return archive.model, files or archive.files


def _copy(data: bytes) -> onnx.ModelProto:
    """A proto the caller does not own: parsed again from ``data`` (cheaper than CopyFrom)."""
    copy = onnx.ModelProto()
    copy.ParseFromString(data)
    return copy


def _serialize(proto: onnx.ModelProto) -> bytes:
    try:
        return proto.SerializeToString()
    except ValueError as e:  # protobuf refuses messages over 2 GiB
        raise ModelError(f"the model with its weights is too large for one ONNX protobuf: "
                         f"{_first_line(e)}") from e


def _static_shapes(data: bytes, int8_layers: bool = True) -> onnx.ModelProto:
    """Inferred shapes, then folded shape computations and inference once more, then the
    quantized layers rewritten into int8 layers.

    The rewrite comes last because it needs the folded shapes: an exporter's run-time
    ``Shape -> Gather -> Concat -> Reshape`` chains leave symbolic dimensions that the
    int8 layers and everything after them would keep (BERT-base quantized: 24 of its 72 dense
    layers and every attention product stayed numpy fp32 steps). Folding never touches a
    ``QuantizeLinear``/``DequantizeLinear`` (``shapes.fold_shapes``), so the quantized
    patterns survive it. If the second inference disagrees with the folded types (which would
    be a bug in the folding, not in the model), the model is used as onnx alone inferred it.
    """
    proto = _infer_shapes(data)
    if not int8_layers and is_quantized(proto):
        return proto  # as other runtimes read it: no folding, no rewrite
    if fold_shapes(proto):
        try:
            proto = _infer_shapes(proto.SerializeToString())
        except ModelError as e:
            logger.warning("shape folding gave types onnx disagrees with (%s); using onnx's", e)
            proto = _infer_shapes(data)
    rewrite_quantized(proto)  # quantized Conv/MatMul/Gemm -> int8 layers
    return proto


def _parse(
    model: bytes | bytearray | memoryview | onnx.ModelProto,
) -> tuple[bytes, onnx.ModelProto]:
    """The model as bytes and as a proto (for our own inspection)."""
    if isinstance(model, onnx.ModelProto):
        return _serialize(model), model
    if not isinstance(model, bytes | bytearray | memoryview):
        raise TypeError(f"expected ONNX bytes, a Path or an onnx.ModelProto, got "
                        f"{type(model).__name__}")
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
    """Raise ModelError if any tensor still points at data outside the model's bytes."""
    for where, tensor in all_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data):
            raise ModelError(
                f"tensor {tensor.name or '(unnamed)'!r} in {where} stores its data in an external "
                "file; give the model's path (its data files beside it) or upload one zip/tar "
                "archive holding the .onnx and its data files"
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
