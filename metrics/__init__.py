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
    ``build_report(runs, mode="reference", name=None) -> Report``: one model's numbers, End-to-End
        from the ``none`` run (or exactly from a greedy oracle run), Oracle-Passed from the
        ``implicit`` (else ``explicit``) run; ``Report.sources`` says which, ``Report.notes`` lists
        anything odd about the inputs.
    ``score_path(path, bundle=None, mode="reference", ...) -> Report``: load_runs + build_report.
    ``Report.flat``: the stable flat metrics ``FLAT_KEYS`` (``e2e/stage<k>/<P>``,
        ``op/stage<k>/<P>``, ``depth/<P>``, ``sub/<task>``; fractions; None = N/A).
        ``Report.values``: every metric (per lesion, bias, gains; see ``columns``).
        ``Report.tables()``: nested Tables 2, 3, 8, 9, 10, 11. ``Report.to_dict()``: all of it.

Uncertainty
    ``Report.with_intervals(n_resamples=1000, seed=0, level=0.95)`` / ``bootstrap_intervals(report)``:
        percentile intervals, cases resampled within each (lesion, path) cell.
    ``compare_reports(a, b, keys=None, n_resamples=1000, n_permutations=1000, seed=0)``: paired
        difference on the common cases, bootstrap interval and permutation p-value per metric.

Tables
    ``render_table(id, report_or_{name: report}, fmt="markdown"|"csv", intervals=False)`` for
        ids 2, 3, 8, 9, 10, 11; ``table2_row(report)``: one model's Table 2 as one markdown row.

The evaluate module
    ``METRIC_PATH``: folder of the ``chexpercept_metric`` evaluate module (``evaluate.load(METRIC_PATH)``).
    ``install_metric()``: one-time step after which ``evaluate.load("chexpercept_metric")`` works
        offline from any folder (``chexpercept install-metric`` on the command line).
    ``references_from_cases(cases)`` / ``references_from_dataset(ds)``: the metric's references.

Example:
    >>> from chexpercept.metrics import build_report, run_from_records
    >>> from chexpercept.metrics.simulate import fixture_cases, simulate_records
    >>> cases = fixture_cases(per_cell=2)
    >>> records = simulate_records(cases, lambda case, turn: turn.stage < 3, oracle="none")
    >>> report = build_report([run_from_records(records, oracle="none")])
    >>> report.flat["e2e/stage2/all"], report.flat["e2e/stage3/RR"], report.flat["depth/LF"]
    (1.0, 0.0, 1.0)
    >>> report.flat["op/stage2/all"] is None  # no oracle run: Oracle-Passed is N/A
    True
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "Run": "runs",
    "detect": "runs",
    "load_run": "runs",
    "load_runs": "runs",
    "run_from_records": "runs",
    "read_reference_results": "reference",
    "CaseScores": "scoring",
    "TurnScore": "scoring",
    "score_records": "scoring",
    "FLAT_KEYS": "columns",
    "Report": "report",
    "Source": "report",
    "build_report": "report",
    "score_path": "api",
    "bootstrap_intervals": "bootstrap",
    "compare_reports": "bootstrap",
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

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
