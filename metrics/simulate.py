"""Simulated runs: records with chosen right and wrong answers, for tests, benchmarks and power checks.

``fixture_cases`` builds format-valid cases in memory (the same entries as
``chexpercept.testing.write_fixture_bundle``, without writing images); ``simulate_records`` answers
each turn through a callback and writes realistic raw responses, so scoring re-parses real text.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence

from chexpercept.case import Case, Turn
from chexpercept.results import CaseResult, judge_turn
from chexpercept.templates import LOCATION_NONE
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
            turns.append(judge_turn(turn, text, mode=mode))
        records.append(
            CaseResult(
                key_id=case.key_id, lesion=case.lesion, path=case.path.value, oracle=oracle, turns=turns
            )
        )
    return records


#: options and gold answers of hand-built records (``hand_record``): the shapes of the real questions
HAND_OPTIONS: dict[str, tuple[str, ...]] = {
    "detection": ("Yes", "No"),
    "contour_eval": ("Yes", "No"),
    "expansion": ("red point", "orange point", "yellow point", "None"),
    "contraction": ("red point", "orange point", "yellow point", "None"),
    "revision_result": ("1st mask", "2nd mask", "3rd mask", "4th mask"),
    "distribution": ("1 zone", "2 zones", "3 zones", "4 zones or more"),
    "location": ("region a", "region b", "region c", LOCATION_NONE),
    "severity": ("< 1/3", "1/3 - 2/3", ">= 2/3"),
    "comparison": ("single lung", "similar", "right larger", "left larger"),
}
HAND_GOLD: dict[str, tuple[int, ...]] = {
    "expansion": (1, 3),
    "contraction": (4,),
    "revision_result": (2,),
    "distribution": (2,),
    "location": (1, 2),
    "severity": (1,),
    "comparison": (3,),
}


def hand_record(
    lesion: str,
    path: str,
    answers: dict[str, Answer] | None = None,
    *,
    key_id: str | None = None,
    oracle: str = "none",
    gold: dict[str, Sequence[int]] | None = None,
    default: Answer = True,
    skip: Sequence[str] = (),
) -> CaseResult:
    """A record with chosen answers per task (True right, False wrong, or raw text); others ``default``.

    Gold answers: detection Yes except LF, contour evaluation Yes on RR, the rest from HAND_GOLD
    (overridable through ``gold``). Tasks in ``skip`` are left out of the record.
    """
    from chexpercept.vocab import MULTI_SELECT_TASKS, TASK_STAGE, parse_path, route_tasks

    p = parse_path(path)
    answers = answers or {}
    gold = dict(gold or {})
    key_id = key_id or f"{lesion}_s{zlib.crc32(f'{lesion}/{p.value}'.encode()) % 10**8:08d}_hand_0"
    rnd = random.Random(key_id)
    turns = []
    for task in route_tasks(lesion, p):
        if task in skip:
            continue
        if task == "detection":
            g = tuple(gold.get(task, (2,) if p is Path.LF else (1,)))
        elif task == "contour_eval":
            g = tuple(gold.get(task, (1,) if p is Path.RR else (2,)))
        else:
            g = tuple(gold.get(task, HAND_GOLD[task]))
        options = HAND_OPTIONS[task]
        multi = task in MULTI_SELECT_TASKS
        turn = Turn(TASK_STAGE[task], task, "", (), options, g, "", multi)
        answer = answers.get(task, default)
        if isinstance(answer, str):
            text = answer
        else:
            text = answer_text(list(g) if answer else wrong_indices(turn, rnd))
        turns.append(judge_turn(turn, text))
    return CaseResult(key_id=key_id, lesion=lesion, path=p.value, oracle=oracle, turns=turns)
