"""CSV files with the reference's names and columns (spec 4.3), so scripts written for it keep working.

Per run, in ``<out>/<model>/oracle_<setting>/``: ``model_performance_summary.csv``,
``model_performance_detail_contour_revision.csv``, ``model_performance_detail_attribute_extraction.csv``.
Across models, in ``<out>/all_models_oracle_<setting>/``: ``all_models_summary.csv``,
``all_models_contour_revision_detail.csv``, ``all_models_attribute_extraction_detail.csv``.

Values are fractions in [0, 1] read from the metric library's flat dict (``e2e/stage<k>/<P>``,
``op/stage<k>/<P>``, ``depth/<P>``, ``sub/<task>``); both settings' rows come from the same run, as in
the reference. One difference, on purpose: a cell that does not apply (LF Stages 2-4, RF Stage 3) is
left empty instead of the reference's 0.0; ``na_as_zero=True`` writes 0.0 like the reference.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

from chexpercept.metrics.csv_files import write_csv
from chexpercept.metrics.partial import PARTIAL_COLUMN, csv_columns
from chexpercept.vocab import PATHS

SUMMARY_CSV = "model_performance_summary.csv"
CONTOUR_REVISION_CSV = "model_performance_detail_contour_revision.csv"
ATTRIBUTE_EXTRACTION_CSV = "model_performance_detail_attribute_extraction.csv"
ALL_SUMMARY_CSV = "all_models_summary.csv"
ALL_CONTOUR_REVISION_CSV = "all_models_contour_revision_detail.csv"
ALL_ATTRIBUTE_EXTRACTION_CSV = "all_models_attribute_extraction_detail.csv"

SUMMARY_COLUMNS = (
    "path",
    "model",
    "setting",
    "acc(stage1)",
    "acc(stage2)",
    "acc(stage3)",
    "acc(stage4)",
    "depth",
)
CONTOUR_REVISION_COLUMNS = ("path", "model", "acc(expansion)", "acc(contraction)", "acc(revision_result)")
ATTRIBUTE_EXTRACTION_COLUMNS = (
    "path",
    "model",
    "acc(distribution)",
    "acc(location)",
    "acc(severity/measurement)",
    "acc(comparison)",
)
SETTINGS = {"end_to_end": "e2e", "oracle_passed": "op"}
_ATTRIBUTE_TASKS = {
    "acc(distribution)": "distribution",
    "acc(location)": "location",
    "acc(severity/measurement)": "severity",
    "acc(comparison)": "comparison",
}
_REVISION_TASKS = {
    "acc(expansion)": "expansion",
    "acc(contraction)": "contraction",
    "acc(revision_result)": "revision_result",
}

Flat = Mapping[str, float | None]


def summary_rows(model: str, flat: Flat) -> list[dict[str, Any]]:
    """Six rows per model: each route under end_to_end and oracle_passed (spec 4.3 order)."""
    rows = []
    for path in PATHS:
        p = path.value
        for setting, prefix in SETTINGS.items():
            row: dict[str, Any] = {"path": path.reference_name, "model": model, "setting": setting}
            row["acc(stage1)"] = flat.get(f"e2e/stage1/{p}")  # Stage 1 is the same under both settings
            for k in (2, 3, 4):
                row[f"acc(stage{k})"] = flat.get(f"{prefix}/stage{k}/{p}")
            row["depth"] = flat.get(f"depth/{p}")
            rows.append(row)
    return rows


def contour_revision_row(model: str, flat: Flat) -> dict[str, Any]:
    row: dict[str, Any] = {"path": "revision_required", "model": model}
    row.update({col: flat.get(f"sub/{task}") for col, task in _REVISION_TASKS.items()})
    return row


def attribute_extraction_row(model: str, flat: Flat) -> dict[str, Any]:
    row: dict[str, Any] = {"path": "revision_required+revision_free", "model": model}
    row.update({col: flat.get(f"sub/{task}") for col, task in _ATTRIBUTE_TASKS.items()})
    return row


def _marked(rows: list[dict[str, Any]], partial: str) -> list[dict[str, Any]]:
    """``rows`` with the ``partial`` cell of their model (metrics/partial.py)."""
    return [{**row, PARTIAL_COLUMN: partial} for row in rows]


def _write(path: FsPath, columns: Sequence[str], rows: list[dict[str, Any]], na_as_zero: bool) -> FsPath:
    return write_csv(path, csv_columns(columns, rows), rows, na_as_zero=na_as_zero)


def write_run_csvs(
    folder: str | os.PathLike[str], model: str, flat: Flat, *, na_as_zero: bool = False, partial: str = ""
) -> list[FsPath]:
    """The three per-model CSVs of one run; ``partial``: why its numbers are partial ("" when they
    are whole), written as a last ``partial`` column when given."""
    folder = FsPath(folder)
    return [
        _write(
            folder / SUMMARY_CSV, SUMMARY_COLUMNS, _marked(summary_rows(model, flat), partial), na_as_zero
        ),
        _write(
            folder / CONTOUR_REVISION_CSV,
            CONTOUR_REVISION_COLUMNS,
            _marked([contour_revision_row(model, flat)], partial),
            na_as_zero,
        ),
        _write(
            folder / ATTRIBUTE_EXTRACTION_CSV,
            ATTRIBUTE_EXTRACTION_COLUMNS,
            _marked([attribute_extraction_row(model, flat)], partial),
            na_as_zero,
        ),
    ]


def write_all_models_csvs(
    folder: str | os.PathLike[str],
    flats: Mapping[str, Flat],
    *,
    na_as_zero: bool = False,
    partial: Mapping[str, str] | None = None,
) -> list[FsPath]:
    """The three cross-model CSVs of one oracle setting (models in the given order); ``partial``:
    {model: why its numbers are partial}, written as a last ``partial`` column when one is."""
    folder = FsPath(folder)
    why = partial or {}
    return [
        _write(
            folder / ALL_SUMMARY_CSV,
            SUMMARY_COLUMNS,
            [row for m, f in flats.items() for row in _marked(summary_rows(m, f), why.get(m, ""))],
            na_as_zero,
        ),
        _write(
            folder / ALL_CONTOUR_REVISION_CSV,
            CONTOUR_REVISION_COLUMNS,
            [row for m, f in flats.items() for row in _marked([contour_revision_row(m, f)], why.get(m, ""))],
            na_as_zero,
        ),
        _write(
            folder / ALL_ATTRIBUTE_EXTRACTION_CSV,
            ATTRIBUTE_EXTRACTION_COLUMNS,
            [
                row
                for m, f in flats.items()
                for row in _marked([attribute_extraction_row(m, f)], why.get(m, ""))
            ],
            na_as_zero,
        ),
    ]
