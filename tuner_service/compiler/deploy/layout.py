"""The activation layout of a built library: which plan ``tuner build --layout`` chose, written
in the manifest, and the same plan re-applied by the runner.

``nchw`` keeps every activation plain (the plan as it was). ``nchwc`` runs conv-family layers
and the elementwise chains between them on blocked activations (``frontend.layout``) with the
host's vector width as the block (8 floats on AVX2, 16 on AVX-512), fixed for the whole library
so conv layers never disagree. The manifest's ``layout`` entry (``{"mode": "nchwc", "block":
8}``) is what a runner re-plans with; a manifest without it is ``nchw``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

import onnx

from schedule_templates.codegen.llvm_jit import host_vector_lanes
from schedule_templates.templates import x86_dot_gemm
from tuner_service.compiler.deploy.errors import BuildError, LibraryError
from tuner_service.compiler.frontend.fusion import Layer
from tuner_service.compiler.frontend.generated_context import GeneratedLayer
from tuner_service.compiler.frontend.layout import LAYOUTS, plan_layout
from tuner_service.compiler.frontend.quantized_layout import plan_channels_last
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN

logger = logging.getLogger(__name__)

Plan = tuple[list[Layer], list[GeneratedLayer]]


def host_block() -> int:
    """The channel block of this host: its vector width in floats."""
    return host_vector_lanes()


def check_layout(layout: str, generated: bool) -> None:
    if layout not in LAYOUTS:
        raise BuildError(f"unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if layout == "nchwc" and not generated:
        raise BuildError(f"--layout {layout} needs the generated operators (its transforms "
                         "are generated kernels); build without --no-generated")


def layout_entry(mode: str, block: int | None = None, plain: Collection[str] = (),
                 int8: bool = False) -> dict[str, Any]:
    """The manifest's ``layout`` entry for ``mode`` (``nchw`` or ``nchwc``); ``plain``: the
    conv layers (output tensors) a blocked plan keeps plain (``layout_mixed``); ``int8``: the
    plan keeps int8 activations channels-last between int8 convolutions
    (``frontend.quantized_layout``; ``"int8": "nhwc"``)."""
    if mode == "nchw":
        return {"mode": "nchw"}
    entry: dict[str, Any] = {"mode": mode, "block": block or host_block()}
    if plain:
        entry["plain"] = sorted(plain)
    if int8:
        entry["int8"] = "nhwc"
    return entry


def int8_channels_last(proto: onnx.ModelProto) -> bool:
    """Whether a blocked plan of ``proto`` built here keeps int8 activations channels-last:
    the model has int8 layers and this host multiplies them with VNNI (its pixel-row kernels
    store channels-last registers whole; on AMX tiles a pixel's channels are a tile row,
    ``x86_amx_channels_last``)."""
    return (x86_dot_gemm.int8_instruction() is x86_dot_gemm.VNNI
            and any(node.domain == INT8_DOMAIN for node in proto.graph.node))


def apply_layout(proto: onnx.ModelProto, layers: Sequence[Layer],
                 generated: Sequence[GeneratedLayer], entry: dict[str, Any] | None) -> Plan:
    """The plan in the layout ``entry`` names (None or ``nchw``: unchanged)."""
    mode = (entry or {}).get("mode", "nchw")
    if mode == "nchw":
        return list(layers), list(generated)
    if mode != "nchwc":
        raise LibraryError(f"the manifest names an unknown layout {mode!r}; rebuild it with "
                           "tuner build")
    block = int((entry or {}).get("block", 0))
    plain = (entry or {}).get("plain", [])
    if not isinstance(plain, list) or not all(isinstance(name, str) for name in plain):
        raise LibraryError("the manifest's layout names its plain layers wrongly; rebuild it "
                           "with tuner build")
    int8 = entry.get("int8", "nchw") if entry else "nchw"
    if int8 not in ("nchw", "nhwc"):
        raise LibraryError(f"the manifest names an unknown int8 layout {int8!r}; rebuild it "
                           "with tuner build")
    if int8 == "nhwc":
        logger.info("int8 layout nhwc: %d tensors channels-last", plan_channels_last(proto))
    plan = plan_layout(proto, layers, generated, block, plain)
    logger.info("layout nchw%dc: %d tensors blocked, %d transforms, %d conv layers plain",
                block, len(plan.blocked), plan.transforms, len(plain))
    return plan.layers, plan.generated
