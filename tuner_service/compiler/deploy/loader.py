"""Open a kernel library built by ``tuner build``: read its manifest, check it, load the .so.

The checks turn what would be a crash or a silently wrong answer into a message: a manifest of
another format version, a library compiled for CPU features this machine lacks, a template that
changed since the build (its configs would mean something else now).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from schedule_templates.errors import ScheduleError
from schedule_templates.ops.base import GeneratedOp, op_from_json
from schedule_templates.space import Config
from schedule_templates.templates.base import Template, template_by_name
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.library import LIBRARY_FILE, MANIFEST_FILE, MANIFEST_VERSION

logger = logging.getLogger(__name__)

# CPU features whose absence makes generated code fault (illegal instruction) rather than slow.
_CRITICAL_FEATURES = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx2", "fma", "avx")

#: How the kernels' libgomp worker threads wait between parallel loops: None keeps libgomp's own
#: default (spin GOMP_SPINCOUNT=300000 iterations, then sleep), "passive" / "active" set
#: OMP_WAIT_POLICY, a number sets GOMP_SPINCOUNT. Spinning saves a wake-up per layer on an idle
#: machine and costs a time slice per layer on a loaded one. ``bench/omp_policy.py``, 2 threads,
#: Intel Xeon (AVX-512, 2 cores), idle: SqueezeNet 6.35 ms libgomp default / 6.55 ms spin 10000 /
#: 11.3 ms passive; MobileNet-v3 4.43 / 4.42 / 10.8 ms. Loaded (load 9-10): SqueezeNet 57.8 /
#: 37.8 / 18.2 ms. A short spin keeps the idle speed and halves most of the loaded penalty.
#: A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT always wins.
WAIT_POLICY: str | None = "10000"
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def apply_wait_policy(policy: str | None,
                      environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Put ``policy`` into the environment unless the user chose one; returns what it set.

    libgomp reads these once, when it is loaded: this runs before the first kernel library (or
    the JIT, which loads libgomp too) is opened in the process, and later calls change nothing
    for a libgomp already running."""
    if policy is None or any(name in environ for name in _WAIT_VARIABLES):
        return {}
    name = "GOMP_SPINCOUNT" if policy.isdigit() else "OMP_WAIT_POLICY"
    environ[name] = policy
    return {name: policy}


@dataclasses.dataclass
class LoadedKernel:
    symbol: str
    workload: Workload
    template: Template
    config: Config
    source: str
    args: list[dict[str, Any]]
    function: Any  # the ctypes function: (void* args..., int64 nthreads) -> void


@dataclasses.dataclass
class LoadedGenerated:
    """A generated operator's kernel (``schedule_templates.ops``): same calling convention."""

    symbol: str
    op: GeneratedOp
    args: list[dict[str, Any]]
    function: Any


class KernelLibrary:
    """The manifest and the callable kernels of one build directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest = read_manifest(directory)
        apply_wait_policy(WAIT_POLICY)  # before check_host: host_features loads libgomp
        check_host(self.manifest)
        path = directory / str(self.manifest.get("library", LIBRARY_FILE))
        try:
            self._lib = ctypes.CDLL(str(path.resolve()))
        except OSError as e:
            raise LibraryError(f"cannot load {path}: {e}") from e
        self.kernels = {k["symbol"]: self._load_kernel(k) for k in self.manifest["kernels"]}
        #: the quantized layers' kernels (typed buffers, bound by ``int8_step``); a quantized
        #: addition's is a generated operator (its entry has ``generated``, not ``workload``)
        self.int8_kernels: dict[str, LoadedKernel | LoadedGenerated] = {
            k["symbol"]: self._load_generated(k, "generated") if "generated" in k
            else self._load_kernel(k)
            for k in self.manifest.get("int8_kernels", [])}
        #: None for a library built without generated kernels (or before they existed): the
        #: runner then computes those nodes in numpy
        self.generated: dict[str, LoadedGenerated] | None = None
        if "generated" in self.manifest:
            self.generated = {g["symbol"]: self._load_generated(g)
                              for g in self.manifest["generated"]}

    @property
    def threads(self) -> int:
        return int(self.manifest.get("threads", 1))

    def _load_kernel(self, entry: dict[str, Any]) -> LoadedKernel:
        symbol = entry["symbol"]
        try:
            template = template_by_name(entry["template"])
            workload = parse_workload(entry["workload"])
            if template.version != entry["template_version"]:
                raise LibraryError(
                    f"kernel {symbol} was built with {template.name} v{entry['template_version']}"
                    f", this installation has v{template.version}; rebuild the library")
            config = template.space(workload).from_json(entry["config"])
        except ScheduleError as e:
            raise LibraryError(f"kernel {symbol} in the manifest is invalid: {e}") from e
        return LoadedKernel(symbol, workload, template, config, entry["config_source"],
                            entry["args"], self._function(symbol, entry["args"]))


    def _load_generated(self, entry: dict[str, Any], field: str = "op") -> LoadedGenerated:
        symbol = entry["symbol"]
        try:
            op = op_from_json(entry[field])
        except ScheduleError as e:
            raise LibraryError(f"generated kernel {symbol} in the manifest is invalid ({e}): "
                               "rebuild the library") from e
        return LoadedGenerated(symbol, op, entry["args"], self._function(symbol, entry["args"]))

    def _function(self, symbol: str, args: list[dict[str, Any]]) -> Any:
        try:
            function = getattr(self._lib, symbol)
        except AttributeError:
            raise LibraryError(f"{LIBRARY_FILE} has no symbol {symbol}") from None
        function.argtypes = [ctypes.c_void_p] * len(args) + [ctypes.c_int64]
        function.restype = None
        return function


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST_FILE
    try:
        manifest: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise LibraryError(f"{directory} is not a kernel library: {MANIFEST_FILE} is missing "
                           "(build one with `tuner build MODEL.onnx -o DIR`)") from None
    except (OSError, ValueError) as e:
        raise LibraryError(f"cannot read {path}: {e}") from e
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version != MANIFEST_VERSION:
        raise LibraryError(f"{path} has format version {version!r}; this tuner reads "
                           f"{MANIFEST_VERSION}: rebuild the library")
    return manifest


def check_host(manifest: dict[str, Any]) -> None:
    """Refuse a library compiled for instructions this CPU does not have."""
    from schedule_templates.codegen.llvm_jit import host_features

    built = set(str(manifest.get("host", {}).get("features", "")).split(","))
    here = set(host_features().split(","))
    missing = [f for f in _CRITICAL_FEATURES if f"+{f}" in built and f"+{f}" not in here]
    if missing:
        cpu = manifest.get("host", {}).get("cpu", "another CPU")
        raise LibraryError(f"the library was compiled for {cpu} and uses {', '.join(missing)}, "
                           "which this CPU lacks; rebuild it on this machine")
