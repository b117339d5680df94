"""An in-flight limit that backs off when the server says it is overloaded (AIMD), for asyncio.

At most ``limit`` requests are in flight. A rate-limit reply (HTTP 429) halves the limit
(multiplicative decrease; at most once per round trip: only a request sent after the last cut can
cut it again, as TCP does per window), and every answered request raises it by ``1 / limit``, about
one per round trip (additive increase), back up to ``ceiling`` (``--concurrency``). The limits it
took are recorded in run.json (``record``), so a run whose server throttled it says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

OK, THROTTLED, OTHER = "ok", "throttled", "other"


class AdaptiveLimit:
    """Waiting requests are let in first come, first served, one per free slot: a release wakes
    the next waiter only (not every waiter to check again: with 128 live conversations and 16 slots
    that was most of the event loop's work). Used from one event loop's thread only."""

    def __init__(self, ceiling: int):
        if ceiling < 1:
            raise ValueError(f"the in-flight limit must be at least 1, got {ceiling}")
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self.lowest = ceiling
        self.decreases = 0
        self._last_cut = float("-inf")
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    async def acquire(self) -> float:
        """Wait for a free slot; returns the time the request starts (for ``release``)."""
        if self._waiters or self.in_flight >= self.allowed:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # the slot is counted for us when we are woken (``_wake``)
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # woken, then cancelled: give it back
                    self.in_flight -= 1
                    self._wake()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
        else:
            self.in_flight += 1
        return time.monotonic()

    def _wake(self) -> None:
        """Hand the free slots to the longest-waiting requests."""
        while self._waiters and self.in_flight < self.allowed:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1
                waiter.set_result(None)

    async def release(self, started: float, outcome: str) -> None:
        """The request that started at ``started`` is over: ``OK`` (an answer), ``THROTTLED``
        (HTTP 429) or ``OTHER`` (any other failure; leaves the limit as it is)."""
        self.in_flight -= 1
        if outcome == THROTTLED and started >= self._last_cut:
            self.limit = max(1.0, self.limit / 2)
            self._last_cut = time.monotonic()
            self.decreases += 1
            self.lowest = min(self.lowest, self.allowed)
        elif outcome == OK:
            self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)
        self._wake()

    def record(self) -> dict[str, Any]:
        return {
            "ceiling": self.ceiling,
            "lowest": self.lowest,
            "final": self.allowed,
            "decreases": self.decreases,
        }
