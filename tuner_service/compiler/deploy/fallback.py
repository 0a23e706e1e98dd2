"""Operators the runner has no numpy implementation for run through onnx's reference evaluator.

A model is not refused for one missing operator: that node becomes a one-node model evaluated by
``onnx.reference.ReferenceEvaluator`` (a well-kept, spec-following implementation, slow but
right). Every such operator is named in a warning at load time, and ``FallbackStep`` keeps the
seconds it spends so that ``tuner run`` can say what share of the run time went to it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import onnx

from tuner_service.compiler.deploy.errors import UnsupportedOperatorError
from tuner_service.compiler.deploy.node import NodeInfo

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class FallbackStats:
    """Time one fallback step has spent, over every call since load."""

    calls: int = 0
    seconds: float = 0.0


class FallbackStep:
    """One ONNX node run by onnx's reference evaluator (a step of ``ModelRunner``)."""

    def __init__(self, node: onnx.NodeProto, info: NodeInfo,
                 opsets: dict[str, int], reason: str) -> None:
        from onnx.reference import ReferenceEvaluator

        self.info, self.reason = info, reason
        # a subgraph (If, Loop, Scan) may read tensors of the enclosing graph: feed them too
        outer = [n for n in outer_names(node) if n not in node.input]
        self.inputs, self.outputs = [*node.input, *outer], list(node.output)
        try:
            self._evaluator = ReferenceEvaluator(node, opsets=opsets)
        except (NotImplementedError, RuntimeError, TypeError, ValueError, KeyError) as e:
            where = f" from domain {node.domain!r}" if node.domain not in ("", "ai.onnx") else ""
            raise UnsupportedOperatorError(
                node.op_type, info.name,
                f"no numpy implementation{where}, and onnx's reference evaluator cannot run it "
                f"either: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
        self._feed_names = [n for n in self.inputs if n]
        self.stats = FallbackStats()

    def __call__(self, env: dict[str, np.ndarray]) -> None:
        start = time.perf_counter()
        feeds = {name: env[name] for name in self._feed_names}
        try:
            results = self._evaluator.run(None, feeds)
        except Exception as e:  # the evaluator raises anything on inputs it does not take
            raise UnsupportedOperatorError(
                self.info.op_type, self.info.name,
                f"onnx's reference evaluator failed on it: {e}") from e
        for name, value in zip(self.outputs, results, strict=False):
            if name:
                env[name] = np.asarray(value)
        self.stats.calls += 1
        self.stats.seconds += time.perf_counter() - start


def outer_names(node: onnx.NodeProto) -> list[str]:
    """Tensors the subgraphs of ``node`` read from outside themselves, in first-use order."""
    found: dict[str, None] = {}
    for attr in node.attribute:
        graphs = [attr.g] if attr.HasField("g") else list(attr.graphs)
        for graph in graphs:
            known = {v.name for v in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                for name in [*inner.input, *outer_names(inner)]:
                    if name and name not in known:
                        found.setdefault(name)
                known.update(inner.output)
    return list(found)


def model_opsets(proto: onnx.ModelProto) -> dict[str, int]:
    """Opset version per domain, as the reference evaluator wants them."""
    opsets = {entry.domain or "": int(entry.version) for entry in proto.opset_import}
    opsets.setdefault("", 1)
    return opsets


def warn_fallbacks(steps: Iterable[Any]) -> None:
    """One warning per operator type that runs in the reference evaluator."""
    by_op: dict[str, list[FallbackStep]] = {}
    for step in steps:
        if isinstance(step, FallbackStep):
            by_op.setdefault(step.info.op_type, []).append(step)
    for op, found in sorted(by_op.items()):
        logger.warning("operator %s (%d node%s, e.g. %r) runs in onnx's reference evaluator "
                       "(slow): %s", op, len(found), "" if len(found) == 1 else "s",
                       found[0].info.name, found[0].reason)


def fallback_report(steps: Sequence[Any], total_seconds: float) -> list[dict[str, Any]]:
    """Per operator type run by the reference evaluator: nodes, seconds and share of
    ``total_seconds`` (the runner's own time over the same calls)."""
    rows: dict[str, dict[str, Any]] = {}
    for step in steps:
        if not isinstance(step, FallbackStep):
            continue
        row = rows.setdefault(step.info.op_type, {"op": step.info.op_type, "nodes": 0,
                                                  "seconds": 0.0, "reason": step.reason})
        row["nodes"] += 1
        row["seconds"] += step.stats.seconds
    for row in rows.values():
        row["share"] = row["seconds"] / total_seconds if total_seconds > 0 else 0.0
    return sorted(rows.values(), key=lambda r: -r["seconds"])
