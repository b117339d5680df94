"""One call from a path on disk to a model's scores (ModelScores), with an optional check against the release bundle."""

from __future__ import annotations

import os

from chexpercept.answers import ParseMode
from chexpercept.bundle import Bundle

from .discovery import load_runs
from .model_scores import ModelScores, score_model
from .runs import Run, check_answer_key, open_bundle


def score_path(
    path: str | os.PathLike[str],
    *,
    bundle: Bundle | str | os.PathLike[str] | None = None,
    mode: ParseMode | None = None,
    oracle: str | None = None,
    greedy: bool | None = None,
    model: str | None = None,
    missing: str = "wrong",
    name: str | None = None,
) -> ModelScores:
    """Load every run under PATH (see ``load_runs``) and score the model.

    With ``bundle``, our runs are also checked against it: a gold answer that differs is an error
    (the run was made on another release) and cases of the bundle without a result are noted.
    """
    b = open_bundle(bundle)
    runs = load_runs(path, bundle=b, oracle=oracle, greedy=greedy, model=model, missing=missing)
    if b is not None:
        for run in runs:
            if run.kind == "chexpercept":
                run.notes.extend(check_against_bundle(run, b))
    return score_model(runs, mode=mode, name=name)


def check_against_bundle(run: Run, bundle: Bundle) -> list[str]:
    """Notes on coverage; raises when a record's gold answers or route disagree with the bundle
    (``check_answer_key``)."""
    check_answer_key(run, bundle)
    cases = {c.key_id: c for c in bundle.cases}
    notes = []
    if run.fingerprint and run.fingerprint != bundle.fingerprint():
        notes.append(
            f"{run.label}: its bundle fingerprint differs from the bundle's at {bundle.root} "
            "(chexpercept.json changed); the gold answers of its cases agree"
        )
    missing = len(cases) - len({r.key_id for r in run.records})
    if missing:
        notes.append(f"{run.label}: {missing} of the bundle's {len(cases)} cases have no result")
    return notes


def print_model_scores(
    model_dir: str | os.PathLike[str], name: str, parse_mode: ParseMode | None = None
) -> None:
    """Score every run of a model folder (e.g. oracle_none and oracle_implicit) and print its Table 2
    row, where each number comes from, notes and answer warnings (the end of ``chexpercept run``)."""
    import sys

    from chexpercept.escape import shell_word, terminal

    from .answer_warnings import warning_lines
    from .tables import render_table

    report = score_path(model_dir, mode=parse_mode)
    print()
    print(render_table(2, {name: report}))
    for kind, source in report.sources.items():
        where = source.description if source is not None else "no run measures it yet (N/A)"
        print(f"{kind.upper()} from: {where}")
    for note in report.notes:
        print(f"note: {terminal(note)}", file=sys.stderr)
    for line in warning_lines(report):
        print(line, file=sys.stderr)
    print(f"all numbers: chexpercept score {shell_word(model_dir)} --details")
