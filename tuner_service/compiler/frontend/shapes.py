"""Static shapes wherever they are knowable: pinned inputs and folded shape computations.

Exporters compute shapes at run time even when every shape is fixed: ``x.chunk(2, 1)`` in a
ShuffleNet becomes ``Shape -> Gather -> Add -> Div -> Mul -> Slice``, and onnx's shape inference
(even with data propagation) gives up on the ``Div``, so every convolution after the split gets
a symbolic batch dimension and cannot be tuned. ``fold_shapes`` walks the graph once in
topological order, turns every ``Shape``/``Size`` of a static tensor and every small computation
on constants into a ``Constant`` node, and re-infers each node's output type with the constants
it now knows, so one pass settles a whole chain of blocks.

A truly dynamic input (batch, sequence length) is fixed by the user: ``pin_input_shapes`` writes
``--input-shape NAME=1x3x224x224`` into the graph input, the way tvmc's ``--input-shapes`` does.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
import onnx.defs
import onnx.helper
import onnx.numpy_helper
import onnx.shape_inference

from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.graph import NONDETERMINISTIC

logger = logging.getLogger(__name__)

InputShapes = Mapping[str, tuple[int, ...]]

#: largest value (elements) folded into a constant; shape tensors have a handful
FOLD_ELEMENTS = 4096
#: largest pinned dimension: anything larger is a typo, not a model
MAX_PINNED_DIM = 1 << 24

_DIMS = re.compile(r"\d+(?:[x,]\d+)*")


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``"input=1x3x224x224"`` (also ``1,3,224,224`` or ``[1,3,224,224]``) -> (name, dims)."""
    name, sep, dims = text.rpartition("=")
    body = dims.strip().strip("[]()").replace(" ", "")
    if not sep or not name.strip() or not _DIMS.fullmatch(body):
        raise ModelError(f"input shape {text!r} is not NAME=DIMS (for example "
                         "input=1x3x224x224)")
    shape = tuple(int(d) for d in re.split(r"[x,]", body))
    if any(d < 1 or d > MAX_PINNED_DIM for d in shape):
        raise ModelError(f"input shape {text!r}: every dimension must be between 1 and "
                         f"{MAX_PINNED_DIM}")
    return name.strip(), shape


def parse_input_shapes(items: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """Several ``NAME=DIMS``; naming an input twice is an error."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, shape = parse_input_shape(item)
        if name in shapes:
            raise ModelError(f"input {name!r} is given two shapes")
        shapes[name] = shape
    return shapes


def format_input_shapes(shapes: InputShapes) -> str:
    """Canonical text (sorted by name): ``a=1x3,b=2``; parse_input_shapes reads it back."""
    return ",".join(f"{name}={'x'.join(map(str, dims))}"
                    for name, dims in sorted(shapes.items()))


def pin_input_shapes(proto: onnx.ModelProto, shapes: InputShapes) -> None:
    """Write ``shapes`` into the graph inputs (in place); a fixed dimension must agree."""
    graph = proto.graph
    weights = {t.name for t in graph.initializer}
    inputs = {v.name: v for v in graph.input if v.name not in weights}
    for name, dims in shapes.items():
        value = inputs.get(name)
        if value is None:
            what = "a weight" if name in weights else "not an input of the model"
            raise ModelError(f"--input-shape names {name!r}, which is {what}; inputs: "
                             f"{', '.join(sorted(inputs)) or '(none)'}")
        if not value.type.HasField("tensor_type"):
            raise ModelError(f"input {name!r} is not a tensor; its shape cannot be pinned")
        _pin(value.type.tensor_type, name, dims)
    logger.debug("pinned input shapes %s", format_input_shapes(shapes))


def _pin(tensor_type: onnx.TypeProto.Tensor, name: str, dims: tuple[int, ...]) -> None:
    shape = tensor_type.shape
    if tensor_type.HasField("shape") and len(shape.dim) != len(dims):
        raise ModelError(f"input {name!r} has {len(shape.dim)} dimensions, the pinned shape "
                         f"{'x'.join(map(str, dims))} has {len(dims)}")
    if not tensor_type.HasField("shape") or not len(shape.dim):
        tensor_type.shape.SetInParent()
        for _ in dims:
            shape.dim.add()
    for axis, (dim, size) in enumerate(zip(shape.dim, dims, strict=True)):
        if dim.HasField("dim_value") and dim.dim_value != size:
            raise ModelError(f"input {name!r} has fixed dimension {dim.dim_value} at axis "
                             f"{axis}; the pinned shape says {size}")
        dim.dim_value = size  # clears dim_param (one-of)


def fold_shapes(proto: onnx.ModelProto) -> bool:
    """Fold shape computations of a shape-inferred model in place; True if anything changed.

    Afterwards ``value_info`` holds the most static type known for every value; the caller
    runs onnx's shape inference once more so that it checks and completes them.
    """
    folder = _Folder(proto)
    nodes = folder.walk(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    if folder.folded:
        _drop_unused_constants(proto.graph)
    if folder.folded or folder.refined:
        skip = {v.name for v in proto.graph.input} | {v.name for v in proto.graph.output}
        skip |= {t.name for t in proto.graph.initializer}
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(
            onnx.helper.make_value_info(name, value_type)
            for name, value_type in folder.types.items() if name not in skip)
    logger.debug("folded %d shape nodes, refined %d types", folder.folded, folder.refined)
    return bool(folder.folded or folder.refined)


def _drop_unused_constants(graph: onnx.GraphProto) -> None:
    """Remove ``Constant`` nodes and initializers nothing reads any more (the inputs of folded
    nodes), so that runtimes do not warn about them. Subgraphs' reads count as reads."""
    used = {v.name for v in graph.output} | {v.name for v in graph.input}
    used |= set(reads(graph))
    keep = [n for n in graph.node if n.op_type != "Constant" or any(o in used for o in n.output)]
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    initializers = [t for t in graph.initializer if t.name in used]
    if len(initializers) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(initializers)


def reads(graph: onnx.GraphProto) -> Iterable[str]:
    """Every tensor name a graph's nodes read, subgraphs' reads and outputs included."""
    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from reads(sub)
                yield from (v.name for v in sub.output)


class _Folder:
    """One topological walk: known types, small constant values, folded nodes."""

    def __init__(self, proto: onnx.ModelProto) -> None:
        graph = proto.graph
        self.opsets = list(proto.opset_import)
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                          onnx.defs.onnx_opset_version())
        self.ir_version = proto.ir_version
        self.types: dict[str, onnx.TypeProto] = {}
        for value in [*graph.input, *graph.value_info, *graph.output]:
            self.types[value.name] = value.type
        self.values: dict[str, np.ndarray] = {}
        for init in graph.initializer:
            self.types[init.name] = onnx.helper.make_tensor_type_proto(
                init.data_type, list(init.dims))
            if math.prod(init.dims) <= FOLD_ELEMENTS:
                self.values[init.name] = onnx.numpy_helper.to_array(init)
        self.graph_outputs = {v.name for v in graph.output}
        self.folded = 0
        self.refined = 0

    def walk(self, nodes: Iterable[onnx.NodeProto]) -> list[onnx.NodeProto]:
        out: list[onnx.NodeProto] = []
        for node in nodes:
            values = self._fold(node) if _foldable(node, self.graph_outputs) else None
            if values is None:
                self._infer(node)
                out.append(node)
                continue
            self.folded += 1
            for index, (name, value) in enumerate(zip(node.output, values, strict=True)):
                self.values[name] = value
                tensor = onnx.numpy_helper.from_array(value, name)
                self.types[name] = onnx.helper.make_tensor_type_proto(
                    tensor.data_type, list(value.shape))
                label = node.name if index == 0 or not node.name else f"{node.name}_{index}"
                out.append(onnx.helper.make_node("Constant", [], [name], label, value=tensor))
        return out

    def _fold(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        if node.op_type == "Constant":
            self._remember_constant(node)
            return None
        if node.op_type in ("Shape", "Size"):
            dims = self._static_dims(node.input[0])
            if dims is None:
                return None
            if node.op_type == "Size":
                return [np.asarray(math.prod(dims), dtype=np.int64)]
            start = _attr_int(node, "start", 0)
            end = _attr_int(node, "end", len(dims))
            return [np.asarray(dims[start:end], dtype=np.int64)]
        inputs = [name for name in node.input if name]
        if not inputs or not all(name in self.values for name in inputs):
            return None
        if not self._small_outputs(node):
            return None
        return self._evaluate(node)

    def _remember_constant(self, node: onnx.NodeProto) -> None:
        attr = next((a for a in node.attribute if a.name == "value" and a.HasField("t")), None)
        if attr is not None and math.prod(attr.t.dims) <= FOLD_ELEMENTS:
            try:
                self.values[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
            except (ValueError, TypeError):  # a malformed tensor; the checker reports it
                return

    def _static_dims(self, name: str) -> tuple[int, ...] | None:
        value_type = self.types.get(name)
        if value_type is None or not value_type.HasField("tensor_type"):
            return None
        tensor_type = value_type.tensor_type
        if not tensor_type.HasField("shape"):
            return None
        dims = tensor_type.shape.dim
        if not all(d.HasField("dim_value") for d in dims):
            return None
        return tuple(int(d.dim_value) for d in dims)

    def _small_outputs(self, node: onnx.NodeProto) -> bool:
        """Every output's shape is known (with the constants as data) and small."""
        self._infer(node, force=True)
        for name in node.output:
            dims = self._static_dims(name) if name else ()
            if dims is None or math.prod(dims) > FOLD_ELEMENTS:
                return False
        return True

    def _evaluate(self, node: onnx.NodeProto) -> list[np.ndarray] | None:
        from onnx.reference import ReferenceEvaluator

        feeds = {name: self.values[name] for name in node.input if name}
        try:
            results = ReferenceEvaluator(node, opsets={"": self.opset}).run(None, feeds)
        except Exception as e:  # onnx's evaluator raises many types; leave the node alone
            logger.debug("not folding %s: %s", node.name or node.op_type, e)
            return None
        return [np.asarray(r) for r in results]

    def _infer(self, node: onnx.NodeProto, force: bool = False) -> None:
        """Refine the node's output types from its inputs' (and constant inputs' values)."""
        if not force and all(self._static_dims(n) is not None for n in node.output if n):
            return
        schema = _schema(node, self.opset)
        if schema is None or not all(n in self.types for n in node.input if n):
            return
        types = {n: self.types[n] for n in node.input if n}
        data = {n: onnx.numpy_helper.from_array(self.values[n], n)
                for n in node.input if n in self.values}
        try:
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, types, data, opset_imports=self.opsets, ir_version=self.ir_version)
        except Exception as e:  # onnx raises several types; the full inference reports them
            logger.debug("no types for %s: %s", node.name or node.op_type, e)
            return
        for name, value_type in inferred.items():
            if _more_static(value_type, self.types.get(name)):
                self.types[name] = value_type
                self.refined += 1


#: never folded: a quantized model's (de)quantization of constants is what its int8 layers
#: are recognised by (``frontend.quantized``), and the runner folds what is left at load
_KEEP = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def _foldable(node: onnx.NodeProto, graph_outputs: set[str]) -> bool:
    return (node.domain in ("", "ai.onnx") and node.op_type not in NONDETERMINISTIC
            and node.op_type not in _KEEP
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                        for a in node.attribute)
            and not any(name in graph_outputs for name in node.output))


def _schema(node: onnx.NodeProto, opset: int) -> onnx.defs.OpSchema | None:
    if node.domain not in ("", "ai.onnx"):
        return None
    try:
        return onnx.defs.get_schema(node.op_type, opset, "")
    except onnx.defs.SchemaError:
        return None


def _static_count(value_type: onnx.TypeProto | None) -> int:
    """-1 without a tensor shape, else the number of dimensions with a known value."""
    if value_type is None or not value_type.HasField("tensor_type"):
        return -1
    tensor_type = value_type.tensor_type
    if not tensor_type.HasField("shape"):
        return -1
    return sum(d.HasField("dim_value") for d in tensor_type.shape.dim)


def _more_static(new: onnx.TypeProto, old: onnx.TypeProto | None) -> bool:
    if old is None:
        return True
    if (new.HasField("tensor_type") and old.HasField("tensor_type")
            and old.tensor_type.HasField("shape") and new.tensor_type.HasField("shape")
            and len(old.tensor_type.shape.dim) != len(new.tensor_type.shape.dim)):
        return False  # a rank disagreement is for the full inference to report
    return _static_count(new) > _static_count(old)


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)
