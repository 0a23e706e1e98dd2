"""The xgboost cost model on real lowered configs: ranking, groups, save/load, metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from search_synthetic import speeds

from schedule_templates.features import FeatureExtractor
from schedule_templates.records import ErrorKind, MeasureResult
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import parse_workload
from tuner_service.cost_model import (
    OBJECTIVES,
    CostModelError,
    XGBCostModel,
    XGBParams,
    normalise,
    pairwise_accuracy,
    throughputs,
    top_k_recall,
)

FAST = dict(rounds=40, nthread=1)


def table(key: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    workload = parse_workload(key)
    fx = FeatureExtractor(get_template(workload.op), workload)
    indices = fx.space.sample(n, np.random.default_rng(seed))
    return fx.features(indices), normalise(speeds(fx.space, indices))


@pytest.fixture(scope="module")
def dense() -> tuple[np.ndarray, np.ndarray]:
    return table("dense:M=256,N=256,K=256", 500, seed=7)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_ranks_held_out_configs_better_than_chance(
        objective: str, dense: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = dense
    model = XGBCostModel(XGBParams(objective=objective, **FAST))  # type: ignore[arg-type]
    model.fit(x[:250], y[:250])
    scores = model.predict(x[250:])
    assert pairwise_accuracy(y[250:], scores) > 0.7  # chance is 0.5
    assert top_k_recall(y[250:], scores, k_true=10, k_pred=64) >= 0.5


def test_trained_on_one_shape_ranks_another(dense: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = dense
    other_x, other_y = table("dense:M=128,N=768,K=768", 200, seed=8)
    model = XGBCostModel(XGBParams(**FAST))  # type: ignore[arg-type]
    model.fit(x, y)
    assert pairwise_accuracy(other_y, model.predict(other_x)) > 0.75


def test_groups_and_weights(dense: tuple[np.ndarray, np.ndarray]) -> None:
    """Two groups (workloads), rows interleaved: ranking objectives sort them by group; a group
    with weight 0 teaches nothing."""
    x, y = dense
    groups = np.arange(300) % 2
    noise = np.random.default_rng(0).random(300)
    labels = np.where(groups == 0, y[:300], noise)  # group 1 is noise
    for objective in OBJECTIVES:
        model = XGBCostModel(XGBParams(objective=objective, **FAST))  # type: ignore[arg-type]
        model.fit(x[:300], labels, groups, weights=np.where(groups == 0, 1.0, 0.0))
        assert pairwise_accuracy(y[300:], model.predict(x[300:])) > 0.75


def test_save_load_round_trip(tmp_path: Path, dense: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = dense
    model = XGBCostModel(XGBParams(objective="reg:squarederror", **FAST))  # type: ignore[arg-type]
    model.fit(x[:200], y[:200])
    path = tmp_path / "model.json"
    model.save(path)
    loaded = XGBCostModel.load(path)
    assert loaded.params == model.params and loaded.width == model.width
    assert np.array_equal(loaded.predict(x[200:]), model.predict(x[200:]))
    with pytest.raises(CostModelError, match="expected rows of"):
        loaded.predict(x[:5, :10])


def test_load_refuses_foreign_files(tmp_path: Path, dense: tuple[np.ndarray, np.ndarray]) -> None:
    import xgboost

    x, y = dense
    plain = xgboost.train({"nthread": 1}, xgboost.DMatrix(x[:50], label=y[:50]), 2)
    plain.save_model(str(tmp_path / "plain.json"))
    with pytest.raises(CostModelError, match="not a model saved"):
        XGBCostModel.load(tmp_path / "plain.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(CostModelError, match="cannot read"):
        XGBCostModel.load(tmp_path / "junk.json")


def test_untrained_and_bad_inputs() -> None:
    model = XGBCostModel()
    assert not model.trained
    with pytest.raises(CostModelError, match="not trained"):
        model.predict(np.zeros((1, 3)))
    with pytest.raises(CostModelError, match="do not match"):
        model.fit(np.zeros((3, 2)), np.zeros(2))
    with pytest.raises(CostModelError, match="unknown objective"):
        XGBCostModel(XGBParams(objective="rank:nothing")).fit(np.zeros((2, 2)), np.ones(2))


def test_labels_and_metrics() -> None:
    ok = MeasureResult((0.5, 0.5))
    fast = MeasureResult((0.25,))
    failed = MeasureResult.failure(ErrorKind.RUNTIME, "boom")
    assert list(throughputs([ok, fast, failed])) == [2.0, 4.0, 0.0]
    assert list(normalise(np.array([2.0, 4.0, 0.0, 1.0, 3.0]), np.array([0, 0, 0, 1, 1]))) == [
        0.5, 1.0, 0.0, 1 / 3, 1.0]
    assert list(normalise(np.zeros(3))) == [0.0, 0.0, 0.0]
    truth = np.array([1.0, 2.0, 3.0, 4.0])
    assert pairwise_accuracy(truth, truth) == 1.0
    assert pairwise_accuracy(truth, -truth) == 0.0
    assert pairwise_accuracy(truth, np.zeros(4)) == 0.5  # ties count half
    # pairs across groups are not compared
    assert pairwise_accuracy(truth, np.array([2.0, 1.0, 4.0, 3.0]), np.array([0, 1, 0, 1])) == 1.0
    assert top_k_recall(truth, truth, k_true=2, k_pred=2) == 1.0
    assert top_k_recall(truth, -truth, k_true=2, k_pred=2) == 0.0


def test_importing_tuners_does_not_import_xgboost() -> None:
    code = ("import sys, tuner_service.tuners, tuner_service.cost_model, "
            "tuner_service.tuners.model_based, tuner_service.tuners.transfer; "
            "print('xgboost' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
