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
from chexpercept.results import CaseFailure, CaseResult

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
    #: answers that came back empty (no text, no reasoning, no refusal)
    empty: int = 0


def run_conversations(
    cases: Iterable[Case],
    backend: Backend,
    *,
    oracle: str,
    parse_mode: ParseMode = "reference",
    model: str = "",
    batch_size: int,
    on_finished: Callable[[list[CaseResult]], None],
    on_failed: Callable[[list[CaseFailure]], None] | None = None,
    on_empty: Callable[[int, int], None] | None = None,
) -> EngineStats:
    """Run every case to the end of its route; returns counts of what was sent.

    on_failed: gets the cases whose conversation stopped at a failed request (a response with an
    ``error``); without it such a failure raises BackendError. on_empty(empty, answered) gets the
    running counts after each step that had empty answers (many of them point at a setting, e.g. a
    server whose replies land outside the fields the backend reads).
    """
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
        empty = sum(1 for r in responses if not r.error and not r.text and not r.full_text and not r.refusal)
        stats.empty += empty
        if on_empty is not None and empty:
            on_empty(stats.empty, stats.requests + len(requests))
        stats.requests += len(requests)
        stats.steps += 1
        finished = [c for c in live if c.done]
        if finished:
            live = [c for c in live if not c.done]
            failed = [c.failure for c in finished if c.failure is not None]
            if failed:
                if on_failed is None:
                    raise BackendError(f"{failed[0].key_id} ({failed[0].task}): {failed[0].error}")
                on_failed(failed)
            done = [c.result() for c in finished if c.failure is None]
            if done:
                on_finished(done)
        if delay:
            time.sleep(delay)
    stats.seconds = time.perf_counter() - start
    return stats
