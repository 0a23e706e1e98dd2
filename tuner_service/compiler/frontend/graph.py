"""What extraction needs to know about a shape-inferred graph: static shapes and constants."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

import onnx

from tuner_service.compiler.frontend.errors import UnmappableNode

# A dimension as inference left it: a number, a symbolic name (dim_param), or nothing at all.
Dim = int | str | None

# Ops whose output is not a pure function of their inputs (or runs a subgraph): constant
# inputs do not make their output constant.
NONDETERMINISTIC = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
        "If",
        "Loop",
        "Scan",
    }
)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Element type (an ``onnx.TensorProto`` enum value, 0 if unknown) and dims (None: no rank)."""

    elem_type: int
    dims: tuple[Dim, ...] | None


@dataclasses.dataclass(frozen=True)
class GraphIndex:
    """Types of every value in a graph and which values are constant at inference time."""

    tensors: Mapping[str, TensorInfo]
    constants: frozenset[str]
    #: symbolic dimension name -> the graph input (and axis) that declares it
    dynamic_inputs: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def static_shape(self, name: str, role: str) -> tuple[int, ...]:
        """The shape of ``name`` with every dimension known and positive, else UnmappableNode."""
        info = self.tensors.get(name)
        if info is None or info.dims is None:
            raise UnmappableNode(f"the shape of {role} {name!r} could not be inferred")
        shape = []
        for axis, dim in enumerate(info.dims):
            if isinstance(dim, str) or dim is None:
                raise UnmappableNode(self._dynamic_reason(name, role, dim, axis))
            if dim < 1:
                raise UnmappableNode(f"{role} {name!r} has dimension {dim} at axis {axis}")
            shape.append(dim)
        return tuple(shape)

    def _dynamic_reason(self, name: str, role: str, dim: str | None, axis: int) -> str:
        """Why a dimension is not a number, and what the user can do about it."""
        label = "an unknown dimension" if dim is None else f"dynamic dimension {dim!r}"
        source = self.dynamic_inputs.get(dim) if dim is not None else None
        if source is not None:
            graph_input, input_axis = source
            return (f"{role} {name!r} has {label} at axis {axis}, set by axis {input_axis} of "
                    f"graph input {graph_input!r}; pin it with --input-shape "
                    f"{graph_input}=DIMS (or export the model with fixed shapes)")
        if self.dynamic_inputs:
            inputs = sorted({source[0] for source in self.dynamic_inputs.values()})
            return (f"{role} {name!r} has {label} at axis {axis}, computed at run time from "
                    f"dynamic graph inputs ({', '.join(inputs)}); pin them with --input-shape "
                    "NAME=DIMS")
        return (f"{role} {name!r} has {label} at axis {axis}: it depends on values known only "
                "at run time, not on the input shapes")

    def require_float32(self, name: str, role: str) -> None:
        """Templates are fp32 only: a task of another type would tune the wrong kernel."""
        info = self.tensors.get(name)
        elem_type = info.elem_type if info else 0
        if elem_type == onnx.TensorProto.UNDEFINED:
            # Typically downstream of a custom-domain operator that onnx cannot infer.
            raise UnmappableNode(f"the type and shape of {role} {name!r} could not be inferred")
        if elem_type != onnx.TensorProto.FLOAT:
            type_name = (
                onnx.TensorProto.DataType.Name(elem_type)
                if elem_type in onnx.TensorProto.DataType.values()
                else "unknown"
            )
            raise UnmappableNode(
                f"{role} {name!r} has element type {type_name}; templates are fp32 only"
            )


def index_graph(graph: onnx.GraphProto) -> GraphIndex:
    """Collect value types from inputs, outputs, value_info and initializers."""
    tensors: dict[str, TensorInfo] = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.type.HasField("tensor_type"):
            tensors[value.name] = _tensor_info(value.type.tensor_type)
    for init in graph.initializer:
        tensors[init.name] = TensorInfo(init.data_type, tuple(int(d) for d in init.dims))
    weights = {init.name for init in graph.initializer}
    dynamic: dict[str, tuple[str, int]] = {}
    for value in graph.input:
        dims = tensors[value.name].dims if value.name in tensors else None
        for axis, dim in enumerate(dims or ()):
            if isinstance(dim, str) and value.name not in weights:
                dynamic.setdefault(dim, (value.name, axis))
    return GraphIndex(tensors=tensors, constants=_constant_values(graph), dynamic_inputs=dynamic)


def _tensor_info(tensor_type: onnx.TypeProto.Tensor) -> TensorInfo:
    if not tensor_type.HasField("shape"):
        return TensorInfo(tensor_type.elem_type, None)
    return TensorInfo(tensor_type.elem_type, tuple(_dim(d) for d in tensor_type.shape.dim))


def _dim(dim: onnx.TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    if dim.HasField("dim_param"):
        return dim.dim_param
    return None


def _constant_values(graph: onnx.GraphProto) -> frozenset[str]:
    """Initializers, Constant outputs, and outputs computed only from those (e.g. a transposed
    weight in an export without constant folding). Nodes are in topological order (checked)."""
    constants = {init.name for init in graph.initializer}
    constants.update(s.values.name for s in graph.sparse_initializer)
    for node in graph.node:
        if _is_constant_node(node, constants):
            constants.update(out for out in node.output if out)
    return frozenset(constants)


def _is_constant_node(node: onnx.NodeProto, constants: AbstractSet[str]) -> bool:
    if node.domain not in ("", "ai.onnx") or node.op_type in NONDETERMINISTIC:
        return False
    if node.op_type == "Constant":
        return True
    inputs = [name for name in node.input if name]
    return bool(inputs) and all(name in constants for name in inputs)
