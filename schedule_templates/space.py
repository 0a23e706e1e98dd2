"""Config spaces as data: knobs are frozen dataclasses, a config is an index in a mixed-radix space.

Knob kinds use AutoTVM's short names so records export unchanged: ``sp`` split, ``re`` reorder,
``an`` annotate, ``ot`` other (a choice). The first knob is the least significant digit.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from schedule_templates.errors import InvalidConfigError

Entity = Any


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _factorizations(extent: int, parts: int, allowed: Callable[[int], bool]
                    ) -> list[tuple[int, ...]]:
    """All ordered tuples of ``parts`` factors whose product is ``extent``; the first factor is
    free (outer loop), the others must satisfy ``allowed``."""
    if parts == 1:
        return [(extent,)]
    out = []
    for inner in divisors(extent):
        if not allowed(inner):
            continue
        for rest in _factorizations(extent // inner, parts - 1, allowed):
            out.append((*rest, inner))
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class SplitKnob:
    """Split an axis of ``extent`` into ``parts`` ordered factors (outermost first), exactly."""

    name: str
    extent: int
    parts: int
    policy: str = "factors"  # "factors", "power2" or "candidates"
    candidates: tuple[int, ...] = ()
    max_inner: int | None = None  # bound on every inner factor

    kind = "sp"

    def __post_init__(self) -> None:
        if self.policy not in ("factors", "power2", "candidates"):
            raise ValueError(f"unknown split policy {self.policy!r}")

    def _allowed(self, factor: int) -> bool:
        if self.max_inner is not None and factor > self.max_inner:
            return False
        if self.policy == "power2":
            return factor & (factor - 1) == 0
        if self.policy == "candidates":
            return factor in self.candidates
        return True

    @property
    def entities(self) -> tuple[tuple[int, ...], ...]:
        return _cached_entities(self)

    def to_json_value(self, value: Entity) -> Any:
        return list(value)

    def from_json_value(self, value: Any) -> Entity:
        return tuple(int(v) for v in value)


@dataclasses.dataclass(frozen=True)
class ReorderKnob:
    """A choice among candidate loop orders, each a tuple of axis names (outermost first)."""

    name: str
    orders: tuple[tuple[str, ...], ...]

    kind = "re"

    @property
    def entities(self) -> tuple[tuple[str, ...], ...]:
        return self.orders

    def to_json_value(self, value: Entity) -> Any:
        return list(value)

    def from_json_value(self, value: Any) -> Entity:
        return tuple(str(v) for v in value)


@dataclasses.dataclass(frozen=True)
class AnnotateKnob:
    """How to emit one loop: ``none``, ``unroll`` or ``vec`` (or a subset)."""

    name: str
    options: tuple[str, ...] = ("none", "unroll")

    kind = "an"

    @property
    def entities(self) -> tuple[str, ...]:
        return self.options

    def to_json_value(self, value: Entity) -> Any:
        return value

    def from_json_value(self, value: Any) -> Entity:
        return str(value)


@dataclasses.dataclass(frozen=True)
class ChoiceKnob:
    """Any other discrete choice (a block size, a layout, a flag).

    ``appended``: the knob was added to an existing space as its last knob and its first option
    is what the template did before, so older configs (every index, and entity lists without
    this knob) keep their meaning; ``from_entities`` fills it in with that first option.
    """

    name: str
    options: tuple[Any, ...]
    appended: bool = dataclasses.field(default=False, compare=False)

    kind = "ot"

    @property
    def entities(self) -> tuple[Any, ...]:
        return self.options

    def to_json_value(self, value: Entity) -> Any:
        return value

    def from_json_value(self, value: Any) -> Entity:
        return value


Knob = SplitKnob | ReorderKnob | AnnotateKnob | ChoiceKnob

_ENTITY_CACHE: dict[SplitKnob, tuple[tuple[int, ...], ...]] = {}


def _cached_entities(knob: SplitKnob) -> tuple[tuple[int, ...], ...]:
    # Pure function of a frozen knob; a bounded memo keeps big spaces cheap to decode.
    found = _ENTITY_CACHE.get(knob)
    if found is None:
        found = tuple(_factorizations(knob.extent, knob.parts, knob._allowed))
        if not found:
            raise ValueError(f"split knob {knob.name} has no valid factorization of {knob.extent}")
        if len(_ENTITY_CACHE) > 4096:
            _ENTITY_CACHE.clear()
        _ENTITY_CACHE[knob] = found
    return found


@dataclasses.dataclass(frozen=True)
class Config:
    """One point of a space: its index and the chosen entity of every knob."""

    index: int
    entities: tuple[tuple[str, str, Entity], ...]  # (name, kind, value)

    def __getitem__(self, name: str) -> Entity:
        for knob_name, _kind, value in self.entities:
            if knob_name == name:
                return value
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "entity": [[n, k, list(v) if isinstance(v, tuple) else v] for n, k, v in self.entities],
        }


@dataclasses.dataclass(frozen=True)
class ConfigSpace:
    knobs: tuple[Knob, ...]
    #: a predicate a template uses to reject configs it could not run well (register pressure...)
    constraint: Callable[[Config], bool] | None = dataclasses.field(default=None, compare=False)

    @functools.cached_property  # hot: every index decode reads it (a frozen instance)
    def dims(self) -> tuple[int, ...]:
        return tuple(len(k.entities) for k in self.knobs)

    @functools.cached_property
    def size(self) -> int:
        return math.prod(self.dims)

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise KeyError(name)

    def digits(self, index: int) -> tuple[int, ...]:
        if not isinstance(index, int) or not 0 <= index < self.size:
            raise InvalidConfigError(f"config index {index!r} is outside [0, {self.size})")
        out = []
        for dim in self.dims:
            index, digit = divmod(index, dim)
            out.append(digit)
        return tuple(out)

    def index_of(self, digits: Sequence[int]) -> int:
        index = 0
        for digit, dim in zip(reversed(digits), reversed(self.dims), strict=True):
            index = index * dim + digit
        return index

    def get(self, index: int) -> Config:
        digits = self.digits(index)
        return Config(
            index,
            tuple((k.name, k.kind, k.entities[d]) for k, d in zip(self.knobs, digits, strict=True)),
        )

    def is_valid(self, index: int) -> bool:
        return self.constraint is None or self.constraint(self.get(index))

    def from_entities(self, values: dict[str, Entity]) -> Config:
        values = {**{k.name: k.entities[0] for k in self.knobs
                     if isinstance(k, ChoiceKnob) and k.appended}, **values}
        missing = [k.name for k in self.knobs if k.name not in values]
        extra = sorted(set(values) - {k.name for k in self.knobs})
        if missing or extra:
            raise InvalidConfigError(
                f"config knobs do not match the space: missing {missing}, unknown {extra}"
            )
        digits = []
        for k in self.knobs:
            try:
                digits.append(list(k.entities).index(values[k.name]))
            except ValueError:
                raise InvalidConfigError(
                    f"knob {k.name}: {values[k.name]!r} is not one of its values"
                ) from None
        return self.get(self.index_of(digits))

    def from_json(self, data: Any) -> Config:
        """Accept ``{"index": i}``, ``{"entity": [[name, kind, value], ...]}`` or a bare index;
        when both are given they must agree."""
        if isinstance(data, int) and not isinstance(data, bool):
            return self.get(data)
        if not isinstance(data, dict):
            raise InvalidConfigError("a config is an index or an object with 'index'/'entity'")
        config = None
        if "entity" in data:
            entity = data["entity"]
            if not isinstance(entity, list) or not all(
                isinstance(e, list | tuple) and len(e) == 3 for e in entity
            ):
                raise InvalidConfigError("'entity' must be a list of [name, kind, value]")
            values = {}
            for name, kind, value in entity:
                try:
                    knob = self.knob(str(name))
                except KeyError:
                    raise InvalidConfigError(f"unknown knob {name!r}") from None
                if kind != knob.kind:
                    raise InvalidConfigError(f"knob {name}: kind {kind!r}, expected {knob.kind!r}")
                try:
                    values[knob.name] = knob.from_json_value(value)
                except (TypeError, ValueError):
                    raise InvalidConfigError(f"knob {name}: malformed value {value!r}") from None
            config = self.from_entities(values)
        if "index" in data:
            index = data["index"]
            if not isinstance(index, int) or isinstance(index, bool):
                raise InvalidConfigError(f"config index {index!r} is not an integer")
            if config is not None and config.index != index:
                raise InvalidConfigError(
                    f"config index {index} disagrees with its entities (index {config.index})"
                )
            config = config or self.get(index)
        if config is None:
            raise InvalidConfigError("a config needs 'index' or 'entity'")
        return config

    def sample(
        self,
        n: int,
        rng: np.random.Generator,
        exclude: Iterable[int] = (),
        valid_only: bool = True,
        max_tries: int | None = None,
    ) -> list[int]:
        """Up to ``n`` distinct random indices not in ``exclude`` (fewer if the space runs dry)."""
        seen = set(exclude)
        out: list[int] = []
        size = self.size
        if size - len(seen) <= 4 * n and size <= 1 << 22:
            pool = [i for i in range(size) if i not in seen]
            rng.shuffle(pool)
            for i in pool:
                if len(out) == n:
                    break
                if not valid_only or self.is_valid(i):
                    out.append(i)
            return out
        tries = max_tries if max_tries is not None else 64 * n + 1000
        for _ in range(tries):
            if len(out) == n:
                break
            i = self.random_index(rng)
            if i in seen:
                continue
            seen.add(i)
            if not valid_only or self.is_valid(i):
                out.append(i)
        return out

    def random_index(self, rng: np.random.Generator) -> int:
        return self.index_of([int(rng.integers(d)) for d in self.dims])

    def neighbors(self, index: int, step: int = 1) -> Iterator[int]:
        """Indices that differ from ``index`` in one knob by at most ``step`` positions."""
        digits = list(self.digits(index))
        for pos, dim in enumerate(self.dims):
            for delta in range(-step, step + 1):
                d = digits[pos] + delta
                if delta == 0 or not 0 <= d < dim:
                    continue
                moved = digits.copy()
                moved[pos] = d
                yield self.index_of(moved)

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": k.name, "kind": k.kind, "size": len(k.entities),
             "values": [k.to_json_value(v) for v in k.entities][:64]}
            for k in self.knobs
        ]
