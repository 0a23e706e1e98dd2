"""Int8 layers with our kernels: ``tuner build`` compiles one per ``Int8Layer`` node
(``frontend.quantized``) whose workload has a template on this host, and the runner calls it.

The manifest lists them under ``int8_kernels`` (same fields as ``kernels``), apart from the
fp32 layer plan: their buffers are typed (uint8 activations, int32 packed weights, uint8/int8
or fp32 outputs). Each runs as a ``KernelStep`` of typed arguments, reading the uint8
activation by pointer and writing a typed output that the native program plans in the
activation arena like any other (``native``). A node without
a kernel (no template for its workload yet, e.g. ``conv2d_int8``, or a library built before
int8 kernels existed) runs the numpy int8 reference (``ops_quant``), reported at load.

The glue between them (quantized additions, lone QuantizeLinear / DequantizeLinear) gets
generated kernels (``int8_glue``), listed in ``int8_kernels`` with their operator instead of a
workload.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from schedule_templates.errors import ScheduleError
from schedule_templates.ir.nodes import Buffer
from schedule_templates.protocol import Target
from schedule_templates.runtime import NUMPY_DTYPES, buffer_array, lower
from schedule_templates.templates.base import get_template
from tuner_service.compiler.deploy.configs import Choice, ConfigBook
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.int8_glue import glue_ops
from tuner_service.compiler.deploy.kernel_step import ArgKind, BoundArg, KernelStep, StepLayer
from tuner_service.compiler.deploy.node import NodeInfo
from tuner_service.compiler.frontend.quantized_ops import (
    INT8_DOMAIN,
    INT8_INPUTS,
    INT8_OP,
    int8_layer_inputs,
    int8_layer_workload,
)

if TYPE_CHECKING:  # loader imports library, which imports this module
    from tuner_service.compiler.deploy.loader import LoadedGenerated, LoadedKernel

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Int8KernelSpec:
    """One compiled int8 kernel and the Int8Layer nodes that call it (``library`` links it)."""

    symbol: str
    entry: dict[str, Any]  # the manifest entry, without ``args`` until lowered
    kernel: Any  # schedule_templates.ir.nodes.Kernel

    @property
    def label(self) -> str:
        return str(self.entry.get("workload") or self.entry["generated"]["kind"])


def int8_kernel_specs(proto: onnx.ModelProto, book: ConfigBook, target: str
                      ) -> list[Int8KernelSpec]:
    """One kernel per distinct int8 workload of the model's Int8Layer nodes that lowers on
    this host; the others are left to the numpy reference (a warning says which)."""
    specs: dict[str, Int8KernelSpec] = {}
    skipped: dict[str, str] = {}
    for node in proto.graph.node:
        if node.domain != INT8_DOMAIN or node.op_type != INT8_OP:
            continue
        workload = int8_layer_workload(node)
        if workload.key in specs:
            specs[workload.key].entry["layers"].append(node.name)
            continue
        try:
            template = get_template(workload.op, target)
            choice = book.choose(workload, template, []) or Choice(
                template.default_config(workload), "default", None, None)
            kernel = lower(workload, template, choice.config)
        except ScheduleError as e:
            skipped.setdefault(workload.key, str(e))
            continue
        symbol = f"q{len(specs):03d}_{workload.op}"
        kernel = dataclasses.replace(kernel, name=symbol)
        entry = {"symbol": symbol, "workload": workload.key, "op": workload.op,
                 "template": template.name, "template_version": template.version,
                 "config": choice.config.to_json(), "config_source": choice.source,
                 "args": _args_json(kernel), "layers": [node.name]}
        specs[workload.key] = Int8KernelSpec(symbol, entry, kernel)
    for key, reason in skipped.items():
        logger.warning("int8 layers of %s run as numpy reference steps: %s", key, reason)
    if Target.parse(target).kind == "llvm":
        for op, layers in glue_ops(proto):
            symbol = f"q{len(specs):03d}_{op.kind}"
            kernel = dataclasses.replace(op.lower(), name=symbol)
            specs[op.key] = Int8KernelSpec(symbol, {
                "symbol": symbol, "generated": op.to_json(), "args": _args_json(kernel),
                "layers": layers}, kernel)
    return list(specs.values())


def _args_json(kernel: Any) -> list[dict[str, Any]]:
    roles = [("input", b) for b in kernel.params[:-1]] + [("output", kernel.output)]
    roles += [("workspace", b) for b in kernel.workspace]
    return [{"name": b.name, "role": role, "shape": list(b.shape), "dtype": b.dtype,
             "elements": b.size + b.slack} for role, b in roles]


def int8_kernel_for(kernels: Mapping[str, LoadedKernel | LoadedGenerated],
                    manifest: Mapping[str, Any], node_name: str
                    ) -> LoadedKernel | LoadedGenerated | None:
    """The library's kernel for the Int8Layer node ``node_name``, if it has one."""
    for entry in manifest.get("int8_kernels", []):
        if node_name in entry.get("layers", []):
            return kernels.get(str(entry["symbol"]))
    return None


class Int8KernelStep(KernelStep):
    """An Int8Layer node run by its compiled kernel: constants packed once, the uint8
    activation read by pointer (or staged when the kernel over-reads), a typed output. Its
    arguments are typed ``BoundArg``s, so the native program runs it like any kernel step (its
    workspaces are buffers of its own); one that must clamp its output afterwards (a ReLU at a
    zero point above the type's minimum) runs as a Python step."""

    def __init__(self, kernel: LoadedKernel, node: onnx.NodeProto, info: NodeInfo,
                 constants: Mapping[str, np.ndarray], threads: int) -> None:
        self.node, self.info = node, info
        workload = kernel.workload
        lowered = kernel.template.lower(workload, kernel.config)
        values = [None, *(constants.get(name) if name else None for name in node.input[1:])]
        named = int8_layer_inputs(workload, values)
        shapes = workload.input_shapes()
        named["data"] = np.zeros(shapes["data"], np.uint8)
        residual = next((b for b in lowered.params if b.name == "residual"), None)
        if residual is not None:  # read at every run, like data: a placeholder to pack with
            named["residual"] = np.zeros(shapes["residual"], NUMPY_DTYPES[residual.dtype])
        try:
            packed = kernel.template.pack(workload, kernel.config, named)
        except (ScheduleError, ValueError) as e:
            raise LibraryError(f"int8 layer {node.name}: packing its constants failed: {e}"
                               ) from e
        args = [_data_arg(b, node.input[0]) if b.name == "data" else
                _residual_arg(b, node) if b.name == "residual" else
                BoundArg(ArgKind.FIXED, _bound(b, packed, node.name), None, b.size,
                         np.dtype(NUMPY_DTYPES[b.dtype]))
                for b in lowered.params[:-1]]
        out = lowered.output
        args.append(BoundArg(ArgKind.OUTPUT, buffer_array(out, zero=True), node.output[0],
                             out.size, np.dtype(NUMPY_DTYPES[out.dtype])))
        args += [BoundArg(ArgKind.FIXED, buffer_array(b, zero=True), None, b.size,
                          np.dtype(NUMPY_DTYPES[b.dtype])) for b in lowered.workspace]
        shape = tuple(int(d) for d in info.get("shape"))
        super().__init__(kernel, StepLayer((node.name,), node.output[0]), args, shape,
                         max(1, threads))
        zp = named.get("out_zero_point")
        floor = None if not info.get("relu", 0) else 0 if zp is None else int(zp.reshape(-1)[0])
        lowest = 0 if out.dtype == "uint8" else -128 if out.dtype == "int8" else None
        # a floor at or below the type's minimum clamps nothing
        self._relu_floor = None if floor is None or (lowest is not None and floor <= lowest) \
            else floor
        self.in_program = self._relu_floor is None

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        super().__call__(env)
        if self._relu_floor is not None:
            result = env[self.outputs[0]]
            env[self.outputs[0]] = np.maximum(result, self._relu_floor).astype(result.dtype)


def _data_arg(data: Buffer, tensor: str) -> BoundArg:
    """The uint8 activation (which a kernel may read as words of 4 bytes): by pointer, or
    staged in a buffer with slack (over-reads)."""
    size = data.size * np.dtype(NUMPY_DTYPES[data.dtype]).itemsize
    if data.slack:
        staged = buffer_array(data, zero=True).view(np.uint8)
        return BoundArg(ArgKind.STAGED, staged, tensor, size, np.dtype(np.uint8))
    return BoundArg(ArgKind.ACTIVATION, None, tensor, size, np.dtype(np.uint8))


def _residual_arg(residual: Buffer, node: onnx.NodeProto) -> BoundArg:
    """The fused shortcut addition's other operand: an 8-bit activation read by pointer."""
    position = INT8_INPUTS.index("residual")
    tensor = node.input[position] if len(node.input) > position else ""
    if not tensor:
        raise LibraryError(f"int8 layer {node.name}: its fused addition has no residual input")
    return BoundArg(ArgKind.ACTIVATION, None, tensor, residual.size,
                    np.dtype(NUMPY_DTYPES[residual.dtype]))


def _bound(buf: Buffer, packed: Mapping[str, np.ndarray], layer: str) -> np.ndarray:
    value = packed.get(buf.name)
    if value is None or value.size != buf.size:
        got = "nothing" if value is None else f"{value.size} elements"
        raise LibraryError(f"int8 layer {layer}: kernel argument {buf.name} needs {buf.size} "
                           f"elements, packing gave {got}")
    array = buffer_array(buf, zero=True)
    if array.dtype != value.dtype and buf.dtype != "float32":
        raise LibraryError(f"int8 layer {layer}: argument {buf.name} is {value.dtype}, the "
                           f"kernel reads {array.dtype}")
    array[:buf.size] = np.asarray(value, dtype=array.dtype).reshape(-1)
    return array


def int8_symbols(specs: Iterable[Int8KernelSpec]) -> list[dict[str, Any]]:
    """The manifest's ``int8_kernels`` section."""
    return [spec.entry for spec in specs]
