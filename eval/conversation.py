"""One case's conversation as the reference runs it (spec 3.3-3.5): the public API for a loop of
your own, and the one implementation of routes, oracle settings and parsing that the runner, the
harness integrations (Inspect AI, lmms-eval) and ``chexpercept estimate`` all drive.

A ``Conversation`` always knows its next request (``pending``: the whole conversation so far, system
message first, then the new user turn with its images) or that it is done. Feed it the model's reply
(``answer``): it parses and judges the reply with the run's parse mode, applies the oracle setting
before the next turn (implicit: earlier wrong answers replaced by the gold ones in the history;
explicit: the oracle text put before the next question), and keeps the record that ends up in
results.jsonl (``result``). A loop of your own (docs/conversation.md)::

    from chexpercept.eval.conversation import conversations

    for conv in conversations("physionet.org/files/chexpercept/1.0.0", oracle="implicit"):
        while not conv.done:
            messages = conv.pending.chat_messages(images="data_url")  # OpenAI-style, as our runner sends
            reply = my_model(messages)                                # your model: the reply's text
            turn = conv.answer(reply)                                 # parsed, judged, oracle applied
            print(conv.case.key_id, turn.task, turn.parsed, turn.correct)
        records.append(conv.result())                                 # a results.jsonl record
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from chexpercept.answers import ParseMode
from chexpercept.case import Case, Turn
from chexpercept.eval.oracle import ORACLE_SEPARATOR, intervention
from chexpercept.eval.protocol import Message, Request, Response
from chexpercept.eval.runner.provenance import now
from chexpercept.results import CaseFailure, CaseResult, TurnResult, check_oracle, judge_turn
from chexpercept.templates import SYSTEM_MESSAGE
from chexpercept.usage import sum_usage


class Conversation:
    """The state of one case: messages so far, per-turn records, and the pending request."""

    def __init__(
        self,
        case: Case,
        *,
        oracle: str,
        parse_mode: ParseMode = "reference",
        model: str = "",
        root: str | os.PathLike[str] | None = None,
    ):
        """``case``: one case of a release (``chexpercept.bundle.read_bundle(DIR).cases``); ``root``:
        the release folder, which its requests' images are read from (``Request.chat_messages``)."""
        self.case = case
        self.root = root
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
        self._pending = Request(
            key_id=self.case.key_id,
            messages=tuple(self.messages),
            turn=turn,
            root=self.root,
            turns_after=len(self._turns) - self._position - 1,
        )

    @property
    def upcoming_images(self) -> tuple[str, ...]:
        """The images the turn after the pending one will add (none when it is the last), for a
        backend that prepares images ahead of need."""
        following = self._position + 1
        return tuple(self._turns[following].images) if following < len(self._turns) else ()

    @property
    def history(self) -> tuple[Message, ...]:
        """The conversation as the model will see it next: every message so far, oracle patches of
        the implicit setting applied (the pending request's messages, or the whole conversation
        once it is done)."""
        return tuple(self.messages)

    @property
    def responses(self) -> list[str]:
        """The raw reply of every turn answered so far (what ``evaluate``'s metric takes per case)."""
        return [r.response for r in self.records]

    def answer(self, response: Response | str) -> TurnResult | None:
        """Record the model's answer to the pending request and move to the next turn; returns the
        turn's record (``task``, ``parsed`` option indices, ``correct``, ``oracle_text``...).

        ``response``: the reply's text, or a ``Response`` (with usage, the whole reply where the
        text lost part of it, a refusal). A response with an ``error`` is no answer: the
        conversation stops, ``failure`` says why, and None is returned.
        """
        if isinstance(response, str):
            response = Response(response)
        if not isinstance(
            response, Response
        ):  # an SDK's message.content is None for a refusal or a tool call
            raise TypeError(
                f"case {self.case.key_id}: answer() takes the reply's text or a Response, got "
                f"{type(response).__name__} (a reply without text: Response('', {{}}, refusal=...) or error=...)"
            )
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


def conversations(
    data_dir: str | os.PathLike[str],
    *,
    oracle: str = "implicit",
    parse_mode: ParseMode = "reference",
    model: str = "",
    lesions: Sequence[str] | None = None,
    paths: Sequence[str] | None = None,
    key_ids: Iterable[str] | None = None,
) -> Iterator[Conversation]:
    """A new ``Conversation`` for every case of the release at ``data_dir`` (validated, images
    checked: exists, parses), in release order, optionally only ``lesions``, ``paths`` or
    ``key_ids``. ``oracle``: ``none``, ``implicit`` (the paper's Oracle-Passed runs; the default of
    the runner) or ``explicit``; ``parse_mode``: ``reference`` (the paper's numbers) or ``strict``;
    ``model``: the model's name, for the parser's per-family rules (GLM answer boxes).

    Raises BundleValidationError (naming the case and the file) for a release that is not one, and
    ValueError for a key_id that is not in it."""
    from chexpercept.bundle import read_bundle

    bundle = read_bundle(
        data_dir, lesions=list(lesions) if lesions else None, paths=list(paths) if paths else None
    )
    cases = bundle.cases
    if key_ids is not None:
        wanted = list(dict.fromkeys(key_ids))
        by_key = {c.key_id: c for c in cases}
        unknown = [k for k in wanted if k not in by_key]
        if unknown:
            raise ValueError(f"{len(unknown)} key_id(s) are not cases of {bundle.root} (e.g. {unknown[0]!r})")
        cases = [by_key[k] for k in wanted]
    for case in cases:
        yield Conversation(case, oracle=oracle, parse_mode=parse_mode, model=model, root=bundle.root)


def case_usage(records: list[TurnResult]) -> dict[str, Any]:
    """Token and cost totals of a case (empty when the backend reports no usage): a total is None
    when any turn's server did not report that figure, and ``unreported_calls`` counts those turns
    (chexpercept.usage)."""
    if not any(r.usage for r in records):
        return {}
    return {"num_calls": len(records), **sum_usage([r.usage or {} for r in records])}
