"""How full a backend kept its engine: a run's span against the floor for the work it did.

The floor is the least span any scheduler could reach for the same work: it cannot beat the longest
conversation's chain of answers (each turn waits for the one before), nor the work spread evenly
over the most requests the engine served at once:

    floor = max(longest chain, total work / most in flight at once)

For vLLM the work is generated tokens and the span decode iterations (on a GPU an iteration costs
about the same for 1 or 256 sequences, so iterations stand for time); for an API it is seconds: reply
times, and the wall-clock span of the run. ``span / floor`` is 1.0 for a perfect scheduler.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkLedger:
    """Work per conversation (tokens or seconds), summed as its turns are answered."""

    #: key_id -> the work of its answers so far (live conversations)
    chains: dict[str, float] = field(default_factory=dict)
    total: float = 0.0
    longest_chain: float = 0.0
    #: the most requests in flight at once
    most_in_flight: int = 0

    def add(self, key_id: str, work: float) -> None:
        chain = self.chains.get(key_id, 0.0) + work
        self.chains[key_id] = chain
        self.total += work
        self.longest_chain = max(self.longest_chain, chain)

    def release(self, key_ids: Iterable[str]) -> None:
        for key in key_ids:
            self.chains.pop(key, None)

    def in_flight(self, n: int) -> None:
        self.most_in_flight = max(self.most_in_flight, n)

    def floor(self, parallel: int | None = None) -> float:
        """The floor with ``parallel`` requests at once (default: the most seen in flight)."""
        width = parallel or self.most_in_flight
        return max(self.longest_chain, self.total / width) if width else self.longest_chain


class InFlightClock:
    """Time-weighted count of requests in flight (an API backend's occupancy)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.last = 0.0
        self.count = 0
        self.area = 0.0

    def change(self, delta: int) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = self.last = now
        self.area += self.count * (now - self.last)
        self.last = now
        self.count += delta

    @property
    def span(self) -> float:
        return 0.0 if self.started is None else self.last - self.started

    @property
    def mean(self) -> float:
        """Mean requests in flight between the first request and the last answer."""
        return self.area / self.span if self.span > 0 else 0.0


def ratio(span: float, floor: float) -> float | None:
    return round(span / floor, 3) if floor > 0 else None


def schedule_record(**values: Any) -> dict[str, Any]:
    """A run.json entry: the values, floats rounded."""
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in values.items()}


class IdleClock:
    """Seconds an engine held no request between the first request it got and the last answer it
    gave: the engine waiting for the runner (``update`` with the requests it holds, after each
    change)."""

    def __init__(self) -> None:
        self.idle = 0.0
        self._first: float | None = None
        self._last = 0.0
        self._since: float | None = None

    def update(self, in_engine: int) -> None:
        now = time.monotonic()
        if in_engine > 0:
            if self._first is None:
                self._first = now
            if self._since is not None:
                self.idle += now - self._since
                self._since = None
        elif self._first is not None and self._since is None:
            self._since = now
            self._last = now

    @property
    def span(self) -> float:
        """Seconds from the first request to the last time the engine emptied."""
        return 0.0 if self._first is None else max(0.0, self._last - self._first)
