"""CSV files of the scorer's numbers (the report's reference CSVs, the leaderboard, the Hub's rows):
one spelling of a cell for all of them (floats as repr, an empty cell where a number does not apply,
text made inert for a spreadsheet)."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

from chexpercept.escape import csv_cell
from chexpercept.fileio import write_atomic


def _cell(value: Any, na_as_zero: bool) -> str:
    if value is None:
        return "0.0" if na_as_zero else ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):  # a model name, the Hub's notes: inert in a spreadsheet
        return str(csv_cell(value))
    return str(value)


def write_csv(
    path: str | os.PathLike[str],
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    *,
    na_as_zero: bool = False,
) -> FsPath:
    return write_atomic(path, csv_text(columns, rows, na_as_zero=na_as_zero))


def csv_text(columns: Sequence[str], rows: Sequence[Mapping[str, Any]], *, na_as_zero: bool = False) -> str:
    """The CSV ``write_csv`` writes, as text: a header, then one line per row (floats as repr)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(row.get(c), na_as_zero) for c in columns])
    return buf.getvalue()
