"""Capped exponential backoff with jitter, for talking to a server that may be down."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial_s: float = 0.5, cap_s: float = 30.0, factor: float = 2.0,
                 jitter: float = 0.2, rng: random.Random | None = None) -> None:
        self.initial_s = initial_s
        self.cap_s = cap_s
        self.factor = factor
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._attempt = 0

    def next_delay(self) -> float:
        """The wait before the next attempt; grows until ``cap_s``."""
        base = min(self.cap_s, self.initial_s * self.factor ** self._attempt)
        self._attempt += 1
        # Jitter spreads a fleet of workers that lost the server at the same moment.
        return base * (1.0 + self.jitter * (2.0 * self._rng.random() - 1.0))

    def reset(self) -> None:
        self._attempt = 0
