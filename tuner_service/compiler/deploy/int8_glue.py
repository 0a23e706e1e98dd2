"""Generated kernels for the glue of quantized models, and the steps that run them.

Between its int8 layers a quantized model keeps elementwise conversions that would otherwise be
numpy passes over whole activations: the quantized additions and products (``Int8Add``,
``Int8Mul``, from ``frontend.quantized_glue``) and every ``QuantizeLinear`` /
``DequantizeLinear`` left standing where fp32 operators remain (attention, softmax, layer norm,
pooling, the model's input and output). Each one with per-tensor constant parameters and a
static size becomes a generated operator (``schedule_templates.ops.quant``) that gives numpy's
bytes exactly; ``tuner build`` compiles one kernel per distinct operator into the library
(listed under ``int8_kernels`` with ``generated``), and the runner calls it as a
``QuantGlueStep``. A ``Transpose`` of an 8-bit activation (the rewrite moves data on the
8-bit tensor itself: BERT's attention heads) is a generated copy kernel of that type
(``ops.movement.Transpose``) bound the same way, and so is a ``MaxPool`` of one (ResNet's
stem pool, on the bytes: ``ops.pool.BytePool2d``). Anything else (per-channel parameters, a
broadcast other than a trailing vector or a scalar, shapes not known at build time) stays a
numpy step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, cast

import numpy as np
import onnx

from schedule_templates.ops.base import GeneratedOp, GeneratedOpError
from schedule_templates.ops.movement import Transpose
from schedule_templates.ops.pool import BytePool2d
from schedule_templates.ops.quant import (
    Dequantize,
    Quantize,
    QuantizedBinary,
    QuantizedTable,
)
from schedule_templates.runtime import NUMPY_DTYPES, aligned_empty
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.kernel_step import ArgKind, BoundArg, KernelStep, StepLayer
from tuner_service.compiler.deploy.node import NodeInfo
from tuner_service.compiler.frontend.fusion import node_name
from tuner_service.compiler.frontend.generated_context import Refused
from tuner_service.compiler.frontend.generated_ops import pool_window
from tuner_service.compiler.frontend.quantized_glue import INT8_ADD, INT8_MUL
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN
from tuner_service.compiler.frontend.quantized_table import INT8_TABLE

if TYPE_CHECKING:  # loader imports library, which imports int8_step, which imports this
    from tuner_service.compiler.deploy.loader import LoadedGenerated, LoadedKernel

#: ONNX element types -> the IR's names, for the tensors the glue reads and writes
_TYPES: dict[int, str] = {onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.INT8: "int8",
                          onnx.TensorProto.FLOAT: "float32"}
#: standard operators with a generated kernel when their parameters are per tensor
GLUE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
#: standard data movement with a generated kernel when it moves an 8-bit activation
MOVES = frozenset({"Transpose", "MaxPool"})
#: the operators a QuantGlueStep runs
_GLUE_KINDS = (QuantizedBinary, QuantizedTable, Quantize, Dequantize, Transpose, BytePool2d)


def is_glue(node: onnx.NodeProto) -> bool:
    """Whether ``node`` may have a glue kernel in the library (the runner looks it up)."""
    if node.domain == INT8_DOMAIN:
        return node.op_type in (INT8_ADD, INT8_MUL, INT8_TABLE)
    return node.domain in ("", "ai.onnx") and node.op_type in GLUE_OPS | MOVES


def glue_ops(proto: onnx.ModelProto) -> Iterator[tuple[GeneratedOp, list[str]]]:
    """Each distinct glue operator of a loaded model, with the names of the nodes it serves."""
    tensors = _static_tensors(proto.graph)
    constants = {t.name: t for t in proto.graph.initializer}
    computed = {out for node in proto.graph.node if node.op_type == "Constant"
                for out in node.output}
    found: dict[str, tuple[GeneratedOp, list[str]]] = {}
    for index, node in enumerate(proto.graph.node):
        if node.op_type in GLUE_OPS | MOVES and node.input[0] in computed:
            continue  # a Constant's conversion: the runner folds it at load
        op = glue_op(node, tensors, constants) if is_glue(node) else None
        if op is not None:
            found.setdefault(op.key, (op, []))[1].append(node_name(node, index))
    yield from found.values()


def glue_op(node: onnx.NodeProto, tensors: Mapping[str, tuple[str, tuple[int, ...]]],
            constants: Mapping[str, onnx.TensorProto]) -> GeneratedOp | None:
    """The generated operator for one glue node, or None where it stays a numpy step."""
    if node.domain == INT8_DOMAIN and node.op_type == INT8_TABLE:
        x, table = tensors.get(node.input[0]), constants.get(node.input[1])
        if x is None or table is None or x[0] == "float32" or len(table.dims) != 1:
            return None
        out = _TYPES.get(table.data_type)
        if out not in ("uint8", "int8") or table.dims[0] != 256:
            return None
        return QuantizedTable(int(np.prod(x[1], dtype=np.int64)), x[0], out)
    if node.domain == INT8_DOMAIN:
        return _quantized_add(node, tensors)
    if node.op_type == "MaxPool":
        return _byte_pool(node, tensors, constants)
    if node.op_type in MOVES:
        return _byte_transpose(node, tensors, constants)
    source = node.input[0]
    if source in constants or source not in tensors:
        return None  # a weight's conversion is folded at load; an unknown size stays numpy
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    scale = _scalar(constants, node.input[1] if len(node.input) > 1 else "")
    zero = (_scalar(constants, node.input[2]) if len(node.input) > 2 and node.input[2]
            else np.zeros((), np.uint8))
    if scale is None or zero is None or attrs.get("block_size", 0):
        return None
    dtype, shape = tensors[source]
    size = int(np.prod(shape, dtype=np.int64))
    if scale.dtype != np.float32 or not float(scale) > 0:
        return None
    if node.op_type == "QuantizeLinear":
        out = _TYPES.get(onnx.helper.np_dtype_to_tensor_dtype(zero.dtype))
        if dtype != "float32" or out not in ("uint8", "int8"):
            return None
        return Quantize(size, float(scale), int(zero), out)
    if dtype not in ("uint8", "int8") or zero.dtype != np.dtype(dtype):
        return None
    return Dequantize(size, dtype, float(scale), int(zero))


def _quantized_add(node: onnx.NodeProto, tensors: Mapping[str, tuple[str, tuple[int, ...]]]
                   ) -> QuantizedBinary | None:
    """Operands of one shape, or one of them a vector repeated along the other's rows (a
    bias: its shape, leading ones aside, is the other's trailing dimensions)."""
    a, b = tensors.get(node.input[0]), tensors.get(node.input[1])
    if a is None or b is None or "float32" in (a[0], b[0]):
        return None
    broadcast, period = "", 0
    if a[1] != b[1]:
        small, big = (a, b) if len(_strip(a[1])) <= len(_strip(b[1])) else (b, a)
        trailing = _strip(small[1])
        if trailing and tuple(big[1][len(big[1]) - len(trailing):]) != trailing:
            return None  # any other broadcast stays numpy
        broadcast = "a" if small is a else "b"
        period = int(np.prod(trailing, dtype=np.int64))  # 1: a scalar
    size = int(np.prod(b[1] if broadcast == "a" else a[1], dtype=np.int64))
    attrs = {attr.name: onnx.helper.get_attribute_value(attr) for attr in node.attribute}
    out = attrs.get("out", b"u8")
    return QuantizedBinary(
        size, a[0], float(attrs["a_scale"]), int(attrs["a_zero_point"]),
        b[0], float(attrs["b_scale"]), int(attrs["b_zero_point"]),
        "uint8" if out in (b"u8", "u8") else "int8", float(attrs["y_scale"]),
        int(attrs["y_zero_point"]), bool(attrs.get("relu", 0)), broadcast, period,
        "mul" if node.op_type == INT8_MUL else "add")


def _byte_transpose(node: onnx.NodeProto, tensors: Mapping[str, tuple[str, tuple[int, ...]]],
                    constants: Mapping[str, onnx.TensorProto]) -> Transpose | None:
    """A Transpose of an 8-bit activation of static shape (fp32 ones are generated layers)."""
    found = tensors.get(node.input[0])
    if node.input[0] in constants or found is None or found[0] not in ("uint8", "int8"):
        return None
    dtype, shape = found
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"),
                list(reversed(range(len(shape)))))
    try:
        return Transpose(tuple(shape), tuple(int(p) for p in perm), dtype)
    except GeneratedOpError:
        return None


def _byte_pool(node: onnx.NodeProto, tensors: Mapping[str, tuple[str, tuple[int, ...]]],
               constants: Mapping[str, onnx.TensorProto]) -> BytePool2d | None:
    """A MaxPool of an 8-bit activation of static NCHW shape (fp32 ones are generated
    layers)."""
    found = tensors.get(node.input[0])
    if node.input[0] in constants or found is None or found[0] not in ("uint8", "int8"):
        return None
    dtype, shape = found
    try:
        window = pool_window(node, shape)
        return BytePool2d(shape=shape, mode="max", count_include_pad=False, dtype=dtype,
                          **window)  # type: ignore[arg-type]
    except (Refused, GeneratedOpError):
        return None


def _out_dtype(op: QuantizedBinary | QuantizedTable | Quantize | Dequantize | Transpose
               | BytePool2d) -> str:
    if isinstance(op, Dequantize):
        return "float32"
    return op.dtype if isinstance(op, Transpose | BytePool2d) else op.out_dtype


def _strip(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape without its leading ones."""
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims)


def _static_tensors(graph: onnx.GraphProto) -> dict[str, tuple[str, tuple[int, ...]]]:
    """tensor -> (IR element type, shape) for every uint8/int8/fp32 tensor of static shape
    that shape inference typed, and every such initializer."""
    found = {}
    for value in [*graph.value_info, *graph.input, *graph.output]:
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim)
        if tensor.elem_type in _TYPES and tensor.HasField("shape") and all(dims):
            found[value.name] = (_TYPES[tensor.elem_type], dims)
    for init in graph.initializer:
        if init.data_type in _TYPES:
            found.setdefault(init.name, (_TYPES[init.data_type], tuple(init.dims)))
    return found


def _scalar(constants: Mapping[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    tensor = constants.get(name)
    if tensor is None:
        return None
    value = onnx.numpy_helper.to_array(tensor)
    return value.reshape(()) if value.size == 1 else None


class QuantGlueStep(KernelStep):
    """A glue node run by its generated kernel: its 8-bit or fp32 inputs read by pointer (a
    constant one, such as a bias, copied once behind a fixed pointer), the result in a typed
    output buffer shaped as the node's output. A ``KernelStep`` of typed arguments, so the
    native program runs it between the kernels around it."""

    def __init__(self, kernel: LoadedGenerated, node: onnx.NodeProto, info: NodeInfo,
                 constants: Mapping[str, np.ndarray], shape: tuple[int, ...] | None,
                 threads: int) -> None:
        op = kernel.op
        if not isinstance(op, _GLUE_KINDS):
            raise LibraryError(f"{node.op_type} {info.name}: its kernel is a {op.kind}, not "
                               "a quantization glue operator")
        self.node, self.info, self.op = node, info, op
        args = []
        for name, dtype, dims in zip(node.input, op.input_dtypes().values(),
                                     op.input_shapes().values(), strict=False):
            size = math.prod(dims)
            typed = np.dtype(NUMPY_DTYPES[dtype])
            if name in constants:
                value = np.asarray(constants[name])
                if value.size != size:
                    raise LibraryError(f"{node.op_type} {info.name}: constant {name} has "
                                       f"{value.size} elements, the kernel expects {size}")
                buffer = aligned_empty(size, zero=True, dtype=NUMPY_DTYPES[dtype])
                buffer[:] = value.reshape(-1)
                args.append(BoundArg(ArgKind.FIXED, buffer, None, size, typed))
            else:
                args.append(BoundArg(ArgKind.ACTIVATION, None, name, size, typed))
        out, elements = _out_dtype(op), math.prod(op.output_shape())
        args.append(BoundArg(ArgKind.OUTPUT, aligned_empty(elements, zero=True,
                                                           dtype=NUMPY_DTYPES[out]),
                             node.output[0], elements, np.dtype(NUMPY_DTYPES[out])))
        if shape is None or int(np.prod(shape, dtype=np.int64)) != elements:
            shape = op.output_shape()
        super().__init__(cast("LoadedKernel", kernel), StepLayer((info.name,), node.output[0]),
                         args, shape, max(1, threads))
