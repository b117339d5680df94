"""One case's conversation as the reference runs it (spec 3.3-3.5), as a small state machine.

A ``Conversation`` always knows its next request (or that it is done). The engine collects the
pending requests of many conversations, sends them as one batch, and feeds each response back with
``answer``; the conversation parses and scores it with the run's parse mode, applies the oracle
setting before the next turn, and keeps the record that ends up in results.jsonl.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chexpercept.answers import ParseMode
from chexpercept.case import Case, Turn
from chexpercept.results import CaseFailure, CaseResult, TurnResult, check_oracle, judge_turn
from chexpercept.templates import SYSTEM_MESSAGE
from chexpercept.usage import sum_usage

from .oracle import ORACLE_SEPARATOR, intervention
from .protocol import Message, Request, Response
from .provenance import now


class Conversation:
    """The state of one case: messages so far, per-turn records, and the pending request."""

    def __init__(self, case: Case, *, oracle: str, parse_mode: ParseMode = "reference", model: str = ""):
        self.case = case
        self.oracle = check_oracle(oracle)
        self.parse_mode = parse_mode
        #: model name given to the parser (GLM answer boxes are unwrapped for GLM models only)
        self.model = model
        self._turns: list[Turn] = case.turns
        self._position = 0
        self.messages: list[Message] = [Message("system", SYSTEM_MESSAGE)]
        self.records: list[TurnResult] = []
        self._correct: dict[str, bool] = {}
        #: task -> index in self.messages of that task's assistant answer
        self._answer_at: dict[str, int] = {}
        self._pending: Request | None = None
        #: the explicit oracle text prepended to the pending turn, if any
        self._pending_oracle_text: str | None = None
        #: set when a request failed: the conversation stops there, unfinished
        self.failure: CaseFailure | None = None
        self._prepare_next()

    @property
    def done(self) -> bool:
        """No more requests: every turn answered, or a request failed (see ``failure``)."""
        return self._pending is None

    @property
    def pending(self) -> Request:
        if self._pending is None:
            raise RuntimeError(f"{self.case.key_id}: conversation is finished")
        return self._pending

    def _record(self, task: str) -> TurnResult:
        for record in self.records:
            if record.task == task:
                return record
        raise KeyError(f"{self.case.key_id}: no answered turn {task!r} to patch")

    def _prepare_next(self) -> None:
        if self._position >= len(self._turns):
            self._pending = None
            return
        turn = self._turns[self._position]
        text = turn.text
        oracle_text = None
        if self.oracle != "none":
            action = intervention(self.case, turn.task, self._correct)
            if action is not None and self.oracle == "explicit":
                oracle_text = action.text
                text = action.text + ORACLE_SEPARATOR + text
            elif action is not None:
                for task, answer_text in action.patches.items():
                    at = self._answer_at[task]
                    self.messages[at] = replace(self.messages[at], text=answer_text)
                    self._record(task).patched_to = answer_text
        self.messages.append(Message("user", text, turn.images))
        self._pending_oracle_text = oracle_text
        self._pending = Request(key_id=self.case.key_id, messages=tuple(self.messages), turn=turn)

    def answer(self, response: Response) -> TurnResult | None:
        """Record the model's answer to the pending request and move to the next turn.

        A response with an ``error`` is no answer: the conversation stops, ``failure`` says why,
        and None is returned.
        """
        request = self.pending
        turn = request.turn
        if response.error is not None:
            self.failure = CaseFailure(
                key_id=self.case.key_id,
                lesion=self.case.lesion,
                path=self.case.path.value,
                task=turn.task,
                turn_index=self._position,
                error=response.error,
                time=now(),
            )
            self._pending = None
            return None
        self.messages.append(Message("assistant", response.text))
        self._answer_at[turn.task] = len(self.messages) - 1
        record = judge_turn(
            turn,
            response.text,
            mode=self.parse_mode,
            model=self.model,
            oracle_text=self._pending_oracle_text,
            usage=dict(response.usage),
            full_response=response.full_text,
            refusal=response.refusal,
        )
        self.records.append(record)
        self._correct[turn.task] = record.correct
        self._position += 1
        self._prepare_next()
        return record

    def result(self) -> CaseResult:
        if not self.done or self.failure is not None:
            raise RuntimeError(f"{self.case.key_id}: conversation is not finished")
        return CaseResult(
            key_id=self.case.key_id,
            lesion=self.case.lesion,
            path=self.case.path.value,
            oracle=self.oracle,
            turns=self.records,
            conversation=[m.as_record() for m in self.messages],
            usage=case_usage(self.records),
        )


def case_usage(records: list[TurnResult]) -> dict[str, Any]:
    """Token and cost totals of a case (empty when the backend reports no usage): a total is None
    when any turn's server did not report that figure, and ``unreported_calls`` counts those turns
    (chexpercept.usage)."""
    if not any(r.usage for r in records):
        return {}
    return {"num_calls": len(records), **sum_usage([r.usage or {} for r in records])}
