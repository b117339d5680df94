"""The paper's tables (2, 3, 8, 9, 10, 11) as nested data, markdown and CSV, for one or many models.

Percentages carry one decimal, depth and point counts two, as in the paper; a cell that does not
apply is "–" in markdown and empty in CSV. Markdown can show intervals next to each value
(``intervals=True`` on reports built ``with_intervals``; metrics/inference.py); CSV then gets
``lo``/``hi`` columns.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chexpercept.escape import csv_cell, markdown_cell
from chexpercept.vocab import LESIONS, PATHS, POINT_TASKS

from .partial import PARTIAL_COLUMN, markdown_line, partial_models

if TYPE_CHECKING:  # annotations only: model_scores imports this module
    from .model_scores import ModelScores

NA = "–"
Values = Mapping[str, float | None]


@dataclass(frozen=True)
class Col:
    header: str
    #: metric name; may contain {path} or {lesion}, filled per row
    key: str
    #: pct (x100, 1 decimal), signed (x100, sign, 1 decimal), num (2 decimals)
    kind: str = "pct"
    #: metric shown in brackets after the value (Table 2's gain of Oracle-Passed over End-to-End)
    gain: str | None = None


@dataclass(frozen=True)
class Table:
    title: str
    cols: tuple[Col, ...]
    #: per-row label header and rows (label, substitutions); None = one row per model
    row_header: str | None = None
    rows: tuple[tuple[str, dict[str, str]], ...] = ()
    #: what the table shows, in a few words (``--table`` help, the report)
    name: str = ""
    #: what its abbreviations and brackets mean (printed under the markdown table)
    note: str = ""


_PATH_ROWS = tuple((p.value, {"path": p.value}) for p in PATHS)
_LESION_ROWS = tuple((name.capitalize(), {"lesion": name}) for name in LESIONS)

TABLES: dict[str, Table] = {
    "2": Table(
        "Table 2: stage-level accuracy (%) and depth",
        (
            Col("E2E S1", "e2e/stage1/all"),
            Col("E2E S2", "e2e/stage2/all"),
            Col("E2E S3", "e2e/stage3/all"),
            Col("E2E S4", "e2e/stage4/all"),
            Col("OP S2", "op/stage2/all", gain="gain/stage2"),
            Col("OP S3", "op/stage3/all", gain="gain/stage3"),
            Col("OP S4", "op/stage4/all", gain="gain/stage4"),
            Col("Depth RR (0-4)", "depth/RR", "num"),
            Col("Depth RF (0-3)", "depth/RF", "num"),
            Col("Depth LF (0-1)", "depth/LF", "num"),
        ),
        name="stage accuracy and depth",
        note=(
            "E2E: End-to-End accuracy (a case counts at a stage only if it passed every earlier stage). OP: "
            "Oracle-Passed accuracy (each stage on its own: wrong earlier answers were corrected by the "
            "oracle); Stage 1 is the same under both. (+x): OP minus E2E of the same stage, in percentage "
            "points. Depth: stages passed before the first error (maximum in brackets)."
        ),
    ),
    "3": Table(
        "Table 3: Stage 3 and Stage 4 sub-task accuracy (%), Oracle-Passed",
        (
            Col("S3 Exp.", "sub/expansion"),
            Col("S3 Con.", "sub/contraction"),
            Col("S3 Res.", "sub/revision_result"),
            Col("S4 Dist.", "sub/distribution"),
            Col("S4 Loc.", "sub/location"),
            Col("S4 Sev.", "sub/severity"),
            Col("S4 Comp.", "sub/comparison"),
        ),
        name="sub-task accuracy",
        note=(
            "Stage 3: Exp. expansion points, Con. contraction points (exact set match), Res. revision result."
            " Stage 4: Dist. distribution, Loc. location, Sev. severity, Comp. comparison (RR and RF, "
            "cardiomegaly excluded)."
        ),
    ),
    "8": Table(
        "Table 8: per-path stage accuracy (%)",
        (
            Col("S1", "e2e/stage1/{path}"),
            Col("E2E S2", "e2e/stage2/{path}"),
            Col("E2E S3", "e2e/stage3/{path}"),
            Col("E2E S4", "e2e/stage4/{path}"),
            Col("OP S2", "op/stage2/{path}"),
            Col("OP S3", "op/stage3/{path}"),
            Col("OP S4", "op/stage4/{path}"),
        ),
        "Path",
        _PATH_ROWS,
        name="stage accuracy per path",
        note=(
            "E2E: End-to-End, OP: Oracle-Passed (as in Table 2); S1 is the same under both. LF asks Stage 1 "
            "only, RF no Stage 3: those cells do not apply (–)."
        ),
    ),
    "9": Table(
        "Table 9: per-lesion stage accuracy (%) and depth (cardiomegaly depth on its native scale)",
        (
            Col("S1", "lesion/{lesion}/e2e/stage1/all"),
            Col("E2E S2", "lesion/{lesion}/e2e/stage2/all"),
            Col("E2E S3", "lesion/{lesion}/e2e/stage3/all"),
            Col("E2E S4", "lesion/{lesion}/e2e/stage4/all"),
            Col("OP S2", "lesion/{lesion}/op/stage2/all"),
            Col("OP S3", "lesion/{lesion}/op/stage3/all"),
            Col("OP S4", "lesion/{lesion}/op/stage4/all"),
            Col("Depth RR", "lesion/{lesion}/depth_native/RR", "num"),
            Col("Depth RF", "lesion/{lesion}/depth_native/RF", "num"),
            Col("Depth LF", "lesion/{lesion}/depth_native/LF", "num"),
        ),
        "Lesion",
        _LESION_ROWS,
        name="stage accuracy and depth per lesion",
        note=(
            "E2E: End-to-End, OP: Oracle-Passed (as in Table 2). Cardiomegaly has no Stage 4: its depth is on"
            " its native scale (maxima RR 3, RF 2), not with the +1 that Table 2 adds."
        ),
    ),
    "10": Table(
        "Table 10: Stage 2 answer distribution (%), Oracle-Passed run",
        (
            Col("RR Yes", "bias/stage2/RR/yes"),
            Col("RR No", "bias/stage2/RR/no"),
            Col("RR Etc", "bias/stage2/RR/etc"),
            Col("RF Yes", "bias/stage2/RF/yes"),
            Col("RF No", "bias/stage2/RF/no"),
            Col("RF Etc", "bias/stage2/RF/etc"),
            Col("Delta", "bias/stage2/delta", "signed"),
            Col("Acc.", "bias/stage2/accuracy"),
        ),
        name="Stage 2 answer distribution",
        note=(
            "Share of Stage 2 answers (is any major revision of the contour needed?) that are Yes (option 1),"
            " No (option 2) or Etc (anything else), on RR (gold: Yes) and RF (gold: No). Delta: Yes rate on "
            "RR minus Yes rate on RF (near 0: the model answers alike whatever the contour). Acc.: (RR Yes + "
            "RF No) / 2, which equals OP S2 of Table 2."
        ),
    ),
    "11": Table(
        "Table 11: Stage 3 response bias on RR, Oracle-Passed run",
        (
            Col("Exp. None (%)", "bias/stage3/expansion/none_rate"),
            Col("Exp. Pts", "bias/stage3/expansion/points", "num"),
            Col("Exp. Acc. (%)", "bias/stage3/expansion/accuracy"),
            Col("Con. None (%)", "bias/stage3/contraction/none_rate"),
            Col("Con. Pts", "bias/stage3/contraction/points", "num"),
            Col("Con. Acc. (%)", "bias/stage3/contraction/accuracy"),
        ),
        name="Stage 3 response bias",
        note=(
            "Stage 3 on RR: None (%): share of answers choosing the None option; Pts: mean number of points "
            "chosen per case; Acc. (%): exact match of the chosen set. Exp.: expansion, Con.: contraction."
        ),
    ),
}
#: the paper's tables this toolkit renders, in paper order
TABLE_IDS: tuple[str, ...] = tuple(TABLES)


#: what a zero-width interval means (the mark after it in score's and the report's tables)
NO_VARIATION_NOTE = (
    "† zero width: every case of each stratum (lesion x path cell; path where cells hold under 10 cases) "
    "has the same value, so no draw of cases with these cells changes the number (exact for a constant "
    "answer to Stage 1 or 2, whose gold answer is fixed per path; otherwise too few cases to show "
    "variation)"
)


def legend(intervals: bool = False, *, level: float = 0.95, marked: bool = False) -> str:
    """What the numbers, brackets and dashes of the markdown tables mean (one line, printed above
    them by ``chexpercept score --table`` and the report); ``marked``: some interval has a †."""
    if intervals:
        return (
            f"Values in %, depth in stages; brackets: {level:.0%} intervals (design-based: cases the unit, "
            "lesion x path cells the strata; Korn-Graubard for percentages, t for depth; "
            'docs/scoring.md, "Intervals, tests and power"). '
            + (f"{NO_VARIATION_NOTE}. " if marked else "")
            + "– = does not apply or not measured."
        )
    return "Values in %, depth in stages. – = does not apply or not measured."


def table_cells(table_id: str) -> list[tuple[str, str, Col]]:
    """(metric key, label, column) of every cell of a table's rows, in reading order; the label is the
    row's and the column's ("RR E2E S2")."""
    table = TABLES[str(table_id)]
    return [
        (col.key.format(**subs), f"{label} {col.header}".strip(), col)
        for label, subs in table.rows or (("", {}),)
        for col in table.cols
    ]


def zero_width(reports: Mapping[str, Any], table_ids: Sequence[str] = TABLE_IDS) -> bool:
    """Whether a cell of these tables has a zero-width interval for one of these models
    (``ModelScores`` with intervals): the † that ``legend(marked=True)`` explains."""
    keys = {key for tid in table_ids for key, _, _ in table_cells(tid)}
    return any(
        (ci := (rep.intervals or {}).get(key)) is not None and ci[0] == ci[1]
        for rep in reports.values()
        for key in keys
    )


def table_choices() -> str:
    """The tables by number and name, for help texts: "2 stage accuracy and depth, 3 ..."."""
    return ", ".join(f"{tid} {t.name}" for tid, t in TABLES.items())


def _fmt(value: float | None, kind: str, na: str = NA) -> str:
    if value is None:
        return na
    if kind == "pct":
        return f"{value * 100:.1f}"
    if kind == "signed":
        return f"{value * 100:+.1f}"
    return f"{value:.2f}"


def _as_models(
    reports: ModelScores | Mapping[str, Any],
) -> list[tuple[str, Values, Mapping[str, Any] | None]]:
    """(name, values, intervals) per model, from a ModelScores, a name->ModelScores map or a
    name->values map (values are a Mapping; a ModelScores is not)."""
    if not isinstance(reports, Mapping):
        return [(reports.name, reports.values, reports.intervals)]
    out = []
    for name, item in reports.items():
        if isinstance(item, Mapping):
            out.append((name, item, None))
        else:
            out.append((name, item.values, item.intervals))
    return out


def _cells(
    table: Table,
    values: Values,
    subs: dict[str, str],
    intervals,
    csv_mode: bool,
    show_ci: bool,
    mark: bool = False,
):
    cells: list[str] = []
    for col in table.cols:
        key = col.key.format(**subs)
        v = values.get(key)
        na = "" if csv_mode else NA
        text = _fmt(v, col.kind, na)
        if col.gain:
            g = values.get(col.gain)
            if csv_mode:
                cells.append(text)
                text = _fmt(g, "signed", na)
            elif v is not None and g is not None:
                text += f" ({_fmt(g, 'signed')})"
        ci = intervals.get(key) if (show_ci and intervals) else None
        if show_ci and csv_mode:
            cells.append(text)
            cells.extend([_fmt(ci[0], col.kind, "") if ci else "", _fmt(ci[1], col.kind, "") if ci else ""])
            continue
        if ci and v is not None:
            text += f" [{_fmt(ci[0], col.kind)}, {_fmt(ci[1], col.kind)}]"
            if mark and ci[0] == ci[1]:
                text += "†"
        cells.append(text)
    return cells


def _headers(table: Table, csv_mode: bool, show_ci: bool) -> list[str]:
    out = ["Model"] + ([table.row_header] if table.row_header else [])
    for col in table.cols:
        out.append(col.header)
        if csv_mode and col.gain:
            out.append(f"{col.header} gain")
        if csv_mode and show_ci:
            out.extend([f"{col.header} lo", f"{col.header} hi"])
    return out


def table_rows(
    table_id: str,
    reports: ModelScores | Mapping[str, Any],
    *,
    intervals: bool = False,
    csv_mode: bool = False,
    mark_no_variation: bool = False,
):
    """Header and rows of a table as lists of strings (``mark_no_variation``: a zero-width interval
    gets a † in markdown, see ``NO_VARIATION_NOTE``)."""
    table = TABLES[str(table_id)]
    rows = []
    mark = mark_no_variation and not csv_mode
    cell = csv_cell if csv_mode else markdown_cell  # a model name is text from a run folder
    for name, values, ivals in _as_models(reports):
        for label, subs in table.rows or (("", {}),):
            lead = [cell(name)] + ([label] if table.row_header else [])
            rows.append(lead + _cells(table, values, subs, ivals, csv_mode, intervals, mark))
    return _headers(table, csv_mode, intervals), rows


def render_table(
    table_id: str | int,
    reports: ModelScores | Mapping[str, Any],
    *,
    fmt: str = "markdown",
    intervals: bool = False,
    title: bool = True,
    mark_no_variation: bool = False,
) -> str:
    """Render Table 2, 3, 8, 9, 10 or 11 for one report or a {model name: report or values} map.

    Markdown with ``title`` starts with the table's title and the note on its abbreviations; the
    table's rows come last. CSV holds the header and rows only. ``mark_no_variation``: a zero-width
    interval gets a † (markdown; explained by ``legend``).
    """
    table_id = str(table_id)
    if table_id not in TABLES:
        raise ValueError(f"unknown table {table_id!r}; expected one of {', '.join(TABLES)}")
    if fmt not in ("markdown", "csv"):
        raise ValueError(f"unknown format {fmt!r}; expected markdown or csv")
    header, rows = table_rows(
        table_id, reports, intervals=intervals, csv_mode=fmt == "csv", mark_no_variation=mark_no_variation
    )
    if fmt == "csv":
        partial = partial_models(reports)
        if partial:  # a column naming why a model's numbers are partial (metrics/partial.py)
            names = [name for name, _values, _ivals in _as_models(reports)]
            per_row = len(TABLES[table_id].rows or (("", {}),))
            header = [*header, PARTIAL_COLUMN]
            rows = [
                [*row, csv_cell("; ".join(partial.get(names[i // per_row], [])))]
                for i, row in enumerate(rows)
            ]
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        return buf.getvalue()
    table = TABLES[table_id]
    lines = [f"**{table.title}**", ""] if title else []
    if title and table.note:
        lines += [table.note, ""]
    mark = markdown_line(reports)
    if mark:
        lines += [mark.rstrip("\n"), ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    lines.extend("| " + " | ".join(r) + " |" for r in rows)
    return "\n".join(lines) + "\n"


def table2_row(report: ModelScores, name: str | None = None, *, header: bool = False) -> str:
    """One model's Table 2 as a single markdown row (with the header lines when header=True)."""
    head, rows = table_rows("2", {name or report.name: report.values})
    row = "| " + " | ".join(rows[0]) + " |"
    if not header:
        return row
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|", row])


def nested_tables(values: Values) -> dict[str, Any]:
    """The tables as nested dicts of raw values (fractions; None = N/A) for JSON details."""
    v = values.get
    stage = {k: f"stage{k}" for k in (1, 2, 3, 4)}
    out: dict[str, Any] = {
        "table2": {
            "e2e": {f"S{k}": v(f"e2e/{stage[k]}/all") for k in (1, 2, 3, 4)},
            "op": {f"S{k}": v(f"op/{stage[k]}/all") for k in (2, 3, 4)},
            "gain": {f"S{k}": v(f"gain/{stage[k]}") for k in (2, 3, 4)},
            "depth": {p.value: v(f"depth/{p.value}") for p in PATHS},
        },
        "table3": {c.key.split("/")[1]: v(c.key) for c in TABLES["3"].cols},
        "table8": {
            p.value: {
                "S1": v(f"e2e/stage1/{p.value}"),
                "e2e": {f"S{k}": v(f"e2e/{stage[k]}/{p.value}") for k in (2, 3, 4)},
                "op": {f"S{k}": v(f"op/{stage[k]}/{p.value}") for k in (2, 3, 4)},
            }
            for p in PATHS
        },
        "table9": {
            name: {
                "S1": v(f"lesion/{name}/e2e/stage1/all"),
                "e2e": {f"S{k}": v(f"lesion/{name}/e2e/{stage[k]}/all") for k in (2, 3, 4)},
                "op": {f"S{k}": v(f"lesion/{name}/op/{stage[k]}/all") for k in (2, 3, 4)},
                "depth": {p.value: v(f"lesion/{name}/depth/{p.value}") for p in PATHS},
                "depth_native": {p.value: v(f"lesion/{name}/depth_native/{p.value}") for p in PATHS},
            }
            for name in LESIONS
        },
        "table10": {
            **{p: {c: v(f"bias/stage2/{p}/{c}") for c in ("yes", "no", "etc")} for p in ("RR", "RF")},
            "delta": v("bias/stage2/delta"),
            "accuracy": v("bias/stage2/accuracy"),
        },
        "table11": {
            task: {
                m: v(f"bias/stage3/{task}/{m}")
                for m in ("none_rate", "points", "accuracy", "gold_none_rate", "gold_points")
            }
            for task in POINT_TASKS
        },
    }
    return out
