"""Task extraction: which tunable workloads a model runs, and how often.

Only operators with a template become tasks. Every other operator that does the heavy lifting in
a model (a transposed convolution, a 3-D Conv, a MatMul with odd broadcasting, a layer with a
dynamic batch) is reported in ``unsupported`` with the reason, so the user sees what the tuner
will not touch instead of silently getting a partial speed-up. Cheap operators (activations,
pooling, normalization, reshapes) are neither tasks nor unsupported: libraries do them well.
Epilogues the layer plan fuses into a tunable node (bias, batch norm, residual add, ReLU/clip,
see ``fusion``) are part of its task's workload key.

A library built with blocked activations (``tuner build --layout nchwc``) runs its conv-family
layers as other workloads (``conv2d_nchwc``, ``depthwise_conv2d_nchwc``, with the block of the
machine that runs it); ``layout`` gives the tasks of that plan (``nchwc``) or of both plans
(``auto``, what ``tuner build --layout auto`` builds and compares), so each plan finds tuned
records of the kernels it runs. The blocked plan also keeps int8 activations channels-last
between int8 convolutions (``quantized_layout``): its int8 tasks carry the layouts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType

import onnx

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.workloads import Workload, parse_workload
from schedule_templates.workloads.conv_nchwc import BLOCKS
from tuner_service.compiler.frontend.conv import map_conv
from tuner_service.compiler.frontend.errors import ModelError, UnmappableNode
from tuner_service.compiler.frontend.external import DataFiles
from tuner_service.compiler.frontend.fusion import fused_workloads
from tuner_service.compiler.frontend.graph import GraphIndex, index_graph
from tuner_service.compiler.frontend.int8_arithmetic import apply_int8_arithmetic, resolve_int8
from tuner_service.compiler.frontend.layout import LAYOUTS, blocked_workload
from tuner_service.compiler.frontend.layout_plans import is_blocked as blocked_key
from tuner_service.compiler.frontend.loading import ModelInput, load_model
from tuner_service.compiler.frontend.matmul import map_gemm, map_matmul
from tuner_service.compiler.frontend.precision import at_precision, check_precision
from tuner_service.compiler.frontend.quantized_layout import plan_channels_last
from tuner_service.compiler.frontend.quantized_ops import (
    INT8_DOMAIN,
    int8_layer_workload,
    map_conv_integer,
    map_matmul_integer,
)
from tuner_service.compiler.frontend.shapes import InputShapes

logger = logging.getLogger(__name__)

Mapper = Callable[[onnx.NodeProto, GraphIndex], Workload]

# ONNX operator (default domain) -> the function that maps one node to a workload.
_MAPPERS: Mapping[str, Mapper] = MappingProxyType(
    {"Conv": map_conv, "Gemm": map_gemm, "MatMul": map_matmul,
     "MatMulInteger": map_matmul_integer, "ConvInteger": map_conv_integer}
)

# Compute-heavy operators without a template: always reported, never dropped.
_NO_TEMPLATE: Mapping[str, str] = MappingProxyType(
    {
        "ConvTranspose": "transposed convolution has no template",
        # the ones the int8 kernels take (u8 x constant s8) became Int8Layer nodes at load
        "QLinearConv": "quantized convolution with uint8 or non-constant weights has no "
                       "int8 template (runs in numpy)",
        "QLinearMatMul": "quantized matmul with uint8 or non-constant weights has no int8 "
                         "template (runs in numpy)",
        "DeformConv": "deformable convolution has no template",
        "Einsum": "Einsum has no template; export it as MatMul",
        "Attention": "fused Attention has no template; export it as MatMul + Softmax",
        "LSTM": "recurrent layers have no template",
        "GRU": "recurrent layers have no template",
        "RNN": "recurrent layers have no template",
    }
)

# Starts the reason of a node whose dimensions no workload accepts (absurd or hostile sizes).
_INVALID_PREFIX = "invalid workload: "


@dataclasses.dataclass(frozen=True)
class ExtractedTask:
    """One distinct workload and the nodes (``weight`` of them) that compute it."""

    workload: Workload
    weight: int
    nodes: tuple[str, ...]
    #: every fused key these nodes compute (``workload`` is the most frequent of them)
    variants: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Unsupported:
    """A compute-heavy node that will not be tuned, and why."""

    op: str
    node: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ExtractionResult:
    """Tasks in order of first appearance in the graph, and the nodes left out."""

    tasks: list[ExtractedTask]
    unsupported: list[Unsupported]
    #: the plans the tasks are for: ``nchw``, ``nchwc`` or ``auto`` (both)
    layout: str = "nchw"

    def total_flops(self) -> int:
        """FLOPs of one inference spent in tunable layers (each task times its weight); with
        both layouts' tasks, of the plain plan (the blocked twins compute the same layers)."""
        return sum(t.workload.flops() * t.weight for t in self.tasks
                   if self.layout != "auto" or not is_blocked(t.workload))


def extract_tasks(model: ModelInput, input_shapes: InputShapes | None = None,
                  files: DataFiles | None = None, precision: str = "fp32",
                  layout: str = "nchw", block: int | None = None, int8: str = "auto"
                  ) -> ExtractionResult:
    """Map every tunable node of ``model`` to a workload and merge identical workloads.

    ``model``, ``input_shapes`` and ``files`` are as for ``loading.load_model`` (a ``Path``
    reads external data from the model's folder); ``precision`` gives the tasks of a library
    built at that precision (``precision.at_precision``); ``layout`` and ``block`` those of a
    library built with that layout and channel block (``tasks_in_layout``); ``int8`` the
    arithmetic of its int8 layers (``int8_arithmetic``: ``auto`` is this host's). CPU-bound (about
    0.2 s for ResNet-18 bytes, more for a ModelProto, which must be serialized for onnx's
    checker); async callers should run it in a worker thread.

    Raises ModelError if ``model`` is not a valid ONNX model whose shapes can be inferred
    (external data only from its folder or ``files``), or if it has tunable layers and every
    one of them has absurd dimensions, or for an unknown ``layout`` or ``block``.
    """
    check_precision(precision)
    check_task_layout(layout, block)
    arithmetic = resolve_int8(int8)
    proto = load_model(model, input_shapes, files)
    apply_int8_arithmetic(proto, arithmetic)
    graph = index_graph(proto.graph)
    fused = fused_workloads(proto, graph)
    # base key -> fused key -> (workload, node names): one task per base workload
    found: dict[str, dict[str, tuple[Workload, list[str]]]] = {}
    unsupported: list[Unsupported] = []
    rejected = 0
    # channels-last int8 activations are planned on hosts with AVX-512 VNNI only: machines of
    # block 8 (AVX2) run the plain plan's int8 layers whatever the layout
    laid = _channels_last(proto) if layout != "nchw" and block != 8 else None
    for index, node in enumerate(proto.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        outcome = _map_node(node, name, graph)
        if isinstance(outcome, Unsupported):
            unsupported.append(outcome)
            rejected += outcome.reason.startswith(_INVALID_PREFIX)
        elif outcome is not None:
            outcome = at_precision(fused.get(index, outcome), precision)
            for workload in _in_layouts(outcome, laid, index, layout):
                variants = found.setdefault(workload.base_key, {})
                variants.setdefault(workload.key, (workload, []))[1].append(name)
    unsupported.extend(_nested_unsupported(proto.graph))
    if rejected and not found and rejected == len(unsupported):
        raise ModelError(f"every tunable layer has impossible dimensions: {unsupported[0].reason}")
    tasks = tasks_in_layout([_merge_variants(variants) for variants in found.values()],
                            layout, block or 0)
    logger.debug("extracted %d tasks, %d unsupported nodes", len(tasks), len(unsupported))
    return ExtractionResult(tasks=tasks, unsupported=unsupported, layout=layout)


def _channels_last(proto: onnx.ModelProto) -> onnx.GraphProto | None:
    """The graph's nodes as a blocked plan runs its int8 layers: channels-last activations
    between int8 convolutions (``quantized_layout``; the build plans it on hosts with VNNI and
    no AMX, so the tasks are those such workers tune). None without int8 layers. Only the
    nodes and outputs are copied (the plan reads nothing else): not the weights."""
    if not any(node.domain == INT8_DOMAIN for node in proto.graph.node):
        return None
    laid = onnx.ModelProto()
    laid.graph.node.extend(proto.graph.node)
    laid.graph.output.extend(proto.graph.output)
    plan_channels_last(laid)
    return laid.graph


def _in_layouts(workload: Workload, laid: onnx.GraphProto | None, index: int, layout: str
                ) -> list[Workload]:
    """The tasks of node ``index`` in ``layout``: its int8 layer as the plain plan runs it,
    as the blocked one does (``nchwc``), or both (``auto``)."""
    if laid is None or laid.node[index].domain != INT8_DOMAIN:
        return [workload]
    twin = int8_layer_workload(laid.node[index])
    if twin == workload:
        return [workload]
    return [twin] if layout == "nchwc" else [workload, twin]


def check_task_layout(layout: str, block: int | None) -> None:
    """ModelError unless ``layout`` is one of ``LAYOUTS`` and a blocked one names a ``block``
    a blocked workload takes (the vector width in floats of the machines that will run it)."""
    if layout not in LAYOUTS:
        raise ModelError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if layout != "nchw" and block not in BLOCKS:
        raise ModelError(f"layout {layout} needs the channel block of the machines that run "
                         f"the library (one of {', '.join(map(str, BLOCKS))}: its vector width "
                         f"in floats), not {block!r}")


def tasks_in_layout(tasks: list[ExtractedTask], layout: str, block: int) -> list[ExtractedTask]:
    """``tasks`` as the plan in ``layout`` runs them: ``nchw`` as they are; ``nchwc`` with each
    conv-family task replaced by its blocked twin (same nodes and weight; ``layout.
    blocked_workload`` decides, as it does for the build); ``auto`` with the twin right after
    its plain task, both tuned, since the build times both plans."""
    if layout == "nchw":
        return tasks
    out: list[ExtractedTask] = []
    for task in tasks:
        twin = _blocked_task(task, block)
        if twin is None or layout == "auto":
            out.append(task)
        if twin is not None:
            out.append(twin)
    return out


def is_blocked(workload: Workload) -> bool:
    """Whether ``workload`` is an operator on blocked (or channels-last int8) activations."""
    return blocked_key(workload.key)


def _blocked_task(task: ExtractedTask, block: int) -> ExtractedTask | None:
    workload = blocked_workload(task.workload, block)
    if workload is None:
        return None
    variants = []
    for key in task.variants:
        variant = blocked_workload(parse_workload(key), block)
        variants.append(variant.key if variant is not None else key)
    return dataclasses.replace(task, workload=workload, variants=tuple(sorted(variants)))


def _merge_variants(variants: Mapping[str, tuple[Workload, list[str]]]) -> ExtractedTask:
    """One task for the layers that share a base workload but fuse different epilogues.

    Their spaces and records are the same (an epilogue changes only the output stage), so
    tuning each variant separately would spend the budget twice on one space. The task
    measures the most frequent variant, so its timings include a real epilogue, and weighs all
    of them; the tuning log serves the other variants from its records (``log.best``).
    """
    workload, _ = max(variants.values(), key=lambda pair: len(pair[1]))  # first on ties
    names = [name for _, group in variants.values() for name in group]
    return ExtractedTask(workload, len(names), tuple(names), tuple(sorted(variants)))


def _map_node(node: onnx.NodeProto, name: str, graph: GraphIndex) -> Workload | Unsupported | None:
    """The node's workload, why it has none, or None for an operator we do not tune."""
    if node.domain == INT8_DOMAIN:  # a quantized layer (``quantized``): an int8 task
        return _int8_task(node, name)
    if node.domain not in ("", "ai.onnx"):
        if _looks_tunable(node.op_type):
            return Unsupported(node.op_type, name, f"operator from custom domain {node.domain!r}")
        return None
    if node.op_type in _NO_TEMPLATE:
        return Unsupported(node.op_type, name, _NO_TEMPLATE[node.op_type])
    mapper = _MAPPERS.get(node.op_type)
    if mapper is None:
        return None
    try:
        return mapper(node, graph)
    except UnmappableNode as e:
        return Unsupported(node.op_type, name, e.reason)
    except InvalidWorkloadError as e:
        return Unsupported(node.op_type, name, f"{_INVALID_PREFIX}{e}")


def _int8_task(node: onnx.NodeProto, name: str) -> Workload | Unsupported:
    try:
        return int8_layer_workload(node)
    except UnmappableNode as e:
        return Unsupported(node.op_type, name, e.reason)


def _looks_tunable(op_type: str) -> bool:
    """Custom-domain ops have no schema we know; judge by name (``com.microsoft.FusedConv``)."""
    return (
        op_type in _MAPPERS
        or op_type in _NO_TEMPLATE
        or any(word in op_type for word in ("Conv", "MatMul", "Gemm", "Attention"))
    )


def _nested_unsupported(graph: onnx.GraphProto) -> Iterator[Unsupported]:
    """Tunable nodes inside If/Loop/Scan bodies: their shapes depend on control flow."""
    for node in graph.node:
        for sub in _subgraphs(node):
            for index, inner in enumerate(sub.node):
                if _looks_tunable(inner.op_type):
                    name = inner.name or f"{inner.op_type}_{index}"
                    reason = f"inside the body of {node.op_type} node {node.name!r}"
                    yield Unsupported(inner.op_type, name, reason)
            yield from _nested_unsupported(sub)


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs
