import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedule_templates.errors import InvalidConfigError
from schedule_templates.space import (
    AnnotateKnob,
    ChoiceKnob,
    ConfigSpace,
    ReorderKnob,
    SplitKnob,
)

SPACE = ConfigSpace((
    SplitKnob("tile_x", 48, 3),
    SplitKnob("tile_y", 64, 2, policy="power2"),
    SplitKnob("tile_z", 30, 2, policy="candidates", candidates=(1, 3, 5)),
    ReorderKnob("order", (("x", "y"), ("y", "x"))),
    AnnotateKnob("ann", ("none", "unroll", "vec")),
    ChoiceKnob("flag", (False, True)),
))


def test_split_entities_multiply_to_extent():
    knob = SPACE.knob("tile_x")
    assert all(a * b * c == 48 for a, b, c in knob.entities)
    assert len(set(knob.entities)) == len(knob.entities)
    assert {e[1] for e in SPACE.knob("tile_z").entities} == {1, 3, 5}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, SPACE.size - 1))
def test_index_json_round_trip(index):
    config = SPACE.get(index)
    assert SPACE.from_json(config.to_json()) == config
    assert SPACE.from_json({"entity": config.to_json()["entity"]}).index == index
    assert SPACE.index_of(SPACE.digits(index)) == index


@pytest.mark.parametrize("bad", [
    -1, SPACE.size, "3", {"index": 1.5}, {"entity": [["tile_x", "sp", [5, 1, 1]]]},
    {"entity": [["nope", "sp", [1]]]}, {"entity": "x"}, {}, [1, 2],
    {"index": 0, "entity": SPACE.get(1).to_json()["entity"]},
])
def test_malformed_configs_are_typed_errors(bad):
    with pytest.raises(InvalidConfigError):
        SPACE.from_json(bad)


def test_sampling_never_repeats_and_respects_exclusions():
    rng = np.random.default_rng(0)
    first = SPACE.sample(50, rng)
    second = SPACE.sample(50, rng, exclude=first)
    assert len(set(first)) == 50 and not set(first) & set(second)
    small = ConfigSpace((ChoiceKnob("a", (1, 2, 3)),))
    assert sorted(small.sample(10, rng)) == [0, 1, 2]


def test_neighbors_change_one_knob():
    index = SPACE.get(1234).index
    for other in SPACE.neighbors(index):
        diff = [a != b for a, b in zip(SPACE.digits(index), SPACE.digits(other), strict=True)]
        assert sum(diff) == 1


def test_constraint_filters():
    space = ConfigSpace((SplitKnob("t", 16, 2),), constraint=lambda c: c["t"][1] <= 4)
    valid = [i for i in range(space.size) if space.is_valid(i)]
    assert {space.get(i)["t"][1] for i in valid} == {1, 2, 4}
    assert all(space.is_valid(i) for i in space.sample(10, np.random.default_rng(1)))
