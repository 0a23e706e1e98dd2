"""One layer bound to its compiled kernel: packed weights, fixed output and scratch buffers.

Arguments follow the manifest's order. An argument named like a workload input that is not
constant is an activation, read from the tensor the layer's ``inputs`` names at every call (a
pointer, no copy, when it is already a dense fp32 array, as kernel outputs are). Every other
input argument is built once here from the template's ``pack`` of the constants.

Workspaces (padded copies, Winograd's transformed tiles) come from one ``Scratch`` arena that
every layer of a model shares: layers run one after another, each kernel writes its workspace
before reading it, so the model touches one warm block of scratch memory instead of a cold one
per layer (ResNet-18's Winograd layers alone would need 36 MB).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from schedule_templates.errors import ScheduleError
from schedule_templates.runtime import aligned_empty
from tuner_service.deploy.errors import LibraryError
from tuner_service.deploy.loader import LoadedKernel
from tuner_service.frontend.fusion import Layer

_ALIGN = 16  # floats: every workspace starts on a 64-byte boundary


def _aligned(elements: int) -> int:
    return -(-elements // _ALIGN) * _ALIGN


def workspace_elements(kernel: LoadedKernel) -> int:
    """Elements of scratch one call of ``kernel`` needs, alignment included."""
    return sum(_aligned(int(a["elements"])) for a in kernel.args if a["role"] == "workspace")


class Scratch:
    """One zeroed, aligned arena whose start every kernel's workspaces are carved from."""

    def __init__(self, elements: int) -> None:
        self.buffer = aligned_empty(max(_ALIGN, elements), zero=True)

    def carve(self, kernel: LoadedKernel) -> list[np.ndarray]:
        views, offset = [], 0
        for arg in kernel.args:
            if arg["role"] == "workspace":
                size = int(arg["elements"])
                views.append(self.buffer[offset:offset + size])
                offset += _aligned(size)
        if offset > self.buffer.size:
            raise LibraryError(f"kernel {kernel.symbol} needs {offset} scratch elements, the "
                               f"arena has {self.buffer.size}")
        return views


class KernelStep:
    def __init__(self, kernel: LoadedKernel, layer: Layer, pointers: list[int],
                 dynamic: list[tuple[int, str, np.ndarray | None, int]], output: np.ndarray,
                 keep: list[np.ndarray], threads: int) -> None:
        self.kernel = kernel
        self.layer = layer.nodes[0]
        self.inputs = [tensor for _, tensor, _, _ in dynamic]
        self.outputs = [layer.output]
        self._function = kernel.function
        self._pointers = pointers
        self._dynamic = dynamic
        self._output = output
        self._keep = keep  # owns the memory behind the fixed pointers
        self._threads = ctypes.c_int64(threads)

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        pointers = self._pointers
        for position, tensor, staging, size in self._dynamic:
            value = env[tensor]
            if staging is not None:  # the kernel over-reads: copy into a buffer with slack
                staging[:size] = value.reshape(-1)
                continue
            if value.dtype != np.float32 or not value.flags.c_contiguous:
                value = np.ascontiguousarray(value, dtype=np.float32)
                env[tensor] = value  # keep it alive for the call (and reuse it later)
            if value.size != size:
                raise LibraryError(f"layer {self.layer}: input {tensor} has {value.size} "
                                   f"elements, the kernel expects {size}")
            pointers[position] = value.ctypes.data
        self._function(*pointers, self._threads)
        env[self.outputs[0]] = self._output


def bind_kernel(kernel: LoadedKernel, layer: Layer, graph_constants: dict[str, np.ndarray],
                onnx_shape: tuple[int, ...] | None, threads: int,
                scratch: Scratch | None = None) -> KernelStep:
    workload = kernel.workload
    shapes = workload.input_shapes()
    constant, runtime = _split_inputs(layer, shapes, graph_constants)
    placeholders = {n: np.broadcast_to(np.float32(0), shapes[n]) for n in runtime}
    try:
        packed = kernel.template.pack(workload, kernel.config, {**placeholders, **constant})
    except (ScheduleError, ValueError) as e:
        raise LibraryError(f"layer {layer.nodes[0]}: packing its constants failed: {e}") from e
    pointers: list[int] = []
    dynamic: list[tuple[int, str, np.ndarray | None, int]] = []
    keep: list[np.ndarray] = []
    output: np.ndarray | None = None
    workspaces = iter((scratch or Scratch(workspace_elements(kernel))).carve(kernel))
    for position, arg in enumerate(kernel.args):
        size = int(np.prod(arg["shape"], dtype=np.int64))
        activation = arg["role"] == "input" and arg["name"] in runtime
        if activation and arg["elements"] == size:  # bound to the tensor at every call
            pointers.append(0)
            dynamic.append((position, layer.inputs[arg["name"]], None, size))
            continue
        if arg["role"] == "workspace":
            view = next(workspaces)
            keep.append(view)
            pointers.append(view.ctypes.data)
            continue
        buffer = aligned_empty(int(arg["elements"]), zero=True)
        keep.append(buffer)
        pointers.append(buffer.ctypes.data)
        if arg["role"] == "output":
            output = buffer[:size].reshape(_output_shape(onnx_shape, workload.output_shape()))
        elif activation:  # the kernel over-reads: stage a copy in a buffer with slack
            dynamic.append((position, layer.inputs[arg["name"]], buffer, size))
        elif arg["role"] == "input":
            _fill(buffer, packed, arg, size, layer)
    assert output is not None, "every kernel has an output argument"
    return KernelStep(kernel, layer, pointers, dynamic, output, keep, threads)


def _split_inputs(layer: Layer, shapes: dict[str, tuple[int, ...]],
                  graph_constants: dict[str, np.ndarray]
                  ) -> tuple[dict[str, np.ndarray], list[str]]:
    constant: dict[str, np.ndarray] = {}
    runtime: list[str] = []
    for name, shape in shapes.items():
        if name in layer.constants:
            value = layer.constants[name]
        elif layer.inputs.get(name) in graph_constants:
            value = graph_constants[layer.inputs[name]]
        elif name in layer.inputs:
            runtime.append(name)
            continue
        else:
            raise LibraryError(f"layer {layer.nodes[0]}: nothing feeds kernel input {name}")
        value = np.asarray(value, dtype=np.float32)
        if value.size != int(np.prod(shape, dtype=np.int64)):
            raise LibraryError(f"layer {layer.nodes[0]}: constant {name} has shape "
                               f"{value.shape}, the workload expects {shape}")
        constant[name] = value.reshape(shape)
    return constant, runtime


def _fill(buffer: np.ndarray, packed: dict[str, np.ndarray], arg: dict[str, Any], size: int,
          layer: Layer) -> None:
    value = packed.get(arg["name"])
    if value is None or value.size != size:
        got = "nothing" if value is None else f"{value.size} elements"
        raise LibraryError(f"layer {layer.nodes[0]}: kernel argument {arg['name']} needs "
                           f"{size} elements, packing gave {got}")
    buffer[:size] = np.asarray(value, dtype=np.float32).reshape(-1)


def _output_shape(onnx_shape: tuple[int, ...] | None, fallback: tuple[int, ...]
                  ) -> tuple[int, ...]:
    if onnx_shape is not None and int(np.prod(onnx_shape)) == int(np.prod(fallback)):
        return onnx_shape
    return fallback
