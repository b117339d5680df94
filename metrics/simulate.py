"""Simulated runs: records with chosen right and wrong answers, for tests, benchmarks and power checks.

``fixture_cases`` builds format-valid cases in memory (the same entries as
``chexpercept.testing.write_fixture_bundle``, without writing images); ``simulate_records`` answers
each turn through a callback and writes realistic raw responses, so scoring re-parses real text.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from chexpercept.answers import is_correct, parse_answer
from chexpercept.case import Case, Turn
from chexpercept.results import CaseResult, TurnResult
from chexpercept.testing import fixture_entry
from chexpercept.vocab import LESIONS, PATHS, Path

#: a callback's answer: True (right), False (some wrong option), or the raw response text itself
Answer = bool | str
Responder = Callable[[Case, Turn], Answer]

_REASONING = (
    "Looking at the image, the opacity spans zone 3 and part of zone 4; about 1/3 of the lung is involved. "
    "The overlay at (512, 300) extends past the lesion border, so I compare each option in turn."
)


def fixture_cases(per_cell: int = 1, *, seed: int = 0, lesions: Sequence[str] = LESIONS) -> list[Case]:
    """``per_cell`` cases for every (lesion, path) cell, in memory (random but valid gold answers)."""
    rnd = random.Random(seed)
    cases = []
    for lesion in lesions:
        for path in PATHS:
            for i in range(per_cell):
                kind = "negative" if path is Path.LF else "positive"
                key_id = f"{lesion}_s{50000000 + len(cases):08d}_{kind}_{i}"
                cases.append(Case.from_entry(key_id, fixture_entry(key_id, path, rnd)))
    return cases


def answer_text(indices: Sequence[int], *, style: int = 0) -> str:
    """A response naming these options, in one of a few formats every parse mode reads the same way."""
    body = ",".join(str(i) for i in indices)
    if style == 1:
        return f"<think>{_REASONING}</think>\nAnswer: {body}"
    if style == 2:
        return f"The mask needs a careful look.\n\nAnswer: {body}"
    return f"Answer: {body}"


def wrong_indices(turn: Turn, rnd: random.Random) -> list[int]:
    """Some answer that is judged wrong for this turn."""
    n = len(turn.options)
    gold = set(turn.answer_index)
    if turn.multi_select:
        while True:
            k = rnd.randint(1, max(1, min(3, n)))
            pick = sorted(rnd.sample(range(1, n + 1), k))
            if set(pick) != gold:
                return pick
    others = [i for i in range(1, n + 1) if i not in gold]
    return [rnd.choice(others)]


def simulate_records(
    cases: Sequence[Case],
    respond: Responder,
    *,
    oracle: str = "implicit",
    seed: int = 0,
    mode: str = "reference",
) -> list[CaseResult]:
    """Answer every turn of every case through ``respond`` and record it as the runner would."""
    rnd = random.Random(seed)
    records = []
    for case in cases:
        turns = []
        for turn in case.turns:
            answer = respond(case, turn)
            if isinstance(answer, str):
                text = answer
            else:
                picked = list(turn.answer_index) if answer else wrong_indices(turn, rnd)
                text = answer_text(picked, style=rnd.randrange(3))
            parsed = parse_answer(text, mode=mode, none_index=turn.none_index)
            turns.append(
                TurnResult(
                    task=turn.task,
                    stage=turn.stage,
                    response=text,
                    parsed=list(parsed.indices),
                    parse_status=parsed.status,
                    gold=list(turn.answer_index),
                    correct=is_correct(parsed, turn.answer_index, multi_select=turn.multi_select, mode=mode),
                    n_options=len(turn.options),
                    multi_select=turn.multi_select,
                    none_index=turn.none_index,
                )
            )
        records.append(
            CaseResult(
                key_id=case.key_id, lesion=case.lesion, path=case.path.value, oracle=oracle, turns=turns
            )
        )
    return records
