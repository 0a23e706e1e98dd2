"""Run an ONNX model with a kernel library: tuned kernels for the layers, numpy for the rest.

Loading does all the work that does not depend on the input: it re-plans the model and checks
the plan against the library's manifest, folds constant subgraphs (shapes included), packs
every constant weight once with its template's ``pack``, and allocates each kernel's output and
scratch buffers. Kernel outputs land in fixed buffers planned in one arena (``native``), so a
kernel that feeds another passes a pointer and nothing is copied, and a run of kernels is one
call into the library's C runtime (``run(feeds, native=False)`` walks the steps one by one).
An operator without a numpy implementation here (or with an attribute ours refuses) runs in
onnx's reference evaluator (``fallback``), named in a warning, instead of refusing the model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

from tuner_service.compiler.deploy.concat_inplace import PlacedConcat
from tuner_service.compiler.deploy.errors import DeployError, LibraryError, UnsupportedOperatorError
from tuner_service.compiler.deploy.fallback import (
    FallbackStep,
    fallback_report,
    model_opsets,
    warn_fallbacks,
)
from tuner_service.compiler.deploy.feeds import InputSpec, check_feeds, input_specs, random_feeds
from tuner_service.compiler.deploy.generated_step import (
    GeneratedStep,
    bind_generated,
    generated_workspace,
)
from tuner_service.compiler.deploy.int8_glue import QuantGlueStep, is_glue
from tuner_service.compiler.deploy.int8_step import Int8KernelStep, int8_kernel_for
from tuner_service.compiler.deploy.kernel_step import (
    KernelStep,
    Scratch,
    bind_kernel,
    workspace_elements,
)
from tuner_service.compiler.deploy.layout import apply_layout
from tuner_service.compiler.deploy.library import generated_layer_json, layer_json
from tuner_service.compiler.deploy.loader import KernelLibrary, LoadedGenerated
from tuner_service.compiler.deploy.native import ModelPlan, NativeError
from tuner_service.compiler.deploy.native_program import NativeProgram
from tuner_service.compiler.deploy.node import NodeInfo, OpFn
from tuner_service.compiler.deploy.ops_image import IMAGE_OPS
from tuner_service.compiler.deploy.ops_misc import MISC_OPS
from tuner_service.compiler.deploy.ops_nn import NN_OPS
from tuner_service.compiler.deploy.ops_quant import DOMAIN_OPS, QUANT_OPS, warn_int8_reference
from tuner_service.compiler.deploy.ops_tensor import TENSOR_OPS
from tuner_service.compiler.frontend.fusion import Layer, node_name, plan_layers
from tuner_service.compiler.frontend.generated import GeneratedLayer, plan_generated
from tuner_service.compiler.frontend.graph import index_graph
from tuner_service.compiler.frontend.int8_arithmetic import apply_int8_arithmetic
from tuner_service.compiler.frontend.loading import ModelInput, load_model
from tuner_service.compiler.frontend.precision import PRECISIONS, apply_precision
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN, int8_layer_workload
from tuner_service.compiler.frontend.shapes import InputShapes

logger = logging.getLogger(__name__)

OPS: dict[str, OpFn] = {**TENSOR_OPS, **NN_OPS, **IMAGE_OPS, **MISC_OPS, **QUANT_OPS}
# Never folded at load time even when their inputs are constant.
_NOT_FOLDABLE = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                           "RandomUniformLike", "Multinomial", "Bernoulli"})


class NumpyStep:
    """One node run by our numpy implementation; if that refuses the node (an attribute it
    does not handle), the node moves to onnx's reference evaluator for good."""

    def __init__(self, fn: OpFn, node: onnx.NodeProto, info: NodeInfo,
                 opsets: dict[str, int]) -> None:
        self.fn, self.node, self.info, self.opsets = fn, node, info, opsets
        self.inputs, self.outputs = list(node.input), list(node.output)
        self.fallback: FallbackStep | None = None

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        if self.fallback is not None:
            self.fallback(env)
            return
        args = [env[name] if name else None for name in self.inputs]
        try:
            results = self.fn(args, self.info)
        except UnsupportedOperatorError as e:
            self.fallback = FallbackStep(self.node, self.info, self.opsets, str(e))
            warn_fallbacks([self.fallback])
            self.fallback(env)
            return
        for name, value in zip(self.outputs, results, strict=False):
            if name:
                env[name] = value


class ModelRunner:
    """``run(feeds) -> outputs`` for one model bound to one kernel library."""

    def __init__(self, model: ModelInput, library: KernelLibrary,
                 threads: int | None = None, input_shapes: InputShapes | None = None,
                 native: bool = True) -> None:
        self.library = library
        self.threads = max(1, threads or library.threads)
        # the shapes pinned at build time, unless the caller pins others
        proto = load_model(model, pinned_shapes(library.manifest) if input_shapes is None
                           else input_shapes)
        self._opset = _default_opset(proto)
        self._opsets = model_opsets(proto)
        apply_int8_arithmetic(proto, manifest_int8(library.manifest))
        self._run_seconds = 0.0
        self._shapes = _static_shapes(proto)
        layers = apply_precision(plan_layers(proto), manifest_precision(library.manifest))
        planned = plan_generated(proto, layers) if library.generated is not None else []
        # the activation layout the library was built with (``deploy.layout``)
        layers, planned = apply_layout(proto, layers, planned, library.manifest.get("layout"))
        _check_plan(layers, library.manifest)
        generated = generated_plan(proto, layers, library, planned)
        self.constants = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
        by_last: dict[int, list[Layer | GeneratedLayer]] = {}
        for layer in layers:
            by_last.setdefault(_last_index(layer, proto.graph), []).append(layer)
        for glayer in generated:  # a Split is several layers at one index
            by_last.setdefault(glayer.last_index, []).append(glayer)
        covered = {name for layer in layers for name in layer.nodes}
        covered |= {name for glayer in generated for name in glayer.nodes}
        # one scratch arena, as large as the hungriest kernel's workspaces, shared by all layers
        self.scratch = Scratch(max([*map(workspace_elements, library.kernels.values()),
                                    *map(generated_workspace, (library.generated or {}).values())],
                                   default=0))
        self.steps: list[Any] = []
        self.kernel_steps: list[KernelStep] = []  # tuned layers
        self.generated_steps: list[GeneratedStep] = []
        self.int8_steps: list[Int8KernelStep] = []  # quantized layers on int8 kernels
        self.int8_glue_steps: list[QuantGlueStep] = []  # quantized adds, (de)quantization
        for planned_layer in by_last.get(-1, []):  # layout transforms of model inputs
            self._add_layer(planned_layer, library)
        for index, node in enumerate(proto.graph.node):
            name = node_name(node, index)
            # a layer's last node is covered; a layout transform placed at an uncovered node
            # (its input's producer) runs after it
            if name not in covered:
                self._add_node(node, name)
            for planned_layer in by_last.get(index, []):
                self._add_layer(planned_layer, library)
        self.input_specs: list[InputSpec] = input_specs(proto, self.constants, self._shapes)
        #: input name -> static shape (None where a dimension is dynamic)
        self.inputs = {spec.name: spec.static_shape for spec in self.input_specs}
        self.outputs = [v.name for v in proto.graph.output]
        _check_dataflow(self.steps, set(self.inputs) | set(self.constants), self.outputs)
        # raw weights the kernels packed are not needed any more: keep what steps still read
        read = {name for step in self.steps for name in step.inputs} | set(self.outputs)
        self.constants = {k: v for k, v in self.constants.items() if k in read}
        warn_fallbacks(self.steps)
        warn_int8_reference(self.steps)
        # activation buffers planned ahead (both paths use them); kernel runs become programs
        self.plan = ModelPlan(self.steps, self.outputs, self._shapes, self.scratch)
        for index, output in self.plan.in_place.views.items():
            self.steps[index] = PlacedConcat(self.steps[index], self.plan.views[output])
        self.native = self._native_program() if native else None

    def _native_program(self) -> NativeProgram | None:
        try:
            return NativeProgram(self.plan, self.library.directory / str(
                self.library.manifest.get("library", "libmodel.so")))
        except NativeError as e:
            logger.warning("running step by step, not as a native program: %s", e)
            return None

    def _add_layer(self, layer: Layer | GeneratedLayer, library: KernelLibrary) -> None:
        if isinstance(layer, GeneratedLayer):
            kernel = (library.generated or {})[_generated_symbol(layer, library.manifest)]
            generated = bind_generated(kernel, layer, self.constants,
                                       self._shapes.get(layer.output), self.threads,
                                       self.scratch)
            self.steps.append(generated)
            self.generated_steps.append(generated)
            return
        symbol = _layer_symbol(layer, library.manifest)
        step = bind_kernel(library.kernels[symbol], layer, self.constants,
                           self._shapes.get(layer.output), self.threads, self.scratch)
        self.steps.append(step)
        self.kernel_steps.append(step)

    def _add_node(self, node: onnx.NodeProto, name: str) -> None:
        info = NodeInfo.from_proto(node, name, self._opset)
        constant = all(not n or n in self.constants for n in node.input)
        if (node.domain == INT8_DOMAIN or is_glue(node)) and not constant:  # its int8 kernel
            kernel = int8_kernel_for(self.library.int8_kernels, self.library.manifest, name)
            if isinstance(kernel, LoadedGenerated):
                glue = QuantGlueStep(kernel, node, info, self.constants,
                                     self._shapes.get(node.output[0]), self.threads)
                self.steps.append(glue)
                self.int8_glue_steps.append(glue)
                return
            if kernel is not None:
                _check_int8_layer(node, kernel.workload.key)
                int8 = Int8KernelStep(kernel, node, info, self.constants, self.threads)
                self.steps.append(int8)
                self.int8_steps.append(int8)
                return
        fn = (OPS.get(node.op_type) if node.domain in ("", "ai.onnx")
              else DOMAIN_OPS.get((node.domain, node.op_type)))
        step: NumpyStep | FallbackStep
        if fn is None:
            step = FallbackStep(node, info, self._opsets, "no numpy implementation")
        else:
            step = NumpyStep(fn, node, info, self._opsets)
        if node.op_type == "Shape" and node.input[0] in self._shapes:
            # shape inference fixed every dimension: the Shape is a constant
            probe = {node.input[0]: np.broadcast_to(np.float32(0), self._shapes[node.input[0]])}
            step(probe)
            self.constants[node.output[0]] = probe[node.output[0]]
        elif node.op_type not in _NOT_FOLDABLE and all(
                not n or n in self.constants for n in step.inputs):
            with np.errstate(all="ignore"):
                step(self.constants)
        else:
            self.steps.append(step)

    def run(self, feeds: Mapping[str, np.ndarray], native: bool = True
            ) -> dict[str, np.ndarray]:
        """Outputs by name; FeedError (a DeployError) for inputs that do not fit the model.
        ``native=False`` runs step by step (one Python call per step) on the same buffers."""
        start = time.perf_counter()
        env: dict[str, np.ndarray] = dict(self.constants)
        env.update(check_feeds(self.input_specs, feeds))
        if native and self.native is not None:
            self.native.run(env)
        else:
            for step in self.steps:
                step(env)
        outputs = {name: np.array(env[name], copy=True) for name in self.outputs}
        self._run_seconds += time.perf_counter() - start
        return outputs

    def fallback_report(self) -> list[dict[str, Any]]:
        """Operators run by onnx's reference evaluator: nodes, seconds, share of run time
        (over every ``run`` since load)."""
        steps = [s.fallback if isinstance(s, NumpyStep) else s for s in self.steps]
        return fallback_report(steps, self._run_seconds)

    def profile(self, feeds: Mapping[str, np.ndarray], iterations: int = 10
                ) -> list[dict[str, Any]]:
        """Median seconds of every step over ``iterations`` runs, in graph order."""
        env: dict[str, np.ndarray] = {**self.constants, **feeds}
        samples: list[list[float]] = [[] for _ in self.steps]
        for _ in range(max(1, iterations)):
            for i, step in enumerate(self.steps):
                start = time.perf_counter()
                step(env)
                samples[i].append(time.perf_counter() - start)
        return [{"step": _step_name(step), "kind": _step_kind(step),
                 "median_s": float(np.median(s))}
                for step, s in zip(self.steps, samples, strict=True)]

    def random_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded inputs of the model's static shapes and dtypes (benchmarks, checks)."""
        return random_feeds(self.input_specs, seed)


def _step_kind(step: Any) -> str:
    if isinstance(step, PlacedConcat):
        return "generated"
    if isinstance(step, Int8KernelStep | QuantGlueStep):
        return "int8"
    if isinstance(step, GeneratedStep):
        return "generated"
    if isinstance(step, KernelStep):
        return "kernel"
    if isinstance(step, FallbackStep) or getattr(step, "fallback", None) is not None:
        return "reference"
    return "numpy"


def _step_name(step: Any) -> str:
    if isinstance(step, QuantGlueStep):
        return f"{step.layer} [int8 glue {step.op.kind}]"
    if isinstance(step, GeneratedStep):
        return f"{step.layer} [generated {step.op.kind}]"
    if isinstance(step, PlacedConcat):
        return f"{step.layer} [generated concat, written in place]"
    if isinstance(step, KernelStep):
        return f"{step.layer} [{step.kernel.workload.key}]"
    return f"{step.info.name} ({step.info.op_type})"


def _default_opset(proto: onnx.ModelProto) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


def pinned_shapes(manifest: dict[str, Any]) -> dict[str, tuple[int, ...]] | None:
    """The input shapes ``tuner build --input-shape`` recorded (None if there are none)."""
    shapes = manifest.get("model", {}).get("input_shapes")
    if not shapes or not isinstance(shapes, dict):
        return None
    try:
        return {str(name): tuple(int(d) for d in dims) for name, dims in shapes.items()}
    except (TypeError, ValueError) as e:
        raise DeployError(f"the manifest's input_shapes {shapes!r} are malformed") from e


def _static_shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, info in index_graph(proto.graph).tensors.items():
        if info.dims is not None and all(isinstance(d, int) and d >= 0 for d in info.dims):
            out[name] = tuple(int(d) for d in info.dims if d is not None)
    return out


def _last_index(layer: Layer, graph: onnx.GraphProto) -> int:
    names = set(layer.nodes)
    found = [i for i, n in enumerate(graph.node) if node_name(n, i) in names]
    if len(found) != len(names):
        raise DeployError(f"layer {layer.nodes[0]} names nodes that are not in the graph")
    return max(found)


def manifest_int8(manifest: dict[str, Any]) -> str:
    """The arithmetic of the library's int8 layers (``int8_arithmetic``; absent: exact)."""
    arithmetic = str(manifest.get("int8_arithmetic", "exact"))
    if arithmetic not in ("exact", "sat16"):
        raise LibraryError(f"the manifest names an unknown int8 arithmetic {arithmetic!r}; "
                           "rebuild the library with this version")
    return arithmetic


def manifest_precision(manifest: dict[str, Any]) -> str:
    precision = str(manifest.get("precision", "fp32"))
    if precision not in PRECISIONS:
        raise LibraryError(f"the manifest names an unknown precision {precision!r}; rebuild "
                           "it with tuner build")
    return precision


def _check_int8_layer(node: onnx.NodeProto, built: str) -> None:
    """The library's kernel for an int8 layer computes the layer the model has now (a library
    built by an earlier version, before a rewrite fused more into the layer, would silently
    leave that part out)."""
    wanted = int8_layer_workload(node).key
    if wanted != built:
        raise LibraryError(f"int8 layer {node.name}: the library's kernel computes {built}, "
                           f"this model's layer is {wanted}; the library was built by another "
                           "version or for another model: rebuild it with tuner build")


def _check_plan(layers: Sequence[Layer], manifest: dict[str, Any]) -> None:
    built = manifest.get("layers", [])
    if len(built) != len(layers):
        raise LibraryError(f"the library was built for a model with {len(built)} kernel layers, "
                           f"this model has {len(layers)}; rebuild it with tuner build")
    for entry, layer in zip(built, layers, strict=True):
        mine = layer_json(layer, entry["kernel"])
        if mine != entry:
            raise LibraryError(
                f"layer {layer.nodes[0]} ({layer.workload.key}) does not match the library's "
                f"layer {entry['name']} ({entry['workload']}): the library was built for "
                "another model; rebuild it with tuner build")


def generated_plan(proto: onnx.ModelProto, layers: Sequence[Layer], library: KernelLibrary,
                   planned: Sequence[GeneratedLayer] | None = None) -> list[GeneratedLayer]:
    """The generated layers of the model (``planned``, else planned here), checked against the
    library's; none when the library has no generated kernels (built with ``generated=False``
    or before they existed)."""
    if library.generated is None:
        return []
    generated = list(planned) if planned is not None else plan_generated(proto, layers)
    built = library.manifest.get("generated_layers", [])
    if len(built) != len(generated):
        raise LibraryError(f"the library was built with {len(built)} generated layers, this "
                           f"model has {len(generated)}; rebuild it with tuner build")
    for entry, layer in zip(built, generated, strict=True):
        kernel = library.generated.get(str(entry.get("kernel")))
        if (generated_layer_json(layer, entry["kernel"]) != entry or kernel is None
                or kernel.op.key != layer.op.key):
            raise LibraryError(
                f"generated layer {layer.nodes[0]} ({layer.op.kind}) does not match the "
                f"library's layer {entry.get('name')}: the library was built for another model "
                "(or another version of the planner); rebuild it with tuner build")
    return generated


def _generated_symbol(layer: GeneratedLayer, manifest: dict[str, Any]) -> str:
    for entry in manifest["generated_layers"]:
        if entry["output"] == layer.output:
            return str(entry["kernel"])
    raise LibraryError(f"the library has no generated kernel for layer {layer.nodes[0]}")


def _layer_symbol(layer: Layer, manifest: dict[str, Any]) -> str:
    for entry in manifest["layers"]:
        if entry["name"] == layer.nodes[0]:
            return str(entry["kernel"])
    raise LibraryError(f"the library has no kernel for layer {layer.nodes[0]}")


def _check_dataflow(steps: Sequence[Any], available: set[str], outputs: Sequence[str]) -> None:
    """Every tensor a step reads is produced before it (a planner bug shows up here, at load)."""
    known = set(available)
    for step in steps:
        for name in step.inputs:
            if name and name not in known:
                where = getattr(step, "info", None) or getattr(step, "layer", None)
                raise DeployError(f"tensor {name!r} is read before it is produced ({where})")
        known.update(n for n in step.outputs if n)
    missing = [n for n in outputs if n not in known]
    if missing:
        raise DeployError(f"model outputs {missing} are never produced")

