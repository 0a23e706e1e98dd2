"""Parallel simulated annealing over a config space, with any score as the (negated) energy.

Chains walk the mixed-radix space one knob at a time: a move sets one knob to a random other
value or shifts it by one or two positions (split factors next to each other behave alike).
Every scored config that is not excluded competes for a pool of the best ones found; the walk
stops after ``steps`` or once the pool has not changed for ``patience`` steps.

Scores are computed for all chains at once (one feature batch, one model call per step), and the
temperature is measured in standard deviations of the starting scores, so the same settings work
for a regression model and a ranking model whose scores have no fixed scale.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet

import numpy as np

from schedule_templates.space import ConfigSpace
from tuner_service.tuners.strategy import Score, SearchStrategy

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AnnealParams:
    chains: int = 64
    #: few steps per call: chains persist across calls (the tuner restarts them where they
    #: stopped), and each step costs ``chains`` lowerings (ask(64) stays near 1 s, 2 cores)
    steps: int = 24
    #: starting temperature, in standard deviations of the starting scores; cools linearly
    temperature: float = 0.5
    patience: int = 8
    #: share of moves that draw a knob value at random (the rest step to a nearby value)
    jump_share: float = 0.5
    #: moves tried per chain and step to find a config that passes the space's constraint
    tries: int = 4
    #: (``AnnealingSearch``) random valid configs scored before annealing: they compete for
    #: the pool and the best of them start chains (in a small or sparse space they find what
    #: local moves cannot)
    random_candidates: int = 256
    #: (``AnnealingSearch``) measured configs (best first) that start chains
    elite_starts: int = 16


#: a short walk, for a plan from a model that knows only a prior (``ColdStart``): about 200
#: configs scored instead of about 1900
COLD_START = AnnealParams(chains=16, steps=8, random_candidates=64)


@dataclasses.dataclass
class AnnealResult:
    pool: list[int]  # best configs found, best first
    scores: list[float]
    ends: list[int]  # where the chains stopped (good starts for the next call)
    evaluated: int  # configs scored (the cost of the call)


def mutate(dims: Sequence[int], index: int, rng: np.random.Generator, jump_share: float
           ) -> int:
    """A config of the mixed-radix space ``dims`` (first digit least significant, as in
    ``ConfigSpace``) that differs from ``index`` in one knob; ``index`` itself when no knob
    can move. Works on the radices directly: ``ConfigSpace.dims`` is recomputed per call."""
    movable = [pos for pos, dim in enumerate(dims) if dim > 1]
    if not movable:
        return index
    digits = []
    rest = index
    for dim in dims:
        rest, digit = divmod(rest, dim)
        digits.append(digit)
    pos = movable[int(rng.integers(len(movable)))]
    dim, old = dims[pos], digits[pos]
    if rng.random() < jump_share:
        new = int(rng.integers(dim - 1))
        new += new >= old  # uniform over the other values
    else:
        step = int(rng.integers(1, 3)) * (1 if rng.random() < 0.5 else -1)
        new = min(max(old + step, 0), dim - 1)
        if new == old:
            new = old - step // abs(step)
    digits[pos] = new
    out = 0
    for digit, dim in zip(reversed(digits), reversed(dims), strict=True):
        out = out * dim + digit
    return out


class _Pool:
    """The ``size`` best (score, index) pairs seen, never an excluded index."""

    def __init__(self, size: int, exclude: AbstractSet[int]) -> None:
        self.size, self.exclude = size, exclude
        self.heap: list[tuple[float, int]] = []
        self.members: set[int] = set()

    def offer(self, index: int, score: float) -> bool:
        if index in self.members or index in self.exclude or not math.isfinite(score):
            return False
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, (score, index))
        elif score > self.heap[0][0]:
            _, dropped = heapq.heapreplace(self.heap, (score, index))
            self.members.discard(dropped)
        else:
            return False
        self.members.add(index)
        return True

    def ranked(self) -> list[tuple[float, int]]:
        return sorted(self.heap, key=lambda p: (-p[0], p[1]))


def anneal(space: ConfigSpace, score: Score, starts: Iterable[int], pool_size: int,
           exclude: AbstractSet[int], rng: np.random.Generator, valid: Callable[[int], bool],
           params: AnnealParams | None = None,
           scored: Iterable[tuple[int, float]] = ()) -> AnnealResult:
    """Walk ``params.chains`` chains from ``starts`` (topped up with random configs) and return
    the ``pool_size`` best-scoring configs not in ``exclude``. ``scored`` (config, score) pairs
    computed by the caller compete for the pool too."""
    p = params or AnnealParams()
    pool = _Pool(pool_size, exclude)
    for i, s in scored:
        pool.offer(i, s)
    points = list(dict.fromkeys(starts))[: p.chains]
    points += space.sample(p.chains - len(points), rng, exclude=points)
    if not points:
        ranked = pool.ranked()
        return AnnealResult([i for _, i in ranked], [s for s, _ in ranked], [], 0)
    current = _finite(score(points))
    evaluated = len(points)
    for i, s in zip(points, current, strict=True):
        pool.offer(i, s)
    spread = float(np.std(current[np.isfinite(current)])) if np.isfinite(current).any() else 0.0
    t0 = p.temperature * (spread if spread > 0 else 1.0)
    quiet = 0
    dims = space.dims
    for step in range(p.steps):
        moves = [_valid_move(dims, i, rng, p, valid) for i in points]
        fresh = _finite(score(moves))
        evaluated += len(moves)
        temperature = max(t0 * (1.0 - step / p.steps), 1e-9)
        with np.errstate(over="ignore", invalid="ignore"):
            accept_p = np.exp(np.minimum((fresh - current) / temperature, 0.0))
        accept = (fresh >= current) | (rng.random(len(points)) < accept_p)
        changed = False
        for c, (i, s) in enumerate(zip(moves, fresh, strict=True)):
            changed |= pool.offer(i, s)
            if accept[c] and math.isfinite(s):
                points[c], current[c] = i, s
        quiet = 0 if changed else quiet + 1
        if quiet >= p.patience:
            break
    ranked = pool.ranked()
    return AnnealResult([i for _, i in ranked], [s for s, _ in ranked], points, evaluated)


class AnnealingSearch(SearchStrategy):
    """Chains start where the last plan's chains stopped (a quarter of them), at the best
    measured configs and at the best of ``random_candidates`` random configs, which also
    compete for the plan."""

    def __init__(self, params: AnnealParams | None = None) -> None:
        self.params = params or AnnealParams()
        self._chains: list[int] = []

    def plan(self, space: ConfigSpace, score: Score, size: int, exclude: AbstractSet[int],
             rng: np.random.Generator, elite: Sequence[int] = ()) -> list[int]:
        p = self.params
        fresh = space.sample(p.random_candidates, rng, exclude=exclude)
        fresh_scores = np.asarray(score(fresh), dtype=np.float64)
        best_fresh = [fresh[i] for i in np.argsort(-fresh_scores, kind="stable")]
        starts = list(dict.fromkeys(
            self._chains[: p.chains // 4] + list(elite[: p.elite_starts]) + best_fresh))
        result = anneal(space, score, starts, size, exclude, rng, space.is_valid, p,
                        scored=zip(fresh, fresh_scores.tolist(), strict=True))
        self._chains = result.ends
        self.evaluated = result.evaluated + len(fresh)
        logger.debug("annealing scored %d configs, kept %d", result.evaluated, len(result.pool))
        return result.pool


def _valid_move(dims: Sequence[int], index: int, rng: np.random.Generator, p: AnnealParams,
                valid: Callable[[int], bool]) -> int:
    move = index
    for _ in range(p.tries):
        move = mutate(dims, index, rng, p.jump_share)
        if valid(move):
            return move
    return move  # scored as invalid (-inf), so the chain stays where it is


def _finite(scores: np.ndarray) -> np.ndarray:
    out = np.asarray(scores, dtype=np.float64).copy()
    out[~np.isfinite(out)] = -np.inf
    return out
