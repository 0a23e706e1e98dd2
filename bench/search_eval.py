"""The cost model on the replay dataset: held-out ranking quality, within a workload and across.

For each workload the model is fitted on a random half of its measured configs and scores the
other half ("held-out"), and fitted on the other workloads of the same template only and scores
all of this one ("transfer": what a new task's model knows before its first measurement).
Reported: pairwise ranking accuracy (0.5 is chance) and the share of the true top-10 found in
the predicted top-64.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from schedule_templates.features import FeatureExtractor
from tuner_service.cost_model import (
    XGBCostModel,
    XGBParams,
    normalise,
    pairwise_accuracy,
    top_k_recall,
)


@dataclasses.dataclass
class Table:
    """One workload's measured configs as model inputs."""

    key: str
    template: str
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray  # normalised throughput: best 1, failures 0


def make_table(key: str, template: Any, workload: Any, costs: dict[int, float | None]) -> Table:
    indices = np.array(sorted(costs), dtype=np.int64)
    features = FeatureExtractor(template, workload).features([int(i) for i in indices])
    speed = np.array([1.0 / c if (c := costs[int(i)]) else 0.0 for i in indices])
    return Table(key, template.name, indices, features, normalise(speed))


def _scores(truth: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    return {"pairwise_accuracy": round(pairwise_accuracy(truth, scores), 4),
            "top10_recall_at_64": round(top_k_recall(truth, scores, 10, 64), 4)}


def held_out(table: Table, seed: int, objective: str | None = None) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(table.labels))
    train, test = order[: len(order) // 2], order[len(order) // 2:]
    params = XGBParams(nthread=1, seed=seed)
    if objective is not None:
        params = dataclasses.replace(params, objective=objective)
    model = XGBCostModel(params)
    model.fit(table.features[train], table.labels[train])
    return _scores(table.labels[test], model.predict(table.features[test]))


def transfer(table: Table, others: Sequence[Table], seed: int) -> dict[str, float] | None:
    """A model fitted on the other workloads of the same template only."""
    same = [t for t in others if t.template == table.template and t.key != table.key]
    if not same:
        return None
    x = np.concatenate([t.features for t in same])
    y = np.concatenate([t.labels for t in same])
    groups = np.concatenate([np.full(len(t.labels), g) for g, t in enumerate(same)])
    model = XGBCostModel(XGBParams(nthread=1, seed=seed))
    model.fit(x, y, groups)
    return _scores(table.labels, model.predict(table.features))


def evaluate(tables: Sequence[Table], seeds: Sequence[int],
             objectives: Sequence[str | None] = (None,),
             scored: Collection[str] | None = None) -> dict[str, Any]:
    """Per workload (those in ``scored``, default all) and averaged: held-out metrics (mean
    over seeds) and transfer metrics (trained on all the other tables)."""
    rows: dict[str, dict[str, Any]] = {}
    for table in tables:
        if scored is not None and table.key not in scored:
            continue
        row: dict[str, Any] = {}
        for objective in objectives:
            runs = [held_out(table, s, objective) for s in seeds]
            name = "held_out" if objective is None else f"held_out[{objective}]"
            row[name] = {k: round(float(np.mean([r[k] for r in runs])), 4) for k in runs[0]}
        row["transfer"] = transfer(table, tables, seeds[0])
        rows[table.key] = row
    return {"per_workload": rows, "mean": _means(rows)}


def _means(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    names = {name for row in rows.values() for name, v in row.items() if v is not None}
    for name in sorted(names):
        values = [row[name] for row in rows.values() if row.get(name) is not None]
        out[name] = {k: round(float(np.mean([v[k] for v in values])), 4) for k in values[0]}
    return out
