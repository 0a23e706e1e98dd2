"""The tuner contract for every ``--tuner`` name, and what the learned tuners add."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from search_synthetic import inverted_speed, results, speeds

from schedule_templates.records import ErrorKind, MeasureResult
from schedule_templates.space import ConfigSpace
from schedule_templates.templates.base import get_template
from schedule_templates.workloads import Workload, parse_workload
from tuner_service.cost_model import TransferCostModel, TransferParams, XGBParams
from tuner_service.tuners import TRANSFER_TUNERS, Tuner, make_tuner, tuner_names
from tuner_service.tuners.annealing import AnnealParams, mutate
from tuner_service.tuners.model_based import ModelTuner, ModelTunerParams
from tuner_service.tuners.transfer import TransferRecord, parse_records

DENSE = "dense:M=64,N=64,K=64"
OTHER = "dense:M=128,N=96,K=128"
TINY_CONV = "conv2d:N=1,C=4,H=4,W=4,K=8,R=3,S=3,pad=1"
#: a short search keeps the tests fast; the defaults are measured in the report
QUICK = AnnealParams(chains=16, steps=8, random_candidates=64)


def setup(key: str) -> tuple[Workload, ConfigSpace, Any]:
    workload = parse_workload(key)
    template = get_template(workload.op)
    return workload, template.space(workload), template


def build(name: str, key: str, seed: int = 0, **options: Any) -> Tuner:
    workload, space, template = setup(key)
    if name in ("xgb", "xgb-transfer"):
        options.setdefault("search", QUICK)
        options.setdefault("model_params", XGBParams(rounds=30, seed=seed))
    return make_tuner(name, workload, space, seed, template=template, **options)


def transfer_from(key: str, n: int, speed: Any = None, seed: int = 1) -> list[TransferRecord]:
    workload, space, template = setup(key)
    indices = space.sample(n, np.random.default_rng(seed))
    told = results(space, indices) if speed is None else results(space, indices, speed)
    return [TransferRecord(workload.key, template.name, i, r)
            for i, r in zip(indices, told, strict=True)]


@pytest.mark.parametrize("name", tuner_names())
def test_never_repeats_and_respects_n(name: str) -> None:
    tuner = build(name, DENSE)
    seen: set[int] = set()
    for n in (1, 8, 16, 16):
        picks = tuner.ask(n)
        assert len(picks) == n
        assert len(set(picks)) == n and not seen & set(picks)
        assert all(tuner.space.is_valid(i) for i in picks)
        seen |= set(picks)
        tuner.tell(picks, results(tuner.space, picks, fail_every=5))
    assert tuner.visited == seen
    assert tuner.best_index is not None and tuner.best_cost < float("inf")
    assert tuner.ask(0) == []


@pytest.mark.parametrize("name", tuner_names())
def test_spends_a_small_space_exactly_once(name: str) -> None:
    tuner = build(name, TINY_CONV)
    valid = {i for i in range(tuner.space.size) if tuner.space.is_valid(i)}
    proposed: list[int] = []
    for _ in range(200):
        picks = tuner.ask(13)
        if not picks:
            break
        proposed += picks
        tuner.tell(picks, [MeasureResult((1.0 + (i % 13),)) for i in picks])
    assert len(proposed) == len(set(proposed))
    assert set(proposed) == valid
    assert tuner.exhausted() or not tuner.ask(4)


@pytest.mark.parametrize("name", tuner_names())
def test_all_failed_results_keep_it_proposing(name: str) -> None:
    tuner = build(name, DENSE)
    for _ in range(3):
        picks = tuner.ask(8)
        assert len(picks) == 8 and not (set(picks) & (tuner.visited - set(picks)))
        tuner.tell(picks, [MeasureResult.failure(ErrorKind.RUNTIME, "x") for _ in picks])
    assert tuner.best_index is None


@pytest.mark.parametrize("name", tuner_names())
def test_replayed_measurements_are_never_proposed(name: str) -> None:
    """The server rebuilds a tuner by telling it earlier results it did not propose."""
    tuner = build(name, TINY_CONV)
    earlier = tuner.space.sample(20, np.random.default_rng(9))
    tuner.tell(earlier, [MeasureResult((1.0 + i % 7,)) for i in earlier])
    picks = tuner.ask(16)
    assert picks and not set(picks) & set(earlier)


def test_unknown_tuner_is_refused() -> None:
    workload, space, _ = setup(DENSE)
    with pytest.raises(ValueError, match="xgb-transfer"):
        make_tuner("annealing", workload, space)
    assert set(tuner_names()) >= TRANSFER_TUNERS


@pytest.mark.parametrize("name", ["xgb", "xgb-transfer"])
def test_learned_tuners_need_the_template(name: str) -> None:
    workload, space, template = setup(DENSE)
    with pytest.raises(ValueError, match="template"):
        make_tuner(name, workload, space, 0)
    tuner = make_tuner(name, workload, space, 0, template=template, search=QUICK)
    assert isinstance(tuner, ModelTuner) and tuner.extractor.template is template
    with pytest.raises(TypeError, match="colour"):
        make_tuner(name, workload, space, 0, template=template, colour="red")


def test_exclude_keeps_configs_from_every_tuner() -> None:
    for name in tuner_names():
        tuner = build(name, TINY_CONV)
        held = tuner.space.sample(10, np.random.default_rng(4))
        assert tuner.exclude(held + held[:3]) == held
        assert tuner.exclude(held[:5]) == []
        proposed = [i for _ in range(40) for i in tuner.ask(13)]
        assert not set(proposed) & set(held)


def prior_of(tuner: Tuner) -> TransferCostModel:
    assert isinstance(tuner, ModelTuner) and isinstance(tuner.model, TransferCostModel)
    return tuner.model


@pytest.mark.parametrize("name", ["xgb", "ga"])
def test_learning_beats_random_on_a_structured_space(name: str) -> None:
    """After 64 measurements, the next 32 proposals are faster on average than 32 random ones
    (the synthetic throughput comes from real configs: tiles, cache, vector lanes)."""
    gains = []
    for seed in range(2):
        tuner = build(name, DENSE, seed)
        first = tuner.ask(64)
        tuner.tell(first, results(tuner.space, first))
        learned = speeds(tuner.space, tuner.ask(32)).mean()
        random = speeds(tuner.space, tuner.space.sample(32, np.random.default_rng(seed),
                                                        exclude=tuner.visited)).mean()
        gains.append(learned / random)
    assert min(gains) > 2.0  # measured: xgb 8-9x, ga 3-4x


def test_transfer_without_records_is_xgb() -> None:
    plain, transfer = build("xgb", DENSE, 3), build("xgb-transfer", DENSE, 3)
    for _ in range(3):
        a, b = plain.ask(12), transfer.ask(12)
        assert a == b
        told = results(plain.space, a, fail_every=4)
        plain.tell(a, told)
        transfer.tell(b, told)


def test_transfer_helps_the_first_batch() -> None:
    """Records of another shape make the very first proposals better than random ones."""
    tuner = build("xgb-transfer", DENSE, 0, transfer=transfer_from(OTHER, 300))
    first = speeds(tuner.space, tuner.ask(32)).mean()
    random = speeds(tuner.space, tuner.space.sample(256, np.random.default_rng(0))).mean()
    assert first > 3 * random  # measured: about 6x
    assert prior_of(tuner).prior_share() == pytest.approx(1.0)


def test_transfer_from_an_unlike_workload_is_dropped() -> None:
    """A prior that ranks this workload backwards loses all weight once own data arrives."""
    params = TransferParams(min_own=16)
    tuner = build("xgb-transfer", DENSE, 0, transfer_params=params,
                  transfer=transfer_from(OTHER, 300, speed=inverted_speed))
    picks = tuner.ask(32)
    tuner.tell(picks, results(tuner.space, picks))
    assert prior_of(tuner).relevance == 0.0
    assert prior_of(tuner).prior_share() == 0.0
    like = build("xgb-transfer", DENSE, 0, transfer_params=params,
                 transfer=transfer_from(OTHER, 300))
    picks = like.ask(32)
    like.tell(picks, results(like.space, picks))
    assert prior_of(like).relevance > 0.5


def test_transfer_ignores_other_templates_and_bad_records() -> None:
    workload, space, template = setup(DENSE)
    junk = [TransferRecord(TINY_CONV, "conv2d.x86", 0, MeasureResult((1.0,))),
            TransferRecord("dense:M=3,N=5,K=7", template.name, 10 ** 9, MeasureResult((1.0,))),
            TransferRecord("dense:M=0", template.name, 0, MeasureResult((1.0,)))]
    tuner = make_tuner("xgb-transfer", workload, space, 0, template=template, transfer=junk,
                       search=QUICK)
    assert len(tuner.ask(8)) == 8


def test_parse_records_both_formats() -> None:
    export = {"uid": "u1", "workload": DENSE, "target": "llvm", "template": "dense.x86",
              "template_version": 1, "config": {"index": 5, "entity": []},
              "result": {"costs": [0.5], "error_kind": 0}}
    autotvm = {"input": ["llvm", "dense.x86", [OTHER], {}], "config": {"index": 7},
               "result": [[], 4, 0.1, 0.0], "version": 0.2}
    other = dict(export, template="conv2d.x86")
    lines = [json.dumps(export), "", json.dumps(autotvm), json.dumps(other)]
    parsed = parse_records(lines, "dense.x86", "llvm")
    assert [(r.workload, r.index, r.result.ok) for r in parsed] == [(DENSE, 5, True),
                                                                   (OTHER, 7, False)]
    assert parsed[1].result.error is ErrorKind.RUNTIME
    assert parse_records(lines, "dense.x86", "cuda") == []
    with pytest.raises(ValueError, match="line 2"):
        parse_records([json.dumps(export), '{"workload": 1}'], "dense.x86")


def test_mutation_moves_one_knob() -> None:
    _, space, _ = setup(DENSE)
    rng = np.random.default_rng(0)
    for index in space.sample(50, rng):
        moved = mutate(space.dims, index, rng, jump_share=0.5)
        changed = [a != b for a, b in zip(space.digits(index), space.digits(moved), strict=True)]
        assert sum(changed) == 1
    assert mutate((1, 1), 0, rng, 0.5) == 0


def test_annealing_climbs_to_the_optimum() -> None:
    """Score: minus the distance (in knob positions) to one config; the walk finds it."""
    _, space, _ = setup(DENSE)
    target = space.digits(space.sample(1, np.random.default_rng(2))[0])

    def score(indices: Any) -> np.ndarray:
        return -np.array([sum(abs(a - b) for a, b in zip(space.digits(i), target, strict=True))
                          for i in indices], dtype=float)

    from tuner_service.tuners.annealing import anneal

    found = anneal(space, score, [], 8, set(), np.random.default_rng(0), space.is_valid,
                   AnnealParams(chains=16, steps=60, patience=60))
    assert found.scores[0] == 0 and space.digits(found.pool[0]) == target
    assert found.scores == sorted(found.scores, reverse=True) and len(found.pool) == 8


def test_diversity_filter_spreads_a_batch() -> None:
    def knob_values(tuner: Tuner, picks: list[int]) -> int:
        return sum(len({tuner.space.digits(i)[k] for i in picks})
                   for k in range(len(tuner.space.dims)))

    spread = []
    for diversity in (0.0, 4.0):
        params = ModelTunerParams(diversity=diversity, epsilon=0.0)
        tuner = build("xgb", DENSE, 0, params=params,
                      search=AnnealParams(chains=16, steps=8, random_candidates=128))
        first = tuner.ask(48)
        tuner.tell(first, results(tuner.space, first))
        picks = tuner.ask(16)
        assert len(picks) == 16 and not set(picks) & set(first)
        spread.append(knob_values(tuner, picks))
    assert spread[1] > spread[0]
