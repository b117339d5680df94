"""The scheduler on its own: conversations never wait for each other (issue 22), with backends that
answer in an order the test chooses."""

from __future__ import annotations

from collections import deque

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.baselines import BaselineBackend
from chexpercept.eval.engine import admission_order, route_length, run_conversations
from chexpercept.eval.protocol import BackendError, Response, RunContext, answer_all


class OneAtATime:
    """Answers one request per ``completed`` call, the oldest first (or the newest: ``lifo``), and
    logs what the engine does: ("submit", request id) and ("answer", request id)."""

    name = "one-at-a-time"

    def __init__(self, lifo: bool = False):
        self.lifo = lifo
        self.in_flight: deque = deque()
        self.log: list[tuple[str, str]] = []
        self.released: list[str] = []
        self.most_cases = 0

    def submit(self, requests):
        for r in requests:
            self.log.append(("submit", r.request_id))
            self.in_flight.append(r)
        self.most_cases = max(self.most_cases, len({r.key_id for r in self.in_flight}))

    def completed(self):
        request = self.in_flight.pop() if self.lifo else self.in_flight.popleft()
        self.log.append(("answer", request.request_id))
        return [(request, Response("Answer: 1"))]

    def release(self, key_ids):
        self.released.extend(key_ids)


def test_an_answered_conversation_asks_its_next_turn_at_once(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    backend = OneAtATime()
    finished = []
    run_conversations(
        bundle.cases,
        backend,
        oracle="implicit",
        batch_size=8,
        on_finished=lambda results: finished.append([r.key_id for r in results]),
    )
    log = backend.log
    # right after each answer, that conversation's next turn is handed over (before any other answer)
    for i, (what, request_id) in enumerate(log[:-1]):
        if what != "answer":
            continue
        key = request_id.split("/")[0]
        case = next(c for c in bundle.cases if c.key_id == key)
        asked = [e for e in log[: i + 1] if e[0] == "answer" and e[1].startswith(key + "/")]
        if len(asked) < len(case.turns):
            assert log[i + 1][0] == "submit" and log[i + 1][1].startswith(key + "/")
    # each case is handed to on_finished (the result store) as soon as it finishes, alone
    assert sorted(k for batch in finished for k in batch) == sorted(c.key_id for c in bundle.cases)
    assert all(len(batch) == 1 for batch in finished)
    assert sorted(backend.released) == sorted(c.key_id for c in bundle.cases)


def test_at_most_batch_size_live_and_a_freed_slot_goes_to_the_next_case_at_once(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    backend = OneAtATime(lifo=True)
    order = admission_order(bundle.cases)
    stats = run_conversations(
        order, backend, oracle="implicit", batch_size=3, on_finished=lambda results: None
    )
    assert backend.most_cases == stats.max_live == 3
    log = backend.log
    # cases are admitted in the order given (the runner gives admission_order's)
    first_turns = {c.key_id + "/" + c.turns[0].task: i for i, c in enumerate(order)}
    admitted = [rid for what, rid in log if what == "submit" and rid in first_turns]
    assert admitted == [c.key_id + "/" + c.turns[0].task for c in order]
    for i, (what, rid) in enumerate(log):
        if what == "submit" and rid in first_turns and first_turns[rid] >= 3:
            assert log[i - 1][0] in ("answer", "submit")
    assert stats.requests == sum(len(c.turns) for c in bundle.cases) == stats.answered


def test_the_longest_routes_are_admitted_first(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    order = admission_order(bundle.cases)
    lengths = [route_length(c) for c in order]
    assert lengths == sorted(lengths, reverse=True)
    assert order[0].path.value == "RR" and [c.path.value for c in order[-7:]] == ["LF"] * 7
    # ties keep the given order
    rr = [c.key_id for c in bundle.cases if c.path.value == "RR" and route_length(c) == lengths[0]]
    assert [c.key_id for c in order if c.key_id in rr] == rr


def test_step_scheduling_waits_for_every_answer_of_the_step(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    for schedule, waits in (("step", True), ("continuous", False)):
        backend = OneAtATime()
        run_conversations(
            bundle.cases,
            backend,
            oracle="implicit",
            batch_size=8,
            on_finished=lambda r: None,
            schedule=schedule,
        )
        # a turn handed over while others of the step are still unanswered
        in_flight, eager = 0, 0
        for i, (what, _) in enumerate(backend.log):
            if what == "submit":
                eager += in_flight > 0 and backend.log[i - 1][0] == "answer"
                in_flight += 1
            else:
                in_flight -= 1
        assert (eager == 0) is waits


def test_a_backend_answering_a_request_nobody_waits_for_is_an_error(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["LF"])

    class Confused(OneAtATime):
        def completed(self):
            ((request, response),) = super().completed()
            return [(request, response), (request, response)]

    with pytest.raises(BackendError, match="not waiting for an answer"):
        run_conversations(
            bundle.cases, Confused(), oracle="implicit", batch_size=2, on_finished=lambda r: None
        )


def test_answer_all_and_a_generate_only_backend(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    baseline = BaselineBackend("baseline:oracle")
    baseline.setup(RunContext(root=bundle.root, cases=bundle.cases))

    class GenerateOnly:  # an object with generate only (the pre-issue-22 interface) still runs
        name = "old"

        def generate(self, requests):
            return baseline.generate(requests)

    results = []
    run_conversations(
        bundle.cases, GenerateOnly(), oracle="implicit", batch_size=4, on_finished=results.extend
    )
    assert len(results) == len(bundle.cases) and all(t.correct for r in results for t in r.turns)
    from chexpercept.eval.conversation import Conversation

    requests = [Conversation(c, oracle="none").pending for c in bundle.cases]
    assert [r.text for r in answer_all(baseline, requests)] == [r.text for r in baseline.generate(requests)]
