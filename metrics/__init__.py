"""Scoring CheXpercept runs: stage accuracy, depth, sub-tasks, answer bias, intervals, tables.

Installed as ``chexpercept.metrics``. Imports are lazy and light (numpy; no torch, no datasets
until the evaluate module is used). The public API:

Loading results
    ``load_runs(path, bundle=None, oracle=None, greedy=None, model=None, missing="wrong") -> [Run]``
        our run folder ``OUT/<model>/oracle_<setting>/`` (or its results.jsonl), a model folder
        holding several ``oracle_*`` runs, or the reference's ``all_results.json`` (or its folder;
        needs ``bundle``). ``load_run`` loads exactly one. ``detect(path)`` says which it is.
    ``read_reference_results(path, bundle, ...) -> Run``: the reference reader itself.
    ``run_from_records(records, oracle=..., greedy=...) -> Run``: records built in memory.

Scoring
    ``score_records(records, mode="reference") -> CaseScores``: every turn re-parsed from its raw
        response and judged; per-case detail via ``CaseScores.case(i)`` / ``.cases()``.
    ``score_model(runs, mode=None, name=None) -> ModelScores``: one model's numbers (``mode``
        None: the parse mode the runs were made with, ``run_parse_mode``; another over an oracle
        run's recorded one is a WARNING and ``ModelScores.not_own``),
        End-to-End from the ``none`` run (or exactly from a greedy oracle run), Oracle-Passed from
        the ``implicit`` (else ``explicit``) run; ``ModelScores.sources`` says which,
        ``ModelScores.notes`` lists anything odd about the inputs.
    ``score_path(path, bundle=None, mode=None, ...) -> ModelScores``: load_runs + score_model.
    ``ModelScores.flat``: the stable flat metrics ``FLAT_KEYS`` (``e2e/stage<k>/<P>``,
        ``op/stage<k>/<P>``, ``depth/<P>``, ``sub/<task>``; fractions; None = N/A).
        ``ModelScores.values``: every metric (per lesion, bias, gains; see ``columns``).
        ``ModelScores.tables()``: nested Tables 2, 3, 8, 9, 10, 11. ``.to_dict()``: all of it.
    ``Report`` and ``build_report`` are deprecated names of ``ModelScores`` and ``score_model``
        ("report" now means the HTML report, ``chexpercept.metrics.report``).

Uncertainty (one design-based method: cases the unit, lesion x path cells the strata; metrics/inference.py)
    ``ModelScores.with_intervals(level=0.95)`` / ``intervals(scores.matrix)``: every metric's interval
        (Korn-Graubard for shares, t otherwise); ``estimates(scores.matrix)``: values with standard errors.
    ``compare(a, b, level=0.95, adjust_method="holm")``: paired differences, intervals, t tests and
        detectable differences, p-values adjusted within families (the paper's tables, Table 2's gains,
        the lesion x path x stage cells); ``render_comparison(comparison, fmt)``: markdown, CSV, JSON.
        ``compare_reports(a, b, keys=None)``: the same per metric, unadjusted.
    ``detectable_difference(se, df)``, ``cases_needed(sd, difference)``: power (``chexpercept power``).

Tables
    ``render_table(id, scores_or_{name: scores}, fmt="markdown"|"csv", intervals=False)`` for
        ids 2, 3, 8, 9, 10, 11; ``table2_row(scores)``: one model's Table 2 as one markdown row.

The evaluate module
    ``METRIC_PATH``: folder of the ``chexpercept_metric`` evaluate module (``evaluate.load(METRIC_PATH)``).
    ``install_metric()``: one-time step after which ``evaluate.load("chexpercept_metric")`` works
        offline from any folder (``chexpercept install-metric`` on the command line).
    ``references_from_cases(cases)`` / ``references_from_dataset(ds)``: the metric's references.

Example:
    >>> from chexpercept.metrics import run_from_records, score_model
    >>> from chexpercept.metrics.simulate import fixture_cases, simulate_records
    >>> cases = fixture_cases(per_cell=2)
    >>> records = simulate_records(cases, lambda case, turn: turn.stage < 3, oracle="none")
    >>> scores = score_model([run_from_records(records, oracle="none")])
    >>> scores.flat["e2e/stage2/all"], scores.flat["e2e/stage3/RR"], scores.flat["depth/LF"]
    (1.0, 0.0, 1.0)
    >>> scores.flat["op/stage2/all"] is None  # no oracle run: Oracle-Passed is N/A
    True
"""

from __future__ import annotations

from chexpercept.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "Run": "runs",
    "detect": "discovery",
    "load_run": "discovery",
    "load_runs": "discovery",
    "run_from_records": "runs",
    "read_reference_results": "reference",
    "CaseScores": "scoring",
    "TurnScore": "scoring",
    "score_records": "scoring",
    "FLAT_KEYS": "columns",
    "ModelScores": "model_scores",
    "Source": "model_scores",
    "score_model": "model_scores",
    "score_path": "api",
    "bootstrap_intervals": "bootstrap",
    "intervals": "inference",
    "estimates": "inference",
    "detectable_difference": "inference",
    "cases_needed": "inference",
    "compare": "comparisons",
    "compare_reports": "comparisons",
    "render_comparison": "comparisons",
    "TABLES": "tables",
    "render_table": "tables",
    "table2_row": "tables",
    "nested_tables": "tables",
    "METRIC_PATH": "evaluate_support",
    "install_metric": "evaluate_support",
    "records_from_inputs": "evaluate_support",
    "references_from_cases": "evaluate_support",
    "references_from_dataset": "evaluate_support",
}

#: old names kept importable (with a DeprecationWarning): "report" now means the HTML report
_DEPRECATED: dict[str, str] = {"Report": "ModelScores", "build_report": "score_model"}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, globals(), _DEPRECATED)
