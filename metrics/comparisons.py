"""Paired comparison of two models: each metric's difference with its interval, test and detectable
difference, in families of tests adjusted together, for the terminal (markdown), CSV and JSON.

The statistics are metrics/inference.py's; this module aligns the two models' cases, groups the
metrics into families and renders them. A family is one table of the paper (its cells: Table 2's
headline numbers, Table 8's paths, Table 9's lesions, ...), Table 2's bracketed gains, or the
lesion x path x stage cells; a family's p-values are adjusted together (Holm by default), whatever
part of it is shown.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from chexpercept.escape import csv_cell, markdown_cell
from chexpercept.vocab import LESIONS, PATHS, route_stages

from .columns import DERIVED, FLAT_KEYS
from .inference import DEFAULT_LEVEL, DEFAULT_POWER, Paired, adjust, paired_columns
from .partial import PARTIAL_COLUMN, bundle_difference, heading, partial_models, partial_reasons
from .tables import TABLES, table_cells

if TYPE_CHECKING:  # annotations only
    from .model_scores import ModelScores

FORMATS: tuple[str, ...] = ("markdown", "csv", "json")
METHOD_DOC = 'docs/scoring.md, "Intervals, tests and power"'
NO_VARIATION = (
    "† no variation: every case of each stratum (lesion x path cell; path where cells hold under 10 "
    "cases) has the same difference, so no draw of cases with these cells changes it (exact for constant "
    "answers to Stages 1 and 2, whose gold answer is fixed per path; otherwise too few cases to show "
    "variation)."
)


@dataclass(frozen=True)
class FamilyRow:
    """One test of a family: the metric, its label in the tables and how its values are shown."""

    key: str
    label: str
    #: pct (fractions shown as %), num (stages, points: 2 decimals)
    kind: str = "pct"


@dataclass(frozen=True)
class Family:
    """Tests whose p-values are adjusted together."""

    id: str
    title: str
    rows: tuple[FamilyRow, ...]


def _table_family(table_id: str) -> Family:
    rows = tuple(
        FamilyRow(key, label, "num" if col.kind == "num" else "pct")
        for key, label, col in table_cells(table_id)
    )
    return Family(table_id, TABLES[table_id].title, rows)


def _families() -> dict[str, Family]:
    out = {tid: _table_family(tid) for tid in TABLES}
    gains = tuple(FamilyRow(col.gain, f"{col.header} gain over E2E") for col in TABLES["2"].cols if col.gain)
    out["gains"] = Family("gains", "Table 2's brackets: Oracle-Passed minus End-to-End", gains)
    cells = []
    for lesion in LESIONS:
        for path in PATHS:
            stages = route_stages(lesion, path)
            for setting, label in (("e2e", "E2E"), ("op", "OP")):
                for k in stages:
                    if setting == "e2e" or k > 1:
                        key = f"lesion/{lesion}/{setting}/stage{k}/{path.value}"
                        cells.append(FamilyRow(key, f"{lesion.capitalize()} {path.value} {label} S{k}"))
    out["cells"] = Family("cells", "Lesion x path x stage cells", tuple(cells))
    return out


#: every family, by id: the paper's table numbers, "gains" and "cells"
FAMILIES: dict[str, Family] = _families()
#: the families ``score --compare`` shows unless told otherwise
DEFAULT_FAMILIES: tuple[str, ...] = ("2", "3", "8")


@dataclass(frozen=True)
class Row:
    """One metric compared: the paired estimates, interval, p-values and detectable difference."""

    row: FamilyRow
    paired: Paired
    interval: tuple[float, float]
    p_value: float
    p_adjusted: float
    #: the difference this comparison detects with the chosen power after the family's adjustment
    detectable: float | None

    def as_dict(self) -> dict[str, Any]:
        d = self.paired.difference
        return {
            "metric": self.row.key,
            "label": self.row.label,
            "a": self.paired.a.value,
            "b": self.paired.b.value,
            "difference": d.value,
            "interval": list(self.interval),
            "se": d.se,
            "df": d.df,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "n": d.n,
            "detectable": self.detectable,
            "varies": d.varies,
        }


@dataclass(frozen=True)
class FamilyResult:
    """A family's tests that apply to both models (a test that applies to no case is left out)."""

    family: Family
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class Comparison:
    """Two models compared on the cases both were scored on."""

    a: str
    b: str
    cases: int
    level: float
    adjust: str
    power: float
    families: tuple[FamilyResult, ...]
    #: {model name: why its numbers are partial} (metrics/partial.py); empty when both are whole
    partial: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def family(self, family_id: str) -> FamilyResult:
        for result in self.families:
            if result.family.id == family_id:
                return result
        raise KeyError(f"unknown family {family_id!r}; expected one of {', '.join(FAMILIES)}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "cases": self.cases,
            "level": self.level,
            "adjust": self.adjust,
            "power": self.power,
            "method": (
                "paired t test and interval from the design-based standard error of the difference "
                "(cases the unit, lesion x path cells the strata); p_adjusted within each family; "
                f"detectable: the difference found with {self.power:.0%} power at the family's level; "
                f"see {METHOD_DOC}"
            ),
            "partial": {name: list(why) for name, why in self.partial.items()},
            "families": {
                r.family.id: {
                    "title": r.family.title,
                    "tests": len(r.rows),
                    "rows": [row.as_dict() for row in r.rows],
                }
                for r in self.families
            },
        }


def _aligned(
    a: ModelScores, b: ModelScores
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(A's values, B's values, where both apply, cells, metric names) on the cases both have."""
    differ = bundle_difference({a.name: a, b.name: b})
    if differ:
        raise ValueError(
            f"{a.name} and {b.name} were run on {differ}; a paired comparison needs the same cases"
        )
    if a.mode != b.mode:  # each is scored in the mode it was made with (round 2, helper-53)
        raise ValueError(
            f"{a.name} was scored with {a.mode} parsing and {b.name} with {b.mode} parsing (the modes their runs "
            "were made with); a paired comparison reads both alike: choose one with --parse-mode"
        )
    common = sorted(set(a.matrix.key_ids) & set(b.matrix.key_ids))
    if not common:
        raise ValueError(f"{a.name} and {b.name} share no cases")
    names = [n for n in a.matrix.names if n in set(b.matrix.names)]
    parts = []
    for m in (a.matrix, b.matrix):
        row = {k: i for i, k in enumerate(m.key_ids)}
        rows = np.array([row[k] for k in common], dtype=np.int64)
        col = m.index()
        cols = np.array([col[n] for n in names], dtype=np.int64)
        parts.append((m.weighted[np.ix_(rows, cols)], m.applies[np.ix_(rows, cols)], m.strata[rows]))
    (wa, aa, sa), (wb, ab, sb) = parts
    if (sa != sb).any():
        key = common[int(np.argmax(sa != sb))]
        raise ValueError(f"case {key}: lesion or path differs between {a.name} and {b.name}")
    return wa, wb, aa & ab, sa, names


def paired_estimates(a: ModelScores, b: ModelScores) -> tuple[int, dict[str, Paired | None]]:
    """(cases both were scored on, every metric's paired estimates on them; None where N/A)."""
    wa, wb, joint, strata, names = _aligned(a, b)
    return len(strata), paired_columns(wa, wb, joint, strata, names)


def discordance(a: ModelScores, b: ModelScores) -> dict[str, float]:
    """Per metric, the share of the cases it applies to on which the two models' values differ."""
    wa, wb, joint, _, names = _aligned(a, b)
    count = joint.sum(axis=0)
    differ = ((wa != wb) & joint).sum(axis=0)
    return {name: float(differ[k] / count[k]) for k, name in enumerate(names) if count[k]}


def compare(
    a: ModelScores,
    b: ModelScores,
    *,
    level: float = DEFAULT_LEVEL,
    adjust_method: str = "holm",
    power: float = DEFAULT_POWER,
) -> Comparison:
    """Compare two models on the cases both were scored on, every family adjusted on its own.

    Raises ValueError when the models were run on different bundles, share no case, or disagree on
    a case's lesion or path.
    """
    cases, paired = paired_estimates(a, b)
    results = []
    for family in FAMILIES.values():
        present = [(r, paired[r.key]) for r in family.rows if paired.get(r.key) is not None]
        p_values = [p.difference.p_value() for _, p in present]  # type: ignore[union-attr]
        adjusted = adjust(p_values, adjust_method)
        tests = len(present) if adjust_method != "none" else 1
        rows = tuple(
            Row(
                row,
                p,  # type: ignore[arg-type]
                p.difference.interval(level),  # type: ignore[union-attr]
                raw,
                adj,
                p.difference.detectable(level, power, max(tests, 1)),  # type: ignore[union-attr]
            )
            for (row, p), raw, adj in zip(present, p_values, adjusted)
        )
        results.append(FamilyResult(family, rows))
    partial = partial_models({a.name: a, b.name: b})
    return Comparison(a.name, b.name, cases, level, adjust_method, power, tuple(results), partial)


def compare_reports(
    a: ModelScores,
    b: ModelScores,
    *,
    keys: Sequence[str] | None = None,
    level: float = DEFAULT_LEVEL,
    power: float = DEFAULT_POWER,
) -> dict[str, dict[str, Any]]:
    """Paired comparison per metric (default: the flat keys and Table 2's gains), unadjusted.

    Per metric: ``a`` and ``b`` (on the common cases), ``difference`` (a - b), ``interval`` (t, from
    the design-based standard error of the difference), ``p_value`` (the paired t test with the same
    standard error), ``se``, ``df``, ``n`` (cases where the metric applies to both) and
    ``detectable`` (difference found with ``power`` at the unadjusted level). All None where N/A.
    ``compare`` adds families and multiplicity adjustment.
    """
    _, paired = paired_estimates(a, b)
    wanted = list(keys) if keys is not None else [*FLAT_KEYS, *(k for k in DERIVED if k.startswith("gain/"))]
    out: dict[str, dict[str, Any]] = {}
    for key in wanted:
        if key not in paired:
            raise KeyError(f"unknown metric {key!r}")
        p = paired[key]
        if p is None:
            out[key] = dict.fromkeys(
                ("a", "b", "difference", "interval", "p_value", "se", "df", "detectable")
            )
            out[key]["n"] = 0
            continue
        d = p.difference
        out[key] = {
            "a": p.a.value,
            "b": p.b.value,
            "difference": d.value,
            "interval": list(d.interval(level)),
            "p_value": d.p_value(),
            "se": d.se,
            "df": d.df,
            "n": d.n,
            "detectable": d.detectable(level, power),
        }
    return out


# ------------------------------------------------------------------------------------ rendering
def _value(v: float, kind: str, signed: bool = False) -> str:
    if kind == "num":
        return f"{v:+.2f}" if signed else f"{v:.2f}"
    return f"{100 * v:+.1f}" if signed else f"{100 * v:.1f}"


def _p(p: float) -> str:
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _selected(comparison: Comparison, families: Iterable[str] | None) -> list[FamilyResult]:
    ids = list(families) if families is not None else list(DEFAULT_FAMILIES)
    if "all" in ids:
        ids = list(FAMILIES)
    return [comparison.family(i) for i in ids]


def how_to_read(comparison: Comparison) -> str:
    """What the columns of the markdown comparison mean (one paragraph)."""
    level = f"{comparison.level:.0%}"
    alpha = f"{1 - comparison.level:.2g}"
    adjusted = {
        "holm": "Holm-adjusted within the family (the table the row belongs to)",
        "bh": "Benjamini-Hochberg-adjusted within the family (the table the row belongs to)",
        "none": "not adjusted (as p)",
    }[comparison.adjust]
    level_note = f"{alpha}/m for a family of m tests" if comparison.adjust != "none" else alpha
    return (
        f"A - B per metric, in percentage points (depth and points in their own units). {level} CI: t "
        "interval of the paired difference from its design-based standard error (cases the unit, "
        "lesion x path cells the strata). p: two-sided paired t test with the same standard error, so "
        f"the interval leaves out 0 exactly when p < {alpha}. p adj.: {adjusted}. n: cases compared. "
        f"MDE: the difference this comparison detects with {comparison.power:.0%} power at level "
        f"{level_note} (–: the two runs never differ on these cases, so they say nothing about the "
        f"difference's variance). Method: {METHOD_DOC}."
    )


def _markdown_family(result: FamilyResult, a: str, b: str, adjust_method: str) -> str:
    rows = result.rows
    name = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no adjustment"}[adjust_method]
    lines = [f"**{result.family.title}**: {len(rows)} tests, {name}", ""]
    if not rows:
        return "\n".join([*lines, "No test applies to both models (–).", ""])
    head = ["Metric", a, b, "A - B", "CI", "p", "p adj.", "n", "MDE"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    flagged = False
    for r in rows:
        kind, d = r.row.kind, r.paired.difference
        ci = f"[{_value(r.interval[0], kind, True)}, {_value(r.interval[1], kind, True)}]"
        if r.interval[0] == r.interval[1]:
            ci += "†"
            flagged = True
        cells = [
            r.row.label,
            _value(r.paired.a.value, kind),
            _value(r.paired.b.value, kind),
            _value(d.value, kind, True),
            ci,
            _p(r.p_value),
            _p(r.p_adjusted),
            str(d.n),
            "–" if r.detectable is None else _value(r.detectable, kind),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if flagged:
        lines += ["", NO_VARIATION]
    return "\n".join(lines) + "\n"


CSV_COLUMNS: tuple[str, ...] = (
    "family",
    "metric",
    "label",
    "a",
    "b",
    "difference",
    "lo",
    "hi",
    "se",
    "df",
    "p_value",
    "p_adjusted",
    "n",
    "detectable",
    "varies",
)


def csv_rows(
    comparison: Comparison, families: Iterable[str] | None = None
) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of the comparison's CSV: one row per test of the families shown, values as
    fractions (stages for depth), empty where None, text escaped for a spreadsheet (``csv_cell``)."""
    rows = []
    for result in _selected(comparison, families):
        for row in result.rows:
            d = row.as_dict()
            d["lo"], d["hi"] = d.pop("interval")
            d["family"] = result.family.id
            rows.append(["" if d[c] is None else csv_cell(d[c]) for c in CSV_COLUMNS])
    if comparison.partial:  # why the numbers are partial (metrics/partial.py), on every row
        why = partial_reasons(comparison.partial)
        return [*CSV_COLUMNS, PARTIAL_COLUMN], [[*row, csv_cell(why)] for row in rows]
    return list(CSV_COLUMNS), rows


def render_comparison(
    comparison: Comparison,
    fmt: str = "markdown",
    *,
    families: Iterable[str] | None = None,
    explain: bool = True,
) -> str:
    """The comparison in ``markdown`` (a title, how to read it unless ``explain`` is False, one table
    per family), ``csv`` (one row per test, fractions) or ``json``. families: ids to show (default
    ``DEFAULT_FAMILIES``; ``all``); the adjustment always covers the whole family."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    shown = _selected(comparison, families)
    if fmt == "json":
        data = comparison.as_dict()
        data["families"] = {r.family.id: data["families"][r.family.id] for r in shown}
        return json.dumps(data, indent=2) + "\n"
    if fmt == "csv":
        header, rows = csv_rows(comparison, families)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
        return buf.getvalue()
    # the models' names come from run.json: escaped for markdown as --table escapes them (red team,
    # stop 44: a | or <img> in a name broke the table and put HTML in it)
    a, b = markdown_cell(comparison.a), markdown_cell(comparison.b)
    parts = [f"**Paired comparison: {a} - {b}** on the {comparison.cases:,} cases both were scored on", ""]
    mark = heading(comparison.partial)
    if mark:
        parts += [mark.rstrip("\n"), ""]
    if explain:
        parts += [how_to_read(comparison), ""]
    parts += [_markdown_family(r, a, b, comparison.adjust) for r in shown]
    return "\n".join(parts)
