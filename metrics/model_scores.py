"""One model's scores: End-to-End and Oracle-Passed numbers, each from the run that measures it.

``score_model(runs)`` takes the runs of one model (any of oracle none / implicit / explicit) and
decides where each kind of number comes from:

- End-to-End: from the ``none`` run when there is one; otherwise from an oracle run whose decoding
  was greedy (both histories are identical up to the first error, so the gated chain is exact);
  otherwise it is N/A.
- Oracle-Passed (stage and sub-task accuracy, answer bias): from the ``implicit`` run, else the
  ``explicit`` one; N/A without an oracle run (a run without oracle measures something else).

The ``ModelScores`` it returns says which run each came from (``sources``) and lists everything worth knowing about the
inputs (``notes``): unfinished runs, missing run.json fields, cases missing from a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from chexpercept.answers import PARSE_STATUSES, STATUS_REASONING, STATUS_UNPARSED, ParseMode
from chexpercept.domains import LEVEL
from chexpercept.escape import terminal
from chexpercept.vocab import LESIONS, PATHS, TASKS

from .columns import FLAT_KEYS, Column, ColumnMatrix, add_derived, column_mean, e2e_columns, op_columns
from .inference import INTERVAL_METHOD
from .inference import intervals as design_intervals
from .partial import bundle_difference
from .runs import Run
from .scoring import TASK_INDEX, CaseScores, score_records
from .tables import nested_tables


@dataclass
class Source:
    """Where one kind of number (End-to-End or Oracle-Passed) comes from."""

    role: str
    oracle: str
    description: str
    path: str | None = None
    #: End-to-End from an oracle run: False when the parse mode makes some cases approximate
    exact: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "oracle": self.oracle,
            "description": self.description,
            "path": self.path,
            "exact": self.exact,
        }


@dataclass
class ModelScores:
    """Scores of one model (see the module docstring); ``values`` holds every metric, None = N/A."""

    name: str
    mode: str
    values: dict[str, float | None]
    sources: dict[str, Source | None]
    notes: list[str]
    counts: dict[str, Any]
    runs: list[dict[str, Any]]
    parse: dict[str, dict[str, Any]]
    matrix: ColumnMatrix
    scores: dict[str, CaseScores] = field(repr=False, default_factory=dict)
    fingerprint: str | None = None
    #: the bundle's images the runs were made on (``Run.images_fingerprint``), None where not recorded
    images_fingerprint: str | None = None
    intervals: dict[str, tuple[float, float] | None] | None = None
    level: float | None = None
    n_resamples: int | None = None
    #: why these numbers are not the whole of the runs scored ("<run>: <reason>"); empty when they
    #: are. Every writer of numbers says it (metrics/partial.py)
    partial: list[str] = field(default_factory=list)
    #: why these numbers are not the runs' own: an oracle run re-read in another parse mode than
    #: the one its oracle acted on (``run_parse_mode``); push-results refuses them
    not_own: list[str] = field(default_factory=list)

    @property
    def flat(self) -> dict[str, float | None]:
        """The stable flat metrics (FLAT_KEYS): fractions in [0, 1], depth in stages, None = N/A."""
        return {k: self.values.get(k) for k in FLAT_KEYS}

    def with_intervals(self, n_resamples: int = 0, *, seed: int = 0, level: float = 0.95) -> ModelScores:
        """Fill ``intervals`` with the design-based interval of every metric (metrics/inference.py:
        cases the unit, lesion x path cells the strata); returns self.

        n_resamples and seed are accepted for callers of the earlier bootstrap and not used: the
        intervals need no resampling (``n_resamples`` is recorded as 0).
        """
        LEVEL.require(level, "level")
        self.intervals = design_intervals(self.matrix, level=level)
        self.level, self.n_resamples = level, 0
        return self

    def tables(self) -> dict[str, Any]:
        return nested_tables(self.values)

    def source_lines(self) -> list[str]:
        out = []
        for role, label in (("e2e", "End-to-End"), ("op", "Oracle-Passed")):
            src = self.sources.get(role)
            out.append(f"{label}: {src.description if src else 'N/A'}")
        return out

    def to_dict(self, *, cases: bool = False) -> dict[str, Any]:
        """Everything as JSON-ready data: flat metrics, nested tables, intervals, sources, notes,
        parse rates and the warnings about unreadable answers (``answer_warnings``)."""
        from .answer_warnings import answer_warnings

        out: dict[str, Any] = {
            "name": self.name,
            "mode": self.mode,
            "flat": self.flat,
            "tables": self.tables(),
            "sources": {k: (v.as_dict() if v else None) for k, v in self.sources.items()},
            "notes": list(self.notes),
            "counts": self.counts,
            "runs": self.runs,
            "parse": self.parse,
            "warnings": [w.as_dict() for w in answer_warnings(self)],
            "fingerprint": self.fingerprint,
            "partial": list(self.partial),
        }
        if self.intervals is not None:
            out["intervals"] = {
                "level": self.level,
                "method": INTERVAL_METHOD,
                "unit": "case",
                "stratified_by": ["lesion", "path"],
                "values": {k: (list(v) if v else None) for k, v in self.intervals.items()},
            }
        if cases:
            out["cases"] = {setting: cs.cases() for setting, cs in self.scores.items()}
        return out


def said_once(items: Iterable[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """(line, subjects) for each distinct line of (subject, line) pairs, in first-seen order: what
    several models or runs share (a source, a note) is said once, naming them all."""
    subjects: dict[str, list[str]] = {}
    for subject, line in items:
        names = subjects.setdefault(line, [])
        if subject not in names:
            names.append(subject)
    return list(subjects.items())


def _cut_off(cs: CaseScores, run: Run) -> dict[str, dict[str, int]]:
    """Per task, the unread answers (``unparsed``, ``reasoning``) cut off before the answer: the
    server said so (``finish_reason`` ``length``: the budget, or the model's context, reached), or
    the reply used the run's whole token budget (recorded output tokens at --max-tokens). Before
    (red team, stop 48) only the second counted: a server that said "length" without a token count,
    or stopped at the context's end below the budget, was never counted."""
    limit = run.meta.sampling.max_tokens if run.meta.sampling else None
    out: dict[str, dict[str, int]] = {}
    row = {key: i for i, key in enumerate(cs.key_ids)}
    for rec in run.records:
        i = row.get(rec.key_id)
        if i is None:
            continue
        status = {t.task: t.status for t in cs.turns[i]}
        for turn in rec.turns:
            usage = turn.usage or {}
            tokens = usage.get("output_tokens")
            said = usage.get("finish_reason") == "length"
            spent = bool(limit and isinstance(tokens, int) and tokens >= limit)
            kind = status.get(turn.task)
            if kind in (STATUS_UNPARSED, STATUS_REASONING) and not turn.refusal and (said or spent):
                counts = out.setdefault(turn.task, {})
                counts[kind] = counts.get(kind, 0) + 1
    return out


def _parse_stats(cs: CaseScores, run: Run | None = None) -> dict[str, Any]:
    cut = _cut_off(cs, run) if run is not None else {}
    out: dict[str, Any] = {}
    for task in TASKS:
        j = TASK_INDEX[task]
        asked = cs.task_asked[:, j]
        n = int(asked.sum())
        if n == 0:
            continue
        codes = cs.task_status[asked, j]
        counts = np.bincount(codes[codes >= 0], minlength=len(PARSE_STATUSES))
        out[task] = {
            "n": n,
            "unparsed": float(counts[PARSE_STATUSES.index(STATUS_UNPARSED)] / n),
            "statuses": {s: float(c / n) for s, c in zip(PARSE_STATUSES, counts) if c},
            # counts, not shares: how many answers came from reasoning, how many were refused
            "from_reasoning": int(counts[PARSE_STATUSES.index(STATUS_REASONING)]),
            "refused": int(cs.task_refused[asked, j].sum()),
            # unread answers whose reply used the whole token budget, per status
            "at_token_limit": cut.get(task, {}),
        }
    return out


def _answer_notes(parse: Mapping[str, dict[str, Any]], mode: str) -> list[str]:
    """Notes counting, per run, the answers read from inside reasoning and the refusals."""
    notes = []
    for setting, stats in parse.items():
        for key, what in (
            (
                "from_reasoning",
                "answers were read from inside reasoning that never finished or that the reference's "
                "parser does not recognise (reference parsing keeps its value; strict parsing refuses them)",
            ),
            ("refused", "answers were refusals or content-filter rejections (scored as unparsed)"),
        ):
            per_task = {task: v[key] for task, v in stats.items() if v.get(key)}
            if per_task:
                detail = ", ".join(f"{task} {n}" for task, n in per_task.items())
                notes.append(
                    f"oracle {setting} run ({mode} parsing): {sum(per_task.values())} {what}: {detail}"
                )
    return notes


def _agreement(cs: CaseScores) -> float | None:
    """Share of turns whose verdict equals the one the run stored (same mode: should be 1.0)."""
    verdicts = [(t.correct, t.stored_correct) for turns in cs.turns for t in turns if not t.missing]
    if not verdicts:
        return None
    return sum(a == b for a, b in verdicts) / len(verdicts)


def run_parse_mode(runs: Sequence[Run], asked: ParseMode | None) -> tuple[ParseMode, list[str]]:
    """The one rule of the parse mode runs are scored with: ``asked`` (``--parse-mode``) when given;
    else the one mode every run was made with (``Run.parse_mode``), else reference. Returns the mode
    and a WARNING for each
    oracle run re-read in another mode than the one its oracle acted on: its End-to-End and
    Oracle-Passed numbers are then not the run's own (the oracle changed histories on answers the
    other parser reads otherwise). ValueError when ``asked`` is None and the runs recorded different
    modes. Before (red team, stop 48): a strict run was scored, reported and published with
    reference parsing by default, End-to-End 0.0 read as 66.7, with a note."""
    # every run's (round 2: a model made with strict parsing and no oracle run was read with another
    # model's mode in one report)
    made = {r.parse_mode for r in runs if r.parse_mode}
    if asked is None:
        if len(made) > 1:
            listed = ", ".join(f"{r.label}: {r.parse_mode}" for r in runs if r.parse_mode)
            raise ValueError(
                f"the runs were made with different parse modes ({terminal(listed)}): score them "
                "separately, or choose one with --parse-mode (runs made with another are then not "
                "scored as made)"
            )
        return cast(ParseMode, made.pop() if made else "reference"), []
    warnings = [
        f"WARNING: {r.label}: its oracle acted on {r.parse_mode} parsing; scored here with {asked} "
        f"parsing (--parse-mode overrides what the run recorded): these are not the run's own numbers "
        f"(leave --parse-mode out to score it as made)"
        for r in runs
        if r.oracle != "none" and r.parse_mode and r.parse_mode != asked
    ]
    return asked, warnings


def score_model(
    runs: Sequence[Run],
    *,
    mode: ParseMode | None = None,
    name: str | None = None,
    scores: Mapping[str, CaseScores] | None = None,
) -> ModelScores:
    """Score the runs of one model and assemble its scores (see the module docstring).

    mode: the parse mode (``run_parse_mode``: None, the default, is the mode the runs were made
    with). scores: per oracle setting, scores already computed for that run under that mode (for
    example a per-run ModelScores' ``scores``); those runs are not scored again.
    """
    known = scores or {}
    if not runs:
        raise ValueError("no runs to score")
    by_setting = _by_setting(runs)
    mode, not_own = run_parse_mode(runs, mode)
    notes: list[str] = [n for r in runs for n in r.notes] + not_own
    scores = {
        s: known[s]
        if s in known
        else score_records(r.records, mode=mode, model=r.model, allow_missing=r.allow_missing)
        for s, r in by_setting.items()
    }

    oracle_run = by_setting.get("implicit") or by_setting.get("explicit")
    if "implicit" in by_setting and "explicit" in by_setting:
        notes.append(
            "both implicit and explicit runs given; Oracle-Passed numbers come from the implicit one"
        )
    sources, e2e_run = _choose_sources(by_setting.get("none"), oracle_run, scores, mode, notes)

    op_scores = scores[oracle_run.oracle] if oracle_run is not None else None
    e2e_scores = scores[e2e_run.oracle] if e2e_run is not None else None
    matrix, values = _assemble(e2e_scores, op_scores)
    if e2e_scores is not None and op_scores is not None and e2e_run is not oracle_run:
        only_e2e = set(e2e_scores.key_ids) - set(op_scores.key_ids)
        only_op = set(op_scores.key_ids) - set(e2e_scores.key_ids)
        if only_e2e or only_op:
            notes.append(
                f"the runs cover different cases: {len(only_e2e)} only in the End-to-End run, "
                f"{len(only_op)} only in the Oracle-Passed run"
            )

    counts = _counts(matrix, e2e_scores, op_scores)
    counts["unfinished_cases"] = {r.oracle: len(r.failed) for r in runs if r.failed}
    parse = {s: _parse_stats(cs, by_setting[s]) for s, cs in scores.items()}
    notes += _answer_notes(parse, mode)
    model_name = name or next((r.model for r in runs if r.model), "") or "model"
    return ModelScores(
        name=model_name,
        mode=mode,
        values=values,
        sources=sources,
        notes=notes,
        counts=counts,
        runs=_run_rows(by_setting, scores),
        parse=parse,
        matrix=matrix,
        scores=scores,
        fingerprint=next(iter({r.fingerprint for r in runs if r.fingerprint}), None),
        images_fingerprint=next(iter({r.images_fingerprint for r in runs if r.images_fingerprint}), None),
        partial=[reason for r in runs for reason in r.partial],
        not_own=not_own,
    )


def _by_setting(runs: Sequence[Run]) -> dict[str, Run]:
    """The runs by oracle setting: one run per setting, all made on one bundle."""
    by_setting: dict[str, Run] = {}
    for run in runs:
        if run.oracle in by_setting:
            raise ValueError(
                f"two oracle {run.oracle} runs given ({by_setting[run.oracle].path} and {run.path}); "
                "score them separately or compare them"
            )
        by_setting[run.oracle] = run
    differ = bundle_difference({run.label: run for run in runs})
    if differ:
        raise ValueError(f"the runs were made on {differ}")
    return by_setting


def _choose_sources(
    none_run: Run | None,
    oracle_run: Run | None,
    scores: Mapping[str, CaseScores],
    mode: str,
    notes: list[str],
) -> tuple[dict[str, Source | None], Run | None]:
    """(where End-to-End and Oracle-Passed numbers come from, the End-to-End run); appends notes."""
    sources: dict[str, Source | None] = {"e2e": None, "op": None}
    if oracle_run is not None:
        sources["op"] = Source("op", oracle_run.oracle, f"oracle {oracle_run.oracle} run", _p(oracle_run))
    else:
        notes.append("Oracle-Passed numbers are N/A: no implicit or explicit oracle run was given")
    e2e_run: Run | None = None
    if none_run is not None:
        e2e_run = none_run
        sources["e2e"] = Source("e2e", "none", "oracle none run", _p(none_run))
    elif oracle_run is not None and oracle_run.greedy:
        e2e_run = oracle_run
        cs = scores[oracle_run.oracle]
        exact = bool(cs.e2e_exact.all())
        desc = (
            f"oracle {oracle_run.oracle} run with greedy decoding "
            "(exact: histories are identical up to the first error)"
        )
        if not exact:
            k = int((~cs.e2e_exact).sum())
            desc = f"oracle {oracle_run.oracle} run with greedy decoding (approximate for {k} of {len(cs)} cases)"
            notes.append(
                f"End-to-End from the {oracle_run.label}: for {k} cases the oracle changed the history before "
                f"the {mode}-mode chain stopped (the run parsed in {oracle_run.parse_mode} mode); "
                "score an oracle none run for exact numbers"
            )
        sources["e2e"] = Source("e2e", oracle_run.oracle, desc, _p(oracle_run), exact)
    elif oracle_run is not None:
        why = "was sampled" if oracle_run.greedy is False else "has unknown decoding"
        notes.append(
            f"End-to-End numbers are N/A: the {oracle_run.label} {why}, so its gated chain is not the "
            "End-to-End result; run with --oracle none (or, if decoding was greedy, score with --greedy: "
            "chexpercept score and report take it)"
        )
    return sources, e2e_run


def _run_rows(by_setting: Mapping[str, Run], scores: Mapping[str, CaseScores]) -> list[dict[str, Any]]:
    rows = []
    for s, r in by_setting.items():
        row = {
            "oracle": r.oracle,
            "kind": r.kind,
            "path": _p(r),
            "model": r.model,
            "cases": len(r.records),
            "greedy": r.greedy,
            "parse_mode": r.parse_mode,
            "max_tokens": r.meta.sampling.max_tokens if r.meta.sampling else None,
            "verdict_agreement": _agreement(scores[s]),
        }
        estimate = getattr(r.meta, "estimate", None)
        if estimate:  # tokens and cost estimated beside those the API reported (eval/estimate/count.py)
            row["usage"] = estimate
        rows.append(row)
    return rows


def _p(run: Run) -> str | None:
    return str(run.path) if run.path else None


_EMPTY: CaseScores | None = None


def _empty_scores() -> CaseScores:
    global _EMPTY
    if _EMPTY is None:
        _EMPTY = score_records([])
    return _EMPTY


def _assemble(e2e: CaseScores | None, op: CaseScores | None) -> tuple[ColumnMatrix, dict[str, float | None]]:
    parts = [(e2e_columns, e2e), (op_columns, op)]
    keys = sorted({k for _, cs in parts if cs is not None for k in cs.key_ids})
    row = {k: i for i, k in enumerate(keys)}
    n = len(keys)
    strata = np.full(n, -1, np.int16)
    columns: dict[str, Column] = {}
    for make, cs in parts:
        if cs is None:
            for name in make(_empty_scores()):
                columns[name] = (np.zeros(n), np.zeros(n, bool))
            continue
        rows = np.array([row[k] for k in cs.key_ids], dtype=np.int64)
        stratum = cs.lesion.astype(np.int16) * len(PATHS) + cs.path
        clash = (strata[rows] >= 0) & (strata[rows] != stratum)
        if clash.any():
            key = cs.key_ids[int(np.argmax(clash))]
            raise ValueError(f"case {key}: lesion or path differs between the runs")
        strata[rows] = stratum
        for name, (v, a) in make(cs).items():
            values = np.zeros(n)
            applies = np.zeros(n, bool)
            values[rows] = v
            applies[rows] = a
            columns[name] = (values, applies)
    names = list(columns)
    applies = np.stack([columns[k][1] for k in names], axis=1) if names else np.zeros((n, 0), bool)
    weighted = np.stack([columns[k][0] for k in names], axis=1) * applies
    values = add_derived({k: column_mean(*columns[k]) for k in names})
    return ColumnMatrix(keys, strata, names, weighted, applies), values


def _counts(matrix: ColumnMatrix, e2e: CaseScores | None, op: CaseScores | None) -> dict[str, Any]:
    lesion = matrix.strata // len(PATHS)
    path = matrix.strata % len(PATHS)
    return {
        "cases": len(matrix.key_ids),
        "per_path": {p.value: int((path == i).sum()) for i, p in enumerate(PATHS)},
        "per_lesion": {name: int((lesion == i).sum()) for i, name in enumerate(LESIONS)},
        "end_to_end_cases": len(e2e) if e2e is not None else 0,
        "oracle_passed_cases": len(op) if op is not None else 0,
    }
