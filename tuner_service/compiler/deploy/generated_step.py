"""A generated layer bound to its kernel: the same ``KernelStep`` as a tuned layer.

A generated operator has no template and no packing: its constant inputs (a batch norm's folded
scale and shift, a bias the model adds, a layer norm's gamma) are copied once into aligned
buffers behind fixed pointers, activations are read from the run's tensors by pointer (a
reshape binds, as for tuned layers), and the output is a fixed aligned buffer. Because the step
*is* a ``KernelStep`` (same argument records), every executor that runs kernel steps, the native
one included, runs generated layers the same way.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from schedule_templates.ops.base import GeneratedOp
from schedule_templates.runtime import aligned_empty
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.deploy.kernel_step import (
    ArgKind,
    BoundArg,
    KernelStep,
    Scratch,
    workspace_elements,
)
from tuner_service.compiler.deploy.loader import LoadedGenerated, LoadedKernel
from tuner_service.compiler.frontend.fusion import Layer
from tuner_service.compiler.frontend.generated import GeneratedLayer


class GeneratedStep(KernelStep):
    """One call of a generated operator's kernel. ``op`` is the operator; ``kernel`` is the
    loaded generated kernel (it has ``symbol``, ``args`` and ``function`` like a tuned one,
    but no workload)."""

    def __init__(self, kernel: LoadedGenerated, layer: GeneratedLayer, args: list[BoundArg],
                 output_shape: tuple[int, ...], threads: int) -> None:
        # KernelStep reads only the function of the kernel and the first node and the output of
        # the layer, which both kinds have
        super().__init__(cast(LoadedKernel, kernel), cast(Layer, layer), args, output_shape,
                         threads)
        self.generated = kernel
        self.op: GeneratedOp = kernel.op


def generated_workspace(kernel: LoadedGenerated) -> int:
    """Elements of the shared scratch arena one call of ``kernel`` needs (alignment included)."""
    return workspace_elements(cast(LoadedKernel, kernel))


def bind_generated(kernel: LoadedGenerated, layer: GeneratedLayer,
                   graph_constants: dict[str, np.ndarray], onnx_shape: tuple[int, ...] | None,
                   threads: int, scratch: Scratch) -> GeneratedStep:
    args: list[BoundArg] = []
    workspaces = iter(scratch.carve(cast(LoadedKernel, kernel)))
    for arg in kernel.args:
        size = math.prod(int(d) for d in arg["shape"])
        elements = int(arg["elements"])
        if arg["role"] == "workspace":
            args.append(BoundArg(ArgKind.WORKSPACE, next(workspaces), None, size))
        elif arg["role"] == "output":
            buffer = aligned_empty(elements, zero=True)
            args.append(BoundArg(ArgKind.OUTPUT, buffer, layer.output, size))
        else:
            args.append(_input(arg["name"], size, elements, layer, graph_constants))
    shape = kernel.op.output_shape()
    if onnx_shape is not None and math.prod(onnx_shape) == math.prod(shape):
        shape = onnx_shape
    return GeneratedStep(kernel, layer, args, shape, threads)


def _input(name: str, size: int, elements: int, layer: GeneratedLayer,
           graph_constants: dict[str, np.ndarray]) -> BoundArg:
    """A constant copied once behind a fixed pointer, else the activation the layer names."""
    tensor = layer.inputs.get(name)
    value = layer.constants.get(name)
    if value is None and tensor is not None:
        value = graph_constants.get(tensor)
    if value is not None:
        if value.size != size:
            raise LibraryError(f"layer {layer.nodes[0]}: constant input {name} has "
                               f"{value.size} elements, the kernel expects {size}")
        buffer = aligned_empty(elements, zero=True)
        buffer[:size] = np.asarray(value, dtype=np.float32).reshape(-1)
        return BoundArg(ArgKind.FIXED, buffer, None, size)
    if tensor is None:
        raise LibraryError(f"layer {layer.nodes[0]}: nothing feeds kernel input {name}")
    if elements == size:
        return BoundArg(ArgKind.ACTIVATION, None, tensor, size)
    # the kernel over-reads: stage a copy in a buffer with slack
    return BoundArg(ArgKind.STAGED, aligned_empty(elements, zero=True), tensor, size)
