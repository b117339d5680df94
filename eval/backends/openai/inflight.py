"""An in-flight limit that backs off when the server says it is overloaded (AIMD), for asyncio.

At most ``limit`` requests are in flight. A rate-limit reply (HTTP 429) halves the limit
(multiplicative decrease; at most once per round trip: only a request sent after the last cut can
cut it again, as TCP does per window), and every answered request raises it by ``1 / limit``, about
one per round trip (additive increase), back up to ``ceiling`` (``--concurrency``). The limits it
took are recorded in run.json (``record``), so a run whose server throttled it says so.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

OK, THROTTLED, OTHER = "ok", "throttled", "other"


class AdaptiveLimit:
    def __init__(self, ceiling: int):
        if ceiling < 1:
            raise ValueError(f"the in-flight limit must be at least 1, got {ceiling}")
        self.ceiling = ceiling
        self.limit = float(ceiling)
        self.in_flight = 0
        self.lowest = ceiling
        self.decreases = 0
        self._last_cut = float("-inf")
        self._condition: asyncio.Condition | None = None

    @property
    def allowed(self) -> int:
        return max(1, int(self.limit))

    def _cond(self) -> asyncio.Condition:
        if self._condition is None:  # created in the event loop that uses it
            self._condition = asyncio.Condition()
        return self._condition

    async def acquire(self) -> float:
        """Wait for a free slot; returns the time the request starts (for ``release``)."""
        cond = self._cond()
        async with cond:
            await cond.wait_for(lambda: self.in_flight < self.allowed)
            self.in_flight += 1
        return time.monotonic()

    async def release(self, started: float, outcome: str) -> None:
        """The request that started at ``started`` is over: ``OK`` (an answer), ``THROTTLED``
        (HTTP 429) or ``OTHER`` (any other failure; leaves the limit as it is)."""
        cond = self._cond()
        async with cond:
            self.in_flight -= 1
            if outcome == THROTTLED and started >= self._last_cut:
                self.limit = max(1.0, self.limit / 2)
                self._last_cut = time.monotonic()
                self.decreases += 1
                self.lowest = min(self.lowest, self.allowed)
            elif outcome == OK:
                self.limit = min(float(self.ceiling), self.limit + 1.0 / self.limit)
            cond.notify_all()

    def record(self) -> dict[str, Any]:
        return {
            "ceiling": self.ceiling,
            "lowest": self.lowest,
            "final": self.allowed,
            "decreases": self.decreases,
        }
