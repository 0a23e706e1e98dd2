"""One layer bound to its compiled kernel: packed weights, fixed output and scratch buffers.

Arguments follow the manifest's order. An argument named like a workload input that is not
constant is an activation, read from the tensor the layer's ``inputs`` names at every call (a
pointer, no copy, when it is already a dense fp32 array, as kernel outputs are). Every other
input argument is built once here from the template's ``pack`` of the constants.

Workspaces (padded copies, Winograd's transformed tiles) come from one ``Scratch`` arena that
every layer of a model shares: layers run one after another, each kernel writes its workspace
before reading it, so the model touches one warm block of scratch memory instead of a cold one
per layer (ResNet-18's Winograd layers alone would need 36 MB).

Each step describes its pointers (``BoundArg``: fixed weights, activation, staged activation,
output, workspace), which is what the native executor (``native``) turns into a C program; the
output starts in a buffer of its own and moves into the planned activation arena with
``place_output`` once the whole model's buffers are planned.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
from typing import TYPE_CHECKING, Any

import numpy as np

from schedule_templates.errors import ScheduleError
from schedule_templates.runtime import aligned_empty
from tuner_service.compiler.deploy.errors import LibraryError
from tuner_service.compiler.frontend.fusion import Layer

if TYPE_CHECKING:  # loader imports library, which imports int8_step, which imports this
    from tuner_service.compiler.deploy.loader import LoadedKernel

_ALIGN = 16  # floats: every workspace starts on a 64-byte boundary
FP32: np.dtype[Any] = np.dtype(np.float32)


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


class ArgKind(enum.Enum):
    """What one kernel argument points at (the native program resolves each kind its way)."""

    FIXED = "fixed"            # packed weights, built once here
    ACTIVATION = "activation"  # a tensor read at every call, by pointer
    STAGED = "staged"          # a tensor copied into a buffer with slack (the kernel over-reads)
    OUTPUT = "output"
    WORKSPACE = "workspace"    # a view of the shared scratch arena


@dataclasses.dataclass(frozen=True)
class BoundArg:
    """One argument of a bound kernel: ``buffer`` is the memory behind a fixed pointer (None for
    an activation), ``tensor`` the graph tensor read or written, ``size`` its dense elements of
    ``dtype`` (fp32 but for the int8 steps' bytes)."""

    kind: ArgKind
    buffer: np.ndarray | None
    tensor: str | None
    size: int
    dtype: np.dtype[Any] = FP32

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class StepLayer:
    """What ``KernelStep`` reads of a layer, for steps that stand for one ONNX node (the int8
    layers and their glue): its name and its output."""

    nodes: tuple[str, ...]
    output: str


class KernelStep:
    """One call of a compiled kernel: ``__call__(env)`` binds the activations by pointer, runs
    it, and puts its output buffer in ``env``. ``args`` describe every pointer (the native
    executor builds its program from them, unless ``in_program`` is false: a step that does
    more than its kernel call stays a Python step)."""

    in_program = True

    def __init__(self, kernel: LoadedKernel, layer: Layer | StepLayer, args: list[BoundArg],
                 output_shape: tuple[int, ...], threads: int) -> None:
        self.kernel = kernel
        self.layer = layer.nodes[0]
        self.args = args
        self.threads = threads
        self.inputs = [a.tensor for a in args if a.kind in _READS and a.tensor is not None]
        self.outputs = [layer.output]
        self._function = kernel.function
        self._pointers = [0 if a.buffer is None else a.buffer.ctypes.data for a in args]
        self._dynamic = [(i, a) for i, a in enumerate(args) if a.kind in _READS]
        #: staged positions read in place: (the planned tensor's address, its slack past it)
        self._in_place: dict[int, tuple[int, np.ndarray]] = {}
        (self._out_position,) = [i for i, a in enumerate(args) if a.kind is ArgKind.OUTPUT]
        self._output_shape = output_shape
        self._output = self._output_view()
        self._threads = ctypes.c_int64(threads)

    @property
    def output(self) -> np.ndarray:
        """The output buffer in the output tensor's shape (what a run puts in ``env``)."""
        return self._output

    @property
    def output_elements(self) -> int:
        """Elements of the output buffer, slack the kernel may write included."""
        return int(self._output_buffer.size)

    @property
    def output_dtype(self) -> np.dtype[Any]:
        return self._output_buffer.dtype

    @property
    def _output_buffer(self) -> np.ndarray:
        buffer = self.args[self._out_position].buffer
        assert buffer is not None
        return buffer

    def place_output(self, buffer: np.ndarray) -> None:
        """Write the output into ``buffer`` (a planned slice of the activation arena) from now
        on; it must hold ``output_elements`` of ``output_dtype``."""
        if buffer.dtype != self.output_dtype or buffer.size != self.output_elements:
            raise LibraryError(f"layer {self.layer}: an output buffer of {buffer.size} "
                               f"{buffer.dtype} for a kernel that writes "
                               f"{self.output_elements} {self.output_dtype}")
        old = self.args[self._out_position]
        self.args[self._out_position] = dataclasses.replace(old, buffer=buffer)
        self._pointers[self._out_position] = buffer.ctypes.data
        self._output = self._output_view()

    def read_in_place(self, position: int, tensor: np.ndarray, slack: np.ndarray) -> None:
        """Read staged argument ``position`` from ``tensor`` (a planned buffer followed by
        ``slack``, what the kernel over-reads) instead of copying it: ``slack`` is zeroed before
        each call, as the copy's was. The step path mirrors the native program this way."""
        self._in_place[position] = (int(tensor.ctypes.data), slack)

    def _output_view(self) -> np.ndarray:
        arg = self.args[self._out_position]
        assert arg.buffer is not None
        return arg.buffer[:arg.size].reshape(self._output_shape)

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        pointers = self._pointers
        for position, arg in self._dynamic:
            value = env[str(arg.tensor)]
            if arg.buffer is not None:  # the kernel over-reads: copy into a buffer with slack
                address, slack = self._in_place.get(position, (-1, arg.buffer))
                if value.ctypes.data != address:
                    arg.buffer[:arg.size] = value.reshape(-1)
                    continue
                slack.fill(0)  # the planned tensor itself, its slack cleared
            if value.dtype != arg.dtype or not value.flags.c_contiguous:
                value = np.ascontiguousarray(value, dtype=arg.dtype)
                env[str(arg.tensor)] = value  # keep it alive for the call (and reuse it later)
            if value.size != arg.size:
                raise LibraryError(f"layer {self.layer}: input {arg.tensor} has {value.size} "
                                   f"elements, the kernel expects {arg.size}")
            pointers[position] = value.ctypes.data
        self._function(*pointers, self._threads)
        env[self.outputs[0]] = self._output


_READS = (ArgKind.ACTIVATION, ArgKind.STAGED)


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
    args: list[BoundArg] = []
    workspaces = iter((scratch or Scratch(workspace_elements(kernel))).carve(kernel))
    for arg in kernel.args:
        size = int(np.prod(arg["shape"], dtype=np.int64))
        activation = arg["role"] == "input" and arg["name"] in runtime
        tensor = layer.inputs[arg["name"]] if activation else None
        if activation and arg["elements"] == size:  # bound to the tensor at every call
            args.append(BoundArg(ArgKind.ACTIVATION, None, tensor, size))
        elif arg["role"] == "workspace":
            args.append(BoundArg(ArgKind.WORKSPACE, next(workspaces), None, size))
        else:
            buffer = aligned_empty(int(arg["elements"]), zero=True)
            if arg["role"] == "output":
                args.append(BoundArg(ArgKind.OUTPUT, buffer, layer.output, size))
            elif activation:  # the kernel over-reads: stage a copy in a buffer with slack
                args.append(BoundArg(ArgKind.STAGED, buffer, tensor, size))
            else:
                _fill(buffer, packed, arg, size, layer)
                args.append(BoundArg(ArgKind.FIXED, buffer, None, size))
    return KernelStep(kernel, layer, args,
                      _output_shape(onnx_shape, workload.output_shape()), threads)


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
    value = np.asarray(value)
    if value.dtype.kind in "iu" and value.dtype.itemsize == 4:
        # packed words (bf16 pairs): their bits are the argument, not their integer values
        buffer.view(value.dtype)[:size] = value.reshape(-1)
        return
    buffer[:size] = value.astype(np.float32, copy=False).reshape(-1)


def _output_shape(onnx_shape: tuple[int, ...] | None, fallback: tuple[int, ...]
                  ) -> tuple[int, ...]:
    if onnx_shape is not None and int(np.prod(onnx_shape)) == int(np.prod(fallback)):
        return onnx_shape
    return fallback
