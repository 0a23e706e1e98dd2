"""Labels for training and the two ranking metrics the benchmark and the tests report."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from schedule_templates.records import MeasureResult

#: larger groups are compared on a fixed random subset of this many rows
MAX_PAIR_ROWS = 3000


def throughputs(results: Sequence[MeasureResult]) -> np.ndarray:
    """1 / mean seconds per result; 0 for a failure (an error is never fast)."""
    return np.array([1.0 / r.mean_cost if r.ok and r.mean_cost > 0 else 0.0 for r in results])


def normalise(values: np.ndarray, groups: np.ndarray | None = None) -> np.ndarray:
    """Divide by the best value of each group, so every group's best is 1 and failures 0."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros_like(values)
    keys = np.zeros(len(values), dtype=np.int64) if groups is None else np.asarray(groups)
    for g in np.unique(keys):
        mask = keys == g
        top = values[mask].max(initial=0.0)
        if top > 0:
            out[mask] = values[mask] / top
    return out


def pairwise_accuracy(truth: np.ndarray, scores: np.ndarray, groups: np.ndarray | None = None
                      ) -> float:
    """Fraction of pairs (within a group, with different true values) that ``scores`` orders
    like ``truth``; ties in ``scores`` count half. 0.5 is chance."""
    truth, scores = np.asarray(truth, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    keys = np.zeros(len(truth), dtype=np.int64) if groups is None else np.asarray(groups)
    agree = total = 0.0
    for g in np.unique(keys):
        t, s = truth[keys == g], scores[keys == g]
        if len(t) > MAX_PAIR_ROWS:  # all pairs of a big group would not fit in memory
            keep = np.random.default_rng(0).choice(len(t), MAX_PAIR_ROWS, replace=False)
            t, s = t[keep], s[keep]
        dt = np.sign(t[:, None] - t[None, :])
        ds = np.sign(s[:, None] - s[None, :])
        upper = np.triu(dt != 0, k=1)
        total += upper.sum()
        agree += ((dt == ds) & upper).sum() + 0.5 * ((ds == 0) & upper).sum()
    return float(agree / total) if total else 0.5


def top_k_recall(truth: np.ndarray, scores: np.ndarray, k_true: int = 10, k_pred: int = 64
                 ) -> float:
    """Share of the true best ``k_true`` rows found among the ``k_pred`` best-scored rows."""
    truth, scores = np.asarray(truth), np.asarray(scores)
    k_true = min(k_true, len(truth))
    if k_true == 0:
        return 0.0
    best = set(np.argsort(-truth, kind="stable")[:k_true].tolist())
    picked = set(np.argsort(-scores, kind="stable")[:k_pred].tolist())
    return len(best & picked) / k_true
