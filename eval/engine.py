"""The scheduler: many conversations advance together, one turn at a time, one batch per step.

At most ``batch_size`` conversations are live. Each step sends the pending turn of every live
conversation to the backend in one ``generate`` call (a backend splits it itself where it must,
as the transformers backend does within its token budget), feeds the answers back, hands finished cases to ``on_finished`` (which appends
them to the result store), and admits new cases into the freed slots. A crash therefore loses at
most the cases that were live. The reference instead runs one conversation and one request at a
time (spec 7.1 item 4).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chexpercept.answers import ParseMode
from chexpercept.case import Case
from chexpercept.results import CaseResult

from .conversation import Conversation
from .protocol import Backend, BackendError

#: seconds to sleep after each step; only for tests that kill a run part-way through
_STEP_DELAY_ENV = "CHEXPERCEPT_TEST_STEP_DELAY"


@dataclass
class EngineStats:
    #: model calls (one per turn asked)
    requests: int = 0
    #: steps, each one backend.generate call with the next turn of every live conversation
    steps: int = 0
    seconds: float = 0.0


def run_conversations(
    cases: Iterable[Case],
    backend: Backend,
    *,
    oracle: str,
    parse_mode: ParseMode = "reference",
    model: str = "",
    batch_size: int,
    on_finished: Callable[[list[CaseResult]], None],
) -> EngineStats:
    """Run every case to the end of its route; returns counts of what was sent."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    delay = float(os.environ.get(_STEP_DELAY_ENV, "0") or 0)
    queue = deque(cases)
    live: list[Conversation] = []
    stats = EngineStats()
    start = time.perf_counter()
    while queue or live:
        while queue and len(live) < batch_size:
            live.append(Conversation(queue.popleft(), oracle=oracle, parse_mode=parse_mode, model=model))
        requests = [c.pending for c in live]
        # one call: backends drop cached images that no request of the call uses
        responses = backend.generate(requests)
        if len(responses) != len(requests):
            raise BackendError(
                f"backend {backend.name!r} returned {len(responses)} answers for {len(requests)} requests"
            )
        for conversation, response in zip(live, responses):
            conversation.answer(response)
        stats.requests += len(requests)
        stats.steps += 1
        finished = [c for c in live if c.done]
        if finished:
            live = [c for c in live if not c.done]
            on_finished([c.result() for c in finished])
        if delay:
            time.sleep(delay)
    stats.seconds = time.perf_counter() - start
    return stats
