"""How a quantized model's int8 layers sum their u8 x s8 products: ``exact`` or ``sat16``.

``exact`` accumulates every product in int32 (VNNI's ``vpdpbusd``, or ``vpmaddwd`` on 16-bit
values). ``sat16`` sums each pair of byte products on 16 bits that saturate before the int32
accumulation (``vpmaddubsw``, ``workloads.lowp``): what onnxruntime's u8 x s8 kernels (and
oneDNN's) compute on CPUs without VNNI, where they differ from the exact sums wherever a pair
of large weights of one sign meets large activations (about 1% of the pairs of 8-bit weights
in the zoo's ResNet-50 and BERT-base can). It reproduces those peers' outputs there and runs
on bytes, about 1.4x the multiply rate of widening them to 16 bits on an AVX2 core.

``auto`` (the default of ``tuner build`` and ``tuner extract``) takes the arithmetic of
onnxruntime on the machine that builds: ``sat16`` where it has no AVX-512 VNNI, ``exact``
where it has. Weights within +-64 (``weights=narrow``, a ``reduce_range`` model) never
saturate and keep their exact key; depthwise layers, which multiply 16-bit values, and
grouped layers with an odd channel count per group too (an RGB stem, one group, takes flat
words: ``x86_int8_flat``). A library records ``sat16`` in its manifest, so that it runs with
the same keys on any machine.
"""

from __future__ import annotations

import dataclasses

import onnx

from schedule_templates.errors import InvalidWorkloadError
from schedule_templates.templates import x86_dot_gemm
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.compiler.frontend.errors import ModelError
from tuner_service.compiler.frontend.quantized_ops import INT8_DOMAIN

INT8_ARITHMETICS = ("auto", "exact", "sat16")
_PAIRED_OPS = ("dense_int8", "conv2d_int8")


def resolve_int8(arithmetic: str) -> str:
    """``exact`` or ``sat16`` for a choice of ``INT8_ARITHMETICS`` (``auto``: this host's
    onnxruntime arithmetic). ModelError for another value."""
    if arithmetic not in INT8_ARITHMETICS:
        raise ModelError(f"unknown int8 arithmetic {arithmetic!r}; expected one of "
                         f"{', '.join(INT8_ARITHMETICS)}")
    if arithmetic != "auto":
        return arithmetic
    return "exact" if x86_dot_gemm.int8_instruction() is x86_dot_gemm.VNNI else "sat16"


def at_int8(workload: Workload, arithmetic: str) -> Workload:
    """``workload`` summed in ``arithmetic`` (itself where the choice changes nothing)."""
    if arithmetic != "sat16" or workload.op not in _PAIRED_OPS \
            or getattr(workload, "weights", "") != "full":
        return workload
    try:
        return dataclasses.replace(workload, weights="sat16")  # type: ignore[call-arg]
    except InvalidWorkloadError:  # depthwise, or odd groups: no pairs onnxruntime's match
        return workload


def apply_int8_arithmetic(proto: onnx.ModelProto, arithmetic: str) -> int:
    """Rewrite the keys of ``proto``'s int8 layers (loaded, ``quantized``) to ``arithmetic``
    (``exact`` or ``sat16``, already resolved) in place; returns how many changed."""
    if arithmetic == "exact":
        return 0
    changed = 0
    for node in proto.graph.node:
        if node.domain != INT8_DOMAIN:
            continue
        for attr in node.attribute:
            if attr.name != "workload":
                continue
            try:
                workload = parse_workload(attr.s.decode())
            except (InvalidWorkloadError, UnicodeDecodeError):
                continue  # the planner reports it where it maps the node
            summed = at_int8(workload, arithmetic)
            if summed is not workload:
                attr.s = summed.key.encode()
                changed += 1
    return changed
