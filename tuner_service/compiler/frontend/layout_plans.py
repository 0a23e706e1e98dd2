"""Which library plans a set of tuning tasks covers, so that an end-to-end estimate counts each
layer once.

A job tuned for ``--layout auto`` holds both layouts' tasks: each plain conv task and, after
it, its blocked twin (``frontend.extract``: the same key with ``_nchwc`` on the operator, a
``block`` parameter and, for an RGB stem, ``in_layout=nchw``; an int8 convolution's twin has
channels-last layouts instead, ``in_layout``/``out_layout``/``residual_layout=nhwc``). A
library runs one of the two plans, never both, so an estimate is the faster plan's weighted
sum, not the sum over every task.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_indices(keys: Sequence[str]) -> list[list[int]]:
    """Positions in ``keys`` of each plan: one plan (every task) where no task has a blocked
    twin among them, else the plain plan and the blocked one (the blocked tasks and the plain
    ones without a twin)."""
    twins = {plain_key(key) for key in keys if is_blocked(key)}
    if not any(key in twins for key in keys if not is_blocked(key)):
        return [list(range(len(keys)))]
    plain = [i for i, key in enumerate(keys) if not is_blocked(key)]
    blocked = [i for i, key in enumerate(keys) if is_blocked(key) or key not in twins]
    return [plain, blocked]


def is_blocked(key: str) -> bool:
    """Whether ``key`` is a task of the blocked plan only: a blocked operator, or an int8
    convolution on channels-last activations (``quantized_layout``)."""
    op, _, body = key.partition(":")
    return op.endswith("_nchwc") or (op == "conv2d_int8" and "layout=nhwc" in body)


#: parameters a blocked twin adds to its plain task's key (``layout.blocked_workload``, and an
#: int8 convolution's ``quantized_layout``)
_BLOCKED_PARAMS = ("block=", "in_layout=", "out_layout=", "residual_layout=")


def plain_key(key: str) -> str:
    """The plain task's key of a blocked twin's (the key itself for a plain one)."""
    op, _, body = key.partition(":")
    params = [p for p in body.split(",") if not p.startswith(_BLOCKED_PARAMS)]
    return f"{op.removesuffix('_nchwc')}:{','.join(params)}"
