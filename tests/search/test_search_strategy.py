"""The model tuner's parts: the cold-start strategy and the shared transfer prior."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from search_synthetic import results
from test_search_tuners import DENSE, OTHER, QUICK, setup, transfer_from

from tuner_service.cost_model import (
    Prior,
    PriorCache,
    TransferCostModel,
    XGBCostModel,
    XGBParams,
)
from tuner_service.tuners import make_tuner
from tuner_service.tuners.annealing import COLD_START, AnnealingSearch
from tuner_service.tuners.model_based import ModelTuner
from tuner_service.tuners.strategy import ColdStart


def by_index(indices: Sequence[int]) -> np.ndarray:
    """A score that prefers high indices and refuses odd ones."""
    return np.array([float(i) if i % 2 == 0 else -np.inf for i in indices])


def test_cold_start_plans_cold_until_something_is_measured() -> None:
    _, space, _ = setup(DENSE)
    cold, warm = AnnealingSearch(COLD_START), AnnealingSearch(QUICK)
    strategy = ColdStart(cold, warm)
    exclude = set(space.sample(50, np.random.default_rng(1)))
    plan = strategy.plan(space, by_index, 8, exclude, np.random.default_rng(0))
    assert strategy.evaluated == cold.evaluated > 0 and warm.evaluated == 0
    assert len(plan) == 8 and not set(plan) & exclude and all(i % 2 == 0 for i in plan)
    elite = space.sample(4, np.random.default_rng(2))
    strategy.plan(space, by_index, 8, set(), np.random.default_rng(0), elite)
    assert strategy.evaluated == warm.evaluated > 0


def test_tasks_given_the_same_records_share_one_prior() -> None:
    workload, space, template = setup(DENSE)
    records = transfer_from(OTHER, 120)
    priors = PriorCache()
    tuners = [make_tuner("xgb-transfer", workload, space, seed, template=template,
                         transfer=records, priors=priors, search=QUICK,
                         model_params=XGBParams(rounds=30, seed=seed)) for seed in (1, 2)]
    models = []
    for tuner in tuners:
        assert isinstance(tuner, ModelTuner) and isinstance(tuner.model, TransferCostModel)
        picks = tuner.ask(16)
        tuner.tell(picks, results(space, picks))
        models.append(tuner.model)
    assert models[0].prior() is not None and models[0].prior() is models[1].prior()
    alone = make_tuner("xgb-transfer", workload, space, 1, template=template,
                       transfer=records[:-1], priors=priors, search=QUICK)
    assert isinstance(alone, ModelTuner) and isinstance(alone.model, TransferCostModel)
    assert alone.model.prior() is not models[0].prior()


def test_prior_cache_keeps_the_most_recent() -> None:
    built: list[str] = []

    def prior(name: str) -> Prior:
        built.append(name)
        return Prior(lambda: None, XGBCostModel)

    cache = PriorCache(size=2)
    first = cache.get("a", lambda: prior("a"))
    cache.get("b", lambda: prior("b"))
    assert cache.get("a", lambda: prior("a")) is first  # a is now the most recent
    cache.get("c", lambda: prior("c"))  # evicts b
    cache.get("b", lambda: prior("b"))
    assert built == ["a", "b", "c", "b"]
    assert first.data() is None and first.model() is None
