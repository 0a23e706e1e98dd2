"""The output stage of a fused epilogue, shared by the templates that support one.

A template keeps its loop nest and its knobs; only the value it stores changes, from ``acc`` to
``act(acc * scale[k] + bias[k] + residual[...])`` where ``act`` is a clip or a smooth activation
built from the IR's math calls (which vectorize, so a fused sigmoid costs a few FMAs per
element rather than a pass over memory). The extra inputs become kernel arguments named like
the workload's inputs, placed after the operator's own inputs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from schedule_templates.errors import InvalidConfigError
from schedule_templates.ir.nodes import Buffer, Expr, ExprLike, call, fmax, fmin
from schedule_templates.workloads import Workload
from schedule_templates.workloads.epilogue import EPILOGUE_INPUTS, Epilogue


@dataclasses.dataclass(frozen=True)
class EpilogueStage:
    """The epilogue of one workload and its argument buffers (absent parts are None)."""

    epilogue: Epilogue
    scale: Buffer | None
    bias: Buffer | None
    residual: Buffer | None

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        """Kernel arguments in call order: scale, bias, residual (those present)."""
        return tuple(b for b in (self.scale, self.bias, self.residual) if b is not None)

    def apply(self, value: Expr, channel: ExprLike, index: tuple[ExprLike, ...]) -> Expr:
        """The stored value for accumulator ``value`` at output ``index`` of ``channel``."""
        return self.activation(self.apply_linear(value, channel, index))

    @property
    def deferred(self) -> bool:
        """Whether the activation is a math call (sigmoid, SiLU, tanh, GELU): tens of vector
        instructions per element, which a template may apply in a pass of its own over a
        stored tile (``apply_linear`` then ``activation``) rather than on every accumulator
        of a register tile at once, where they spill."""
        act = self.epilogue.activation
        return act is not None and act.name in _CALLS

    def activation(self, value: Expr) -> Expr:
        """The smooth activation alone (identity without one)."""
        act = self.epilogue.activation
        return value if act is None else _ACTIVATION_IR[act.name](value, act.params)

    def apply_linear(self, value: Expr, channel: ExprLike, index: tuple[ExprLike, ...]
                     ) -> Expr:
        """Everything before the smooth activation: scale, bias, residual, clip."""
        if self.scale is not None:
            value = value * self.scale[channel]
        if self.bias is not None:
            value = value + self.bias[channel]  # with a scale this is one FMA
        if self.residual is not None:
            value = value + self.residual[index]
        if self.epilogue.clip is not None:
            low, high = self.epilogue.clip
            if low != -math.inf:
                value = fmax(value, low)
            if high != math.inf:
                value = fmin(value, high)
        return value


def _unit_clip(x: Expr) -> Expr:
    return fmin(fmax(x, 0.0), 1.0)


#: the IR of each smooth activation (the numpy reference is ``Activation.apply``)
_ACTIVATION_IR: dict[str, Callable[[Expr, tuple[float, ...]], Expr]] = {
    "sigmoid": lambda x, _: call("sigmoid", x),
    "silu": lambda x, _: x * call("sigmoid", x),
    "hardswish": lambda x, _: x * _unit_clip(x * (1.0 / 6.0) + 0.5),
    "hardsigmoid": lambda x, p: _unit_clip(x * p[0] + p[1]),
    "tanh": lambda x, _: call("tanh", x),
    "gelu": lambda x, _: x * 0.5 * (call("erf", x * math.sqrt(0.5)) + 1.0),
}


#: activations built on a math call (``deferred``)
_CALLS = frozenset({"sigmoid", "silu", "tanh", "gelu"})


def epilogue_stage(workload: Workload) -> EpilogueStage:
    """Buffers for the workload's epilogue inputs, shaped as ``input_shapes`` says."""
    shapes = workload.input_shapes()
    bufs = {name: Buffer(name, shapes[name]) if name in shapes else None
            for name in EPILOGUE_INPUTS}
    return EpilogueStage(workload.epilogue_spec, bufs["scale"], bufs["bias"], bufs["residual"])


def epilogue_arguments(workload: Workload, inputs: Mapping[str, np.ndarray]
                       ) -> dict[str, np.ndarray]:
    """The epilogue inputs a ``pack`` passes through unchanged (already in kernel layout)."""
    wanted = workload.epilogue_spec.input_shapes(workload.output_shape())
    missing = [name for name in wanted if name not in inputs]
    if missing:
        raise InvalidConfigError(f"no data for epilogue input(s) {', '.join(missing)}")
    return {name: inputs[name] for name in wanted}
