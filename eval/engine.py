"""The scheduler: many conversations live at once, each asked its next turn as soon as its answer is in.

At most ``batch_size`` conversations are live. The engine hands every pending turn to the backend as
it arises (``Backend.submit``) and takes the answers as they complete (``Backend.completed``): an
answered conversation's next turn goes to the backend at once, without waiting for the other live
conversations, and a finished conversation's slot goes to the next case at once. Finished cases are
handed to ``on_finished`` (which appends them to the result store) as soon as they finish, so a crash
loses at most the cases that were live.

How a backend batches what it holds is its own affair: vLLM adds each request to its running engine
(continuous batching), the openai backend sends each at once within its in-flight limit, and a
backend that answers a batch at a time (transformers, the baselines) answers everything handed over
since it was last free; while it works every other live conversation waits, so that is every live
conversation, as before.

Admission order (``admission_order``): the longest routes first. The run's span cannot be shorter
than its longest conversation's chain of answers; a long route admitted last runs alone at the end
while the engine idles, so cases are admitted by route length, longest first (the classic
longest-processing-time rule), and the short ones fill the tail.

``schedule="step"`` is the earlier scheduler: every live conversation advances one turn, and none goes
on until the slowest answer of the step is in. Under greedy decoding it gives the same answers; it is
kept as the baseline of bench/runner_schedule.py. The reference runs one conversation and one request
at a time (spec 7.1 item 4).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from chexpercept.answers import ParseMode
from chexpercept.case import Case
from chexpercept.domains import COUNT
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import Backend, BackendError, Completion, Request, streaming
from chexpercept.results import CaseFailure, CaseResult

#: seconds to sleep after each round; only for tests that kill a run part-way through
_STEP_DELAY_ENV = "CHEXPERCEPT_TEST_STEP_DELAY"
SCHEDULES: tuple[str, ...] = ("continuous", "step")


@dataclass
class EngineStats:
    #: model calls (one per turn asked)
    requests: int = 0
    #: answers received (failed requests included)
    answered: int = 0
    #: rounds: each time the backend handed back answers (schedule "step": one per step)
    rounds: int = 0
    seconds: float = 0.0
    #: answers that came back empty (no text, no reasoning, no refusal)
    empty: int = 0
    #: conversations that stopped at a failed request
    failed: int = 0
    #: the most conversations live at once
    max_live: int = 0


class ConversationFailed(BackendError):
    """A request failed and the run stops there (``on_failed`` not given: --on-error stop)."""

    def __init__(self, failure: CaseFailure, live: int):
        super().__init__(f"{failure.key_id} ({failure.task}): {failure.error}")
        self.failure = failure
        #: conversations that were still live (they are not saved; a rerun asks them again)
        self.live = live


def _test_delay() -> float:
    """Seconds to sleep after each round (tests only): ``CHEXPERCEPT_TEST_STEP_DELAY=S``, or ``S@R``
    for the process of rank R alone (a slow process of an accelerate run)."""
    value, _, rank = (os.environ.get(_STEP_DELAY_ENV) or "0").partition("@")
    if rank and rank != os.environ.get("RANK", "0"):
        return 0.0
    return float(value or 0)


def route_length(case: Case) -> tuple[int, int]:
    """(turns, images) of a case's route: how long its conversation is, before any answer."""
    turns = case.turns
    return len(turns), sum(len(t.images) for t in turns)


def admission_order(cases: Iterable[Case]) -> list[Case]:
    """``cases`` in the order the engine should admit them: longest routes first (most turns, then
    most images), ties in the given order."""
    return sorted(cases, key=lambda c: tuple(-n for n in route_length(c)))


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
    schedule: str = "continuous",
) -> EngineStats:
    """Run every case to the end of its route, admitting them in the given order (each one taken from
    ``cases`` only when a slot is free); returns counts.

    backend: a ``Backend`` (an object with only ``generate`` is answered a batch at a time).
    on_failed: gets the cases whose conversation stopped at a failed request (a response with an
    ``error``); without it such a failure raises ConversationFailed. on_empty(empty, answered) gets
    the running counts after each round that had empty answers (many of them point at a setting,
    e.g. a server whose replies land outside the fields the backend reads).
    """
    COUNT.require(batch_size, "batch_size")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    backend = streaming(backend)
    delay = _test_delay()
    #: taken one at a time when a slot is free: ``cases`` may be a shared queue (eval/runner/work_queue.py)
    queue = iter(cases)
    #: request id -> the conversation waiting for that request's answer
    waiting: dict[str, Conversation] = {}
    stats = EngineStats()
    start = time.perf_counter()

    def admit() -> list[Request]:
        new = []
        while len(waiting) < batch_size and (case := next(queue, None)) is not None:
            conversation = Conversation(case, oracle=oracle, parse_mode=parse_mode, model=model)
            waiting[conversation.pending.request_id] = conversation
            new.append(conversation.pending)
        stats.max_live = max(stats.max_live, len(waiting))
        return new

    prefetch = getattr(backend, "prefetch", None)

    def submit(requests: list[Request]) -> None:
        if requests:
            stats.requests += len(requests)
            backend.submit(requests)
            if callable(prefetch):  # what these conversations' next turns will show
                prefetch([i for r in requests for i in waiting[r.request_id].upcoming_images])

    submit(admit())
    while waiting:
        answers = _answers(backend, len(waiting) if schedule == "step" else 1)
        stats.rounds += 1
        stats.answered += len(answers)
        finished: list[Conversation] = []
        next_turns: list[Request] = []
        for request, response in answers:
            conversation = waiting.pop(request.request_id, None)
            if conversation is None:
                raise BackendError(
                    f"backend {backend.name!r} answered {request.request_id}, which is not waiting for an answer"
                )
            conversation.answer(response)
            if conversation.done:
                finished.append(conversation)
            else:
                waiting[conversation.pending.request_id] = conversation
                next_turns.append(conversation.pending)
        empty = sum(1 for _, r in answers if not r.error and not r.text and not r.full_text and not r.refusal)
        stats.empty += empty
        if on_empty is not None and empty:
            on_empty(stats.empty, stats.answered)
        if finished:
            backend.release([c.case.key_id for c in finished])
            _hand_over(finished, on_finished, on_failed, stats, live=len(waiting))
        submit(next_turns + admit())
        if delay:
            time.sleep(delay)
    stats.seconds = time.perf_counter() - start
    return stats


def _answers(backend: Backend, at_least: int) -> list[Completion]:
    """The next answers: those ready now, or (schedule "step") every answer of the step."""
    answers = backend.completed()
    while len(answers) < at_least:
        answers += backend.completed()
    return answers


def _hand_over(
    finished: Sequence[Conversation],
    on_finished: Callable[[list[CaseResult]], None],
    on_failed: Callable[[list[CaseFailure]], None] | None,
    stats: EngineStats,
    *,
    live: int,
) -> None:
    """Finished cases to on_finished, failed ones to on_failed (or ConversationFailed, after the
    finished ones are handed over)."""
    done = [c.result() for c in finished if c.failure is None]
    failed = [c.failure for c in finished if c.failure is not None]
    if done:
        on_finished(done)
    if failed:
        stats.failed += len(failed)
        if on_failed is None:
            raise ConversationFailed(failed[0], live)
        on_failed(failed)
