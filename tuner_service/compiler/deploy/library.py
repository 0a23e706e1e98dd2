"""``tuner build``: compile every tunable layer of a model into one shared library.

Output directory layout:
- ``libmodel.so``: one exported C function per distinct (template, workload, config) kernel,
  ``void SYMBOL(float *arg0, ..., float *out, float *workspace..., int64_t nthreads)``: the
  arguments are the kernel's inputs in the order the manifest lists them (activations and
  pre-packed constants), then the output, then scratch buffers of the listed sizes (zeroed once
  by the caller, reused across calls), then the thread count for its libgomp parallel loop.
  Buffers are dense fp32 arrays; ``elements`` includes slack the kernel may over-read.
- ``manifest.json``: format version, host CPU, default thread count (the one the configs were
  tuned at unless ``--threads`` says otherwise; ``tuned_threads``), and per kernel its symbol,
  workload key, template and version, config (and whether it was tuned or the default), argument
  order, shapes and sizes; per layer the ONNX nodes it covers and the tensors it reads and writes.
  ``generated`` lists the generated operators (``schedule_templates.ops``: elementwise chains,
  pooling, softmax, layer norm, data movement) compiled as ``gNNN_KIND`` for the other nodes
  ``frontend.generated`` maps, and ``generated_layers`` their layers. A manifest without them
  (``generated=False``, or written before they existed) still loads: those nodes run in numpy.

Constant weights are not stored: ``tuner run`` packs them from the ONNX model at load time
(``Template.pack``), so one library serves every checkpoint of the same architecture and the
build output stays small. The runner re-plans the model and refuses a library whose layers or
kernels do not match it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from llvmlite import ir

from schedule_templates.codegen.llvm_ir import generate_llvm_ir
from schedule_templates.codegen.llvm_jit import emit_object, host_features
from schedule_templates.errors import ScheduleError
from schedule_templates.ir.nodes import Kernel
from schedule_templates.ops.base import GeneratedOp
from schedule_templates.protocol import Target
from schedule_templates.runtime import lower
from schedule_templates.space import Config
from schedule_templates.templates.base import Template, get_template
from schedule_templates.workloads import Workload
from tuner_service.compiler.deploy.configs import Choice, ConfigBook
from tuner_service.compiler.deploy.errors import BuildError
from tuner_service.compiler.deploy.int8_step import (
    Int8KernelSpec,
    int8_kernel_specs,
    int8_symbols,
)
from tuner_service.compiler.deploy.layout import (
    apply_layout,
    check_layout,
    int8_channels_last,
    layout_entry,
)
from tuner_service.compiler.deploy.native_build import RUNTIME_LIBS, compile_runtime
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.fusion import Layer, plan_layers
from tuner_service.compiler.frontend.generated import GeneratedLayer, plan_generated
from tuner_service.compiler.frontend.int8_arithmetic import apply_int8_arithmetic, resolve_int8
from tuner_service.compiler.frontend.loading import ModelInput, load_model
from tuner_service.compiler.frontend.precision import PRECISIONS, apply_precision
from tuner_service.compiler.frontend.shapes import InputShapes

logger = logging.getLogger(__name__)

MANIFEST_VERSION = 1
LIBRARY_FILE = "libmodel.so"
MANIFEST_FILE = "manifest.json"


@dataclasses.dataclass
class KernelSpec:
    symbol: str
    workload: Workload
    template: Template
    choice: Choice
    kernel: Kernel
    layers: list[str] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return self.workload.key


@dataclasses.dataclass
class GeneratedSpec:
    """One distinct generated operator (``schedule_templates.ops``) and the layers using it."""

    symbol: str
    op: GeneratedOp
    kernel: Kernel
    layers: list[str] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"generated {self.op.kind} {self.symbol}"


def build_library(model: ModelInput, book: ConfigBook, out_dir: Path,
                  target: str = "llvm", threads: int | None = None,
                  input_shapes: InputShapes | None = None, generated: bool = True,
                  layout: str = "nchw", precision: str = "fp32",
                  plain_layers: Collection[str] = (), int8: str = "auto") -> dict[str, Any]:
    """Compile, link and describe; returns the manifest (also written to ``out_dir``).

    ``threads`` is the library's default run thread count: by default the one the configs
    were tuned at (1 when they do not say); another count than theirs is a warning.
    ``model`` may be a path (external data beside it); ``input_shapes`` pins dynamic inputs
    and is recorded in the manifest, so that ``ModelRunner`` pins them the same way.
    ``generated`` compiles the other nodes the generated-operator planner maps (elementwise
    chains, pooling, softmax, ...) into the library too; without it they run in numpy.
    ``layout`` ``nchwc`` runs conv-family layers on blocked activations (``deploy.layout``)
    but those named in ``plain_layers`` (by output tensor: a per-layer choice);
    ``precision`` ``bf16`` computes the dense layers on bfloat16 products (``precision``);
    ``int8`` is the arithmetic of a quantized model's int8 layers (``int8_arithmetic``)."""
    check_layout(layout, generated)
    check_build_precision(precision)
    if Target.parse(target).kind != "llvm":
        raise BuildError(f"tuner build compiles CPU libraries (target llvm), not {target!r}")
    tuned_threads = book.threads
    threads = default_threads(threads, tuned_threads)
    try:
        arithmetic = resolve_int8(int8)
    except ModelError as e:
        raise BuildError(str(e)) from e
    proto = load_model(model, input_shapes)
    saturating = apply_int8_arithmetic(proto, arithmetic)
    layers = apply_precision(plan_layers(proto), precision)
    entry = layout_entry(layout, plain=plain_layers,
                         int8=layout != "nchw" and int8_channels_last(proto))
    layers, glayers = apply_layout(proto, layers, plan_generated(proto, layers) if generated
                                   else [], entry)
    kernels: dict[tuple[str, str, int], KernelSpec] = {}
    layer_entries = []
    for layer in layers:
        spec = _kernel_for(layer, book, target, kernels)
        spec.layers.append(layer.nodes[0])
        layer_entries.append(layer_json(layer, spec.symbol))
    extra: dict[str, GeneratedSpec] = {}
    extra_entries = []
    for glayer in glayers:
        gspec = _generated_for(glayer, extra)
        gspec.layers.append(glayer.output)
        extra_entries.append(generated_layer_json(glayer, gspec.symbol))
    int8_specs = int8_kernel_specs(proto, book, target)  # quantized layers (``int8_step``)
    out_dir.mkdir(parents=True, exist_ok=True)
    _compile_and_link([*kernels.values(), *extra.values(), *int8_specs],
                      out_dir / LIBRARY_FILE)
    manifest = {
        "format_version": MANIFEST_VERSION,
        "library": LIBRARY_FILE,
        "target": target,
        "host": host_json(),
        "threads": threads,
        "tuned_threads": tuned_threads,
        "weights": "packed from the ONNX model at load time (Template.pack)",
        "model": {"graph": proto.graph.name,
                  "plan_sha256": plan_digest(layer_entries + extra_entries),
                  "input_shapes": {k: list(v) for k, v in (input_shapes or {}).items()}},
        "kernels": [kernel_json(spec) for spec in kernels.values()],
        "layers": layer_entries,
    }
    if entry["mode"] != "nchw":  # absent: plain NCHW (as before layouts existed)
        manifest["layout"] = entry
    if precision != "fp32":  # absent: every layer as exported
        manifest["precision"] = precision
    if int8_specs:
        manifest["int8_kernels"] = int8_symbols(int8_specs)
    if saturating:  # absent: exact int32 sums
        manifest["int8_arithmetic"] = arithmetic
    if generated:  # absent: a runner computes those nodes in numpy (as before they existed)
        manifest["generated"] = [generated_json(spec) for spec in extra.values()]
        manifest["generated_layers"] = extra_entries
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_build_precision(precision: str) -> None:
    """BuildError for an unknown precision, or bf16 on a CPU without AVX-512 BF16."""
    if precision not in PRECISIONS:
        raise BuildError(f"unknown precision {precision!r}; expected one of "
                         f"{', '.join(PRECISIONS)}")
    if precision == "bf16" and "+avx512bf16" not in host_features().split(","):
        raise BuildError("--precision bf16 needs a CPU with AVX-512 BF16 (vdpbf16ps); this "
                         f"one ({host_json()['cpu']}) lacks it: build with fp32")
    if precision == "bf16":
        warn_if_bf16_is_slow()


@functools.cache
def warn_if_bf16_is_slow() -> None:
    """``bf16_advice`` as a warning, once a process (``layout auto`` builds up to three
    libraries)."""
    advice = bf16_advice()
    if advice:
        logger.warning("%s", advice)


#: bf16 pays where its dot product outruns the FMAs by at least this (Zen 4/5: about 2x)
BF16_WORTH = 1.2


def bf16_advice() -> str | None:
    """A warning when this CPU's ``vdpbf16ps`` does not outrun its fp32 FMAs (Intel cores
    without AMX issue it at half their FMA rate: bf16 ResNet-50 ran 95 ms against 53 in fp32
    on Emerald Rapids), measured by the peak loops on one core (a few milliseconds); None
    where bf16 pays or the loops cannot run. Where the host grants AMX tiles, the dense and
    convolution layers run on ``tdpbf16ps`` instead, and its loop is the one compared."""
    from schedule_templates.peak import measure_peak_gflops, measure_tile_peak_gops
    from schedule_templates.templates.x86_amx_gemm import host_amx

    try:
        fp32 = measure_peak_gflops(1, repeat=5)
        bf16 = (measure_tile_peak_gops(1, "tdpbf16ps", repeat=3) if host_amx("tdpbf16ps")
                else measure_peak_gflops(1, repeat=5, instruction="dpbf16ps"))
    except ScheduleError:
        return None
    if bf16 >= BF16_WORTH * fp32:
        return None
    return (f"on this CPU ({host_json()['cpu']}) bf16 dot products peak at {bf16:.0f} GFLOPS "
            f"against {fp32:.0f} for fp32 FMAs: layers that are compute-bound will run slower "
            "in bf16 than in fp32 (build with fp32, or time both with `tuner run`)")


def default_threads(requested: int | None, tuned: int | None) -> int:
    """``requested`` if given (warning when the configs were tuned at another count), else the
    tuned count, else 1."""
    if requested is None:
        return tuned or 1
    if tuned is not None and requested != tuned:
        logger.warning("the configs were tuned at %d thread(s); the library defaults to %d: "
                       "their speed-ups may not hold (tune at %d threads, or omit --threads)",
                       tuned, requested, requested)
    return max(1, requested)


def host_json() -> dict[str, str]:
    import llvmlite.binding as llvm

    return {"cpu": llvm.get_host_cpu_name(), "triple": llvm.get_default_triple(),
            "features": host_features()}


def _kernel_for(layer: Layer, book: ConfigBook, target: str,
                kernels: dict[tuple[str, str, int], KernelSpec]) -> KernelSpec:
    workload: Workload = layer.workload
    template = get_template(workload.op, target)
    choice = book.choose(workload, template, fallback_keys(workload))
    if choice is None:
        logger.warning("layer %s (%s): no tuned config, using the template default",
                       layer.nodes[0], workload.key)
        choice = Choice(template.default_config(workload), "default", None, None)
    key = (template.name, workload.key, choice.config.index)
    if key not in kernels:
        symbol = f"k{len(kernels):03d}_{workload.op}"
        try:
            kernel = lower(workload, template, choice.config)
        except ScheduleError as e:
            raise BuildError(f"layer {layer.nodes[0]}: cannot lower {workload.key}: {e}") from e
        kernel = dataclasses.replace(kernel, name=symbol)
        kernels[key] = KernelSpec(symbol, workload, template, choice, kernel)
    return kernels[key]


def _generated_for(layer: GeneratedLayer, specs: dict[str, GeneratedSpec]) -> GeneratedSpec:
    key = layer.op.key
    if key not in specs:
        symbol = f"g{len(specs):03d}_{layer.op.kind}"
        try:
            kernel = layer.op.lower()
        except ScheduleError as e:
            raise BuildError(f"layer {layer.nodes[0]}: cannot lower its generated "
                             f"{layer.op.kind}: {e}") from e
        specs[key] = GeneratedSpec(symbol, layer.op, dataclasses.replace(kernel, name=symbol))
    return specs[key]


def fallback_keys(workload: Workload) -> list[str]:
    """Keys whose tuned configs also fit ``workload``: a fused workload shares the search
    space of its unfused base (the epilogue only changes the output stage)."""
    base_key = str(getattr(workload, "base_key", workload.key))
    return [base_key] if base_key != workload.key else []


def _compile_and_link(specs: Iterable[KernelSpec | GeneratedSpec | Int8KernelSpec],
                      library: Path) -> None:
    linker = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if linker is None:
        raise BuildError("no C compiler driver (cc, gcc or clang) found to link the library")
    with tempfile.TemporaryDirectory(prefix="tuner-build-") as tmp:
        objects = []
        for spec in specs:
            path = Path(tmp) / f"{spec.symbol}.o"
            try:
                path.write_bytes(emit_object(generate_llvm_ir(spec.kernel)))
            except ScheduleError as e:
                raise BuildError(f"code generation failed for {spec.label}: {e}") from e
            objects.append(str(path))
        if not objects:  # a model without tunable layers still gets a (kernel-less) library
            path = Path(tmp) / "empty.o"
            path.write_bytes(emit_object(ir.Module(name="empty")))
            objects.append(str(path))
        objects.append(str(compile_runtime(linker, Path(tmp))))  # the native executor
        staging = Path(tmp) / library.name
        command = [linker, "-shared", "-o", str(staging), *objects, "-lgomp", *RUNTIME_LIBS,
                   "-Wl,-z,noexecstack"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"linking {library.name} failed: {done.stderr.strip()[-2000:]}")
        shutil.move(str(staging), library)


def kernel_json(spec: KernelSpec) -> dict[str, Any]:
    config: Config = spec.choice.config
    kernel = spec.kernel
    args = [_arg_json(b, "input") for b in kernel.params[:-1]]
    args.append(_arg_json(kernel.output, "output"))
    args += [_arg_json(b, "workspace") for b in kernel.workspace]
    return {
        "symbol": spec.symbol,
        "workload": spec.workload.key,
        "op": spec.workload.op,
        "template": spec.template.name,
        "template_version": spec.template.version,
        "config": config.to_json(),
        "config_source": spec.choice.source,
        "tuned_key": spec.choice.tuned_key,
        "tuned_latency_s": spec.choice.mean_cost,
        "tuned_threads": spec.choice.threads,
        "flops": spec.workload.flops(),
        "args": args,
        "workspace_bytes": 4 * sum(b.size + b.slack for b in kernel.workspace),
        "layers": spec.layers,
    }


def generated_json(spec: GeneratedSpec) -> dict[str, Any]:
    kernel = spec.kernel
    args = [_arg_json(b, "input") for b in kernel.params[:-1]]
    args.append(_arg_json(kernel.output, "output"))
    args += [_arg_json(b, "workspace") for b in kernel.workspace]
    return {"symbol": spec.symbol, "op": spec.op.to_json(), "args": args,
            "workspace_bytes": 4 * sum(b.size + b.slack for b in kernel.workspace),
            "layers": spec.layers}


def _arg_json(buf: Any, role: str) -> dict[str, Any]:
    return {"name": buf.name, "role": role, "shape": list(buf.shape),
            "elements": buf.size + buf.slack}


def layer_json(layer: Layer, symbol: str) -> dict[str, Any]:
    return {"name": layer.nodes[0], "nodes": list(layer.nodes), "kernel": symbol,
            "workload": layer.workload.key, "inputs": dict(layer.inputs),
            "constants": sorted(layer.constants), "output": layer.output}


def generated_layer_json(layer: GeneratedLayer, symbol: str) -> dict[str, Any]:
    return {"name": layer.nodes[0], "nodes": list(layer.nodes), "kernel": symbol,
            "op": layer.op.kind, "inputs": dict(layer.inputs),
            "constants": sorted(layer.constants), "output": layer.output}


def plan_digest(layer_entries: list[dict[str, Any]]) -> str:
    """Identifies the model structure the library was built for (weights excluded)."""
    keyed = [{k: v for k, v in e.items() if k != "kernel"} for e in layer_entries]
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()
