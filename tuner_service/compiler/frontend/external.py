"""Tensors stored outside the ``.onnx`` file (ONNX "external data"), read safely.

torch's dynamo exporter and ``onnx.save(..., save_as_external_data=True)`` write the weights to
files beside the model and leave in each tensor a location, an offset and a length. The model
comes from a user, so those fields are hostile input: a location must be a relative path inside
the model's folder (no absolute path, no ``..``, no symlink leading out), and the byte range must
lie inside the file and hold exactly the tensor's bytes. The data is then copied into the tensor
(``raw_data``) so that everything after loading works on one self-contained proto.

Where the files come from is a ``DataFiles``: a folder on disk (local paths) or the members of an
uploaded archive held in memory.
"""

from __future__ import annotations

import logging
import math
import posixpath
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
import onnx.helper

from tuner_service.compiler.frontend.errors import ModelError

logger = logging.getLogger(__name__)


class DataFiles(Protocol):
    """Read-only files addressed by a checked relative location (``weights/model.data``)."""

    def describe(self) -> str:
        """Where the files are, for messages ("the model's folder /x", "the archive")."""

    def read(self, location: str) -> memoryview:
        """The whole file at ``location``; ModelError if it is missing or not allowed."""


class FolderFiles:
    """Files in a folder on disk; a location may not resolve (through symlinks) outside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._real_root = root.resolve()
        self._cache: dict[str, memoryview] = {}

    def describe(self) -> str:
        return f"the model's folder {self.root}"

    def read(self, location: str) -> memoryview:
        if location not in self._cache:
            self._cache[location] = memoryview(self._read(location))
        return self._cache[location]

    def _read(self, location: str) -> bytes:
        path = self.root / location
        real = path.resolve()
        if not real.is_relative_to(self._real_root):
            raise ModelError(f"external data file {location!r} is a link that leads out of "
                             f"{self.describe()}; copy the file into the folder instead")
        if not real.is_file():
            raise ModelError(f"external data file {location!r} is missing from {self.describe()} "
                             "(or is not a regular file)")
        try:
            return real.read_bytes()
        except OSError as e:
            raise ModelError(f"cannot read external data file {location!r}: "
                             f"{e.strerror or e}") from e


class MemoryFiles:
    """Files already read into memory (the members of an uploaded archive)."""

    def __init__(self, files: Mapping[str, bytes], where: str = "the archive") -> None:
        self._files = {name: memoryview(data) for name, data in files.items()}
        self._where = where

    def describe(self) -> str:
        return self._where

    def read(self, location: str) -> memoryview:
        try:
            return self._files[location]
        except KeyError:
            raise ModelError(f"external data file {location!r} is missing from "
                             f"{self._where}") from None


def check_location(location: str) -> str:
    """``location`` as a normalised relative POSIX path, or ModelError if it could point
    outside the model's folder (absolute, drive-qualified, ``..``, backslashes, NUL)."""
    if not location or "\x00" in location:
        raise ModelError(f"external data location {location!r} is empty or contains NUL")
    if "\\" in location or location.startswith("/") or (len(location) > 1 and location[1] == ":"):
        raise ModelError(f"external data location {location!r} is an absolute path; only "
                         "paths relative to the model's folder are allowed")
    parts = location.split("/")
    if ".." in parts:
        raise ModelError(f"external data location {location!r} leaves the model's folder "
                         "('..' is not allowed)")
    normal = posixpath.normpath(location)
    if normal in (".", ""):
        raise ModelError(f"external data location {location!r} names no file")
    return normal


def external_locations(proto: onnx.ModelProto) -> list[str]:
    """The checked locations the model's tensors name, each once, in order of appearance."""
    found: dict[str, None] = {}
    for _, tensor in all_tensors(proto):
        if _is_external(tensor):
            found[check_location(_fields(tensor).get("location", ""))] = None
    return list(found)


def embed_external_data(proto: onnx.ModelProto, files: DataFiles) -> int:
    """Copy every external tensor's bytes into the tensor; returns how many were external.

    Modifies ``proto`` in place.
    """
    count = 0
    for where, tensor in all_tensors(proto):
        if _is_external(tensor):
            _embed(tensor, where, files)
            count += 1
    if count:
        logger.debug("embedded %d external tensors from %s", count, files.describe())
    return count


def _embed(tensor: onnx.TensorProto, where: str, files: DataFiles) -> None:
    name = tensor.name or "(unnamed)"
    fields = _fields(tensor)
    location = check_location(fields.get("location", ""))
    data = files.read(location)
    offset = _int_field(fields, "offset", 0, name)
    size = _expected_bytes(tensor, name)
    length = _int_field(fields, "length", size, name)
    if offset > len(data) or offset + length > len(data):
        raise ModelError(
            f"tensor {name!r} in {where} reads bytes {offset}..{offset + length} of "
            f"{location!r}, which has only {len(data)} bytes (truncated data file?)")
    if length != size:
        raise ModelError(f"tensor {name!r} in {where} has {size} bytes of data but its external "
                         f"length is {length}")
    tensor.raw_data = bytes(data[offset:offset + length])
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.DEFAULT


def _expected_bytes(tensor: onnx.TensorProto, name: str) -> int:
    """Bytes the tensor's dims and element type need."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        raise ModelError(f"tensor {name!r} of type "
                         f"{_type_name(tensor.data_type)} cannot be stored externally")
    count = math.prod(int(d) for d in tensor.dims)
    bits = _SUB_BYTE.get(tensor.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, ValueError, TypeError) as e:
        raise ModelError(f"tensor {name!r} has unknown element type {tensor.data_type}") from e
    return count * itemsize


def _type_name(data_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


# 4-bit and 2-bit types pack several elements per byte
_SUB_BYTE = {getattr(onnx.TensorProto, n): bits for n, bits in
             (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
             if hasattr(onnx.TensorProto, n)}


def _int_field(fields: Mapping[str, str], key: str, default: int, name: str) -> int:
    text = fields.get(key)
    if text is None:
        return default
    if not text.isdigit():
        raise ModelError(f"tensor {name!r} has external {key} {text!r}, not a whole number")
    return int(text)


def _fields(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def _is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.external_data) > 0


def all_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every tensor of the model with a description of where it is (graph, function,
    subgraph): initializers, sparse initializers and tensor attributes, at any depth."""
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
