"""Per-case scoring: re-parse every raw response, judge every sub-question, gate the stages.

The result, ``CaseScores``, keeps per-case detail (parsed answer, status, correct) for reports and
per-case arrays (case x task, case x stage) that every aggregate, bootstrap and comparison reads,
so a number is computed from the same booleans wherever it appears.

Rules (paper section 2, spec 3.7 and 4.2):
- a stage passes when every sub-question of it is correct (Stage 3: expansion, contraction and
  revision result; Stage 4: the four attributes);
- End-to-End: a stage counts only if it and every earlier asked stage passed;
- Oracle-Passed: each stage on its own;
- depth: the number of asked stages passed End-to-End; cardiomegaly (no Stage 4) gets +1 on RR and
  RF when its last asked stage passed, so the maxima are RR 4, RF 3, LF 1 for every lesion
  (``depth_native`` leaves the +1 out, as the paper's per-lesion table does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from chexpercept.answers import PARSE_STATUSES, STATUS_UNPARSED, ParseMode, is_correct, parse_answer
from chexpercept.results import CaseResult, TurnResult
from chexpercept.vocab import (
    CARDIOMEGALY,
    LESIONS,
    PATHS,
    POINT_TASKS,
    STAGES,
    TASK_STAGE,
    TASKS,
    Path,
    parse_lesion,
    parse_path,
    route_tasks,
)

TASK_INDEX: dict[str, int] = {t: i for i, t in enumerate(TASKS)}
LESION_INDEX: dict[str, int] = {name: i for i, name in enumerate(LESIONS)}
PATH_INDEX: dict[Path, int] = {p: i for i, p in enumerate(PATHS)}
STATUS_INDEX: dict[str, int] = {s: i for i, s in enumerate(PARSE_STATUSES)}
#: stage (0-based column) of each task column
TASK_STAGE_COL = np.array([TASK_STAGE[t] - 1 for t in TASKS])
#: Stage 2 answer classes (paper Table 10)
STAGE2_CLASSES: tuple[str, ...] = ("yes", "no", "etc")


@dataclass(frozen=True)
class TurnScore:
    """One sub-question of one case, re-judged."""

    task: str
    #: option indices read from the raw response ([-1] when nothing could be read)
    indices: tuple[int, ...]
    status: str
    correct: bool
    gold: tuple[int, ...]
    #: what the run itself recorded (its own parse mode); used to check E2E exactness
    stored_correct: bool
    #: True when the record had no response for an asked turn (scored as wrong)
    missing: bool = False


@dataclass
class CaseScores:
    """Every case of one run, scored under one parse mode. Row i is ``key_ids[i]``."""

    mode: str
    key_ids: list[str]
    lesion: np.ndarray  # (n,) index into LESIONS
    path: np.ndarray  # (n,) index into PATHS
    task_asked: np.ndarray  # (n, 9) bool
    task_correct: np.ndarray  # (n, 9) bool
    task_status: np.ndarray  # (n, 9) index into PARSE_STATUSES, -1 when not asked
    task_refused: np.ndarray  # (n, 9) bool: the model or the service declined (refusal, content filter)
    stage_asked: np.ndarray  # (n, 4) bool
    stage_pass: np.ndarray  # (n, 4) bool, each stage on its own (Oracle-Passed)
    e2e: np.ndarray  # (n, 4) bool, gated (End-to-End)
    depth: np.ndarray  # (n,) float, with the cardiomegaly +1
    depth_native: np.ndarray  # (n,) float, without it
    stage2_class: np.ndarray  # (n,) 0 yes, 1 no, 2 etc, -1 when Stage 2 was not asked
    point_none: np.ndarray  # (n, 2) bool: expansion/contraction answer selects the None option
    point_count: np.ndarray  # (n, 2) distinct point options selected (None excluded)
    gold_none: np.ndarray  # (n, 2) bool
    gold_count: np.ndarray  # (n, 2)
    #: True where the run's own first failing stage comes no earlier than this mode's, i.e. the
    #: oracle had not yet changed the history when this mode's End-to-End chain stopped
    e2e_exact: np.ndarray  # (n,) bool
    turns: list[list[TurnScore]]

    def __len__(self) -> int:
        return len(self.key_ids)

    def case(self, i: int) -> dict:
        """Per-case detail as plain data (JSON-ready)."""
        stages = {}
        for s in range(4):
            if self.stage_asked[i, s]:
                stages[f"stage{s + 1}"] = {"pass": bool(self.stage_pass[i, s]), "e2e": bool(self.e2e[i, s])}
        return {
            "key_id": self.key_ids[i],
            "lesion": LESIONS[self.lesion[i]],
            "path": PATHS[self.path[i]].value,
            "stages": stages,
            "depth": float(self.depth[i]),
            "depth_native": float(self.depth_native[i]),
            "turns": [
                {
                    "task": t.task,
                    "parsed": list(t.indices),
                    "status": t.status,
                    "correct": t.correct,
                    "gold": list(t.gold),
                    **({"missing": True} if t.missing else {}),
                }
                for t in self.turns[i]
            ],
        }

    def cases(self) -> list[dict]:
        return [self.case(i) for i in range(len(self))]


def _stage_tasks(tasks: Iterable[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for t in tasks:
        out.setdefault(TASK_STAGE[t], []).append(t)
    return out


class _Judged:
    """The per-case (rows) and per-task (columns) arrays that ``score_records`` fills, turn by turn."""

    def __init__(self, n: int) -> None:
        self.lesion = np.zeros(n, np.int8)
        self.path = np.zeros(n, np.int8)
        self.asked = np.zeros((n, len(TASKS)), bool)
        self.correct = np.zeros((n, len(TASKS)), bool)
        self.stored = np.zeros((n, len(TASKS)), bool)
        self.status = np.full((n, len(TASKS)), -1, np.int8)
        self.refused = np.zeros((n, len(TASKS)), bool)
        self.stage2_class = np.full(n, -1, np.int8)
        self.point_none = np.zeros((n, 2), bool)
        self.point_count = np.zeros((n, 2), np.int16)
        self.gold_none = np.zeros((n, 2), bool)
        self.gold_count = np.zeros((n, 2), np.int16)
        self.detection_missing = np.zeros(n, bool)

    def missing(self, i: int, task: str) -> TurnScore:
        """Part of a stage missing (reference results): wrong."""
        self.status[i, TASK_INDEX[task]] = STATUS_INDEX[STATUS_UNPARSED]
        return TurnScore(task, (-1,), STATUS_UNPARSED, False, (), False, True)

    def judge(
        self, i: int, key: str, task: str, turn: TurnResult, *, mode: ParseMode, model: str
    ) -> TurnScore:
        """Re-parse one turn's raw response and judge it against the gold answer."""
        j = TASK_INDEX[task]
        if not turn.gold:
            raise ValueError(f"case {key}: task {task!r} has no gold answer")
        parsed = parse_answer(turn.parsed_text, mode=mode, none_index=turn.none_index, model=model)
        self.refused[i, j] = bool(turn.refusal)
        ok = is_correct(parsed, turn.gold, multi_select=turn.multi_select, mode=mode)
        self.correct[i, j] = ok
        self.stored[i, j] = bool(turn.correct)
        self.status[i, j] = STATUS_INDEX[parsed.status]
        if task == "contour_eval":
            if is_correct(parsed, (1,), multi_select=False, mode=mode):
                self.stage2_class[i] = 0
            elif is_correct(parsed, (2,), multi_select=False, mode=mode):
                self.stage2_class[i] = 1
            else:
                self.stage2_class[i] = 2
        elif task in POINT_TASKS:
            k = POINT_TASKS.index(task)
            none = turn.none_index or turn.n_options
            self.point_none[i, k] = none in parsed.indices
            self.point_count[i, k] = len(
                {x for x in parsed.indices if 1 <= x <= turn.n_options and x != none}
            )
            self.gold_none[i, k] = none in turn.gold
            self.gold_count[i, k] = len({x for x in turn.gold if x != none})
        return TurnScore(task, parsed.indices, parsed.status, ok, tuple(turn.gold), bool(turn.correct))


def _turns_by_task(rec: CaseResult, les: str, p: Path, expected: Sequence[str]) -> dict[str, TurnResult]:
    """The record's turns by task; an unknown, unexpected or repeated task is an error naming the case."""
    key = rec.key_id
    by_task = {}
    for t in rec.turns:
        if t.task not in TASK_INDEX:
            raise ValueError(f"case {key}: unknown task {t.task!r} in its turns")
        if t.task not in expected:
            raise ValueError(
                f"case {key}: task {t.task!r} is not asked on path {p.value} for {les} "
                f"(expected {', '.join(expected)})"
            )
        if t.task in by_task:
            raise ValueError(f"case {key}: task {t.task!r} appears twice")
        by_task[t.task] = t
    return by_task


def _score_case(
    i: int, rec: CaseResult, judged: _Judged, *, mode: ParseMode, model: str, allow_missing: bool
) -> list[TurnScore]:
    """Fill row i of ``judged`` from one record; its turns' scores in stage order."""
    key = rec.key_id
    try:
        les = parse_lesion(rec.lesion)
        p = parse_path(rec.path)
    except ValueError as e:
        raise ValueError(f"case {key}: {e}") from None
    judged.lesion[i] = LESION_INDEX[les]
    judged.path[i] = PATH_INDEX[p]
    expected = route_tasks(les, p)
    by_task = _turns_by_task(rec, les, p, expected)
    case_turns: list[TurnScore] = []
    for stage, stage_tasks in _stage_tasks(expected).items():
        present = [t for t in stage_tasks if t in by_task]
        if len(present) < len(stage_tasks):
            if not allow_missing:
                missing = [t for t in stage_tasks if t not in by_task]
                raise ValueError(
                    f"case {key}: no result for {', '.join(missing)} (asked on path {p.value}); "
                    "the results file is incomplete or was not written by this toolkit"
                )
            if not present:
                if stage == 1:
                    judged.detection_missing[i] = True
                continue
        for task in stage_tasks:
            judged.asked[i, TASK_INDEX[task]] = True
            turn = by_task.get(task)
            if turn is None:
                case_turns.append(judged.missing(i, task))
            else:
                case_turns.append(judged.judge(i, key, task, turn, mode=mode, model=model))
    return case_turns


def score_records(
    records: Sequence[CaseResult],
    *,
    mode: ParseMode = "reference",
    model: str = "",
    allow_missing: bool = False,
) -> CaseScores:
    """Re-parse and judge every turn of every record, then gate the stages.

    model: the model's name (reference parsing unwraps GLM's answer box only for GLM models).
    allow_missing: accept records that lack whole stages, with the reference analysis' meaning
    (spec 4.2): a missing stage is not counted and does not break the End-to-End chain; a missing
    detection counts as wrong but does not break the chain either. Without it (our runner always
    records every asked turn) a missing turn is an error naming the case.
    """
    judged = _Judged(len(records))
    key_ids: list[str] = []
    turns_out: list[list[TurnScore]] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        key = rec.key_id
        if key in seen:
            raise ValueError(f"case {key}: appears twice in the results")
        seen.add(key)
        key_ids.append(key)
        turns_out.append(_score_case(i, rec, judged, mode=mode, model=model, allow_missing=allow_missing))

    asked, missing = judged.asked, judged.detection_missing
    stage_asked, stage_pass, e2e, depth_native, depth = _gate(
        asked, judged.correct, missing, judged.lesion, judged.path
    )
    _, stored_pass = _stage_matrix(asked, judged.stored)
    e2e_exact = _first_break(stage_asked, stored_pass, missing) >= _first_break(
        stage_asked, stage_pass, missing
    )
    return CaseScores(
        mode=mode,
        key_ids=key_ids,
        lesion=judged.lesion,
        path=judged.path,
        task_asked=asked,
        task_correct=judged.correct,
        task_status=judged.status,
        task_refused=judged.refused,
        stage_asked=stage_asked,
        stage_pass=stage_pass,
        e2e=e2e,
        depth=depth,
        depth_native=depth_native,
        stage2_class=judged.stage2_class,
        point_none=judged.point_none,
        point_count=judged.point_count,
        gold_none=judged.gold_none,
        gold_count=judged.gold_count,
        e2e_exact=e2e_exact,
        turns=turns_out,
    )


def _stage_matrix(asked: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = asked.shape[0]
    stage_asked = np.zeros((n, 4), bool)
    stage_ok = np.ones((n, 4), bool)
    for s in range(4):
        cols = s == TASK_STAGE_COL
        stage_asked[:, s] = asked[:, cols].any(axis=1)
        stage_ok[:, s] = (correct[:, cols] | ~asked[:, cols]).all(axis=1)
    return stage_asked, stage_asked & stage_ok


def _breaks(stage_asked: np.ndarray, stage_pass: np.ndarray, detection_missing: np.ndarray) -> np.ndarray:
    breaks = stage_asked & ~stage_pass
    breaks[:, 0] &= ~detection_missing
    return breaks


def _first_break(
    stage_asked: np.ndarray, stage_pass: np.ndarray, detection_missing: np.ndarray
) -> np.ndarray:
    """0-based stage of the first chain-breaking failure; 4 when the chain never breaks."""
    breaks = _breaks(stage_asked, stage_pass, detection_missing)
    return np.where(breaks.any(axis=1), breaks.argmax(axis=1), len(STAGES))


def _gate(
    asked: np.ndarray,
    correct: np.ndarray,
    detection_missing: np.ndarray,
    lesion: np.ndarray,
    path: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    stage_asked, stage_pass = _stage_matrix(asked, correct)
    stage_asked[:, 0] |= detection_missing  # counted (as wrong) although nothing was stored
    breaks = _breaks(stage_asked, stage_pass, detection_missing)
    broken_before = np.zeros_like(breaks)
    broken_before[:, 1:] = np.logical_or.accumulate(breaks, axis=1)[:, :-1]
    e2e = stage_asked & stage_pass & ~broken_before
    depth_native = e2e.sum(axis=1).astype(float)
    # last asked stage of each case (every case asks Stage 1)
    last = 3 - np.argmax(stage_asked[:, ::-1], axis=1)
    last_passed = e2e[np.arange(len(last)), last]
    bonus = (lesion == LESION_INDEX[CARDIOMEGALY]) & (path != PATH_INDEX[Path.LF]) & last_passed
    return stage_asked, stage_pass, e2e, depth_native, depth_native + bonus
