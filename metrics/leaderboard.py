"""The leaderboard: models ranked under End-to-End and under Oracle-Passed.

A model's score under a setting is the mean of its four stage accuracies (aggregated over paths the
way the paper does): End-to-End S1-S4, or S1 with Oracle-Passed S2-S4 (Stage 1 is the same under both).
Each stage counts equally, so a model cannot climb by detection alone. Stage values carry their 95%
bootstrap intervals when the reports have them. A model without numbers for a setting (say, no
oracle run) is listed below the ranked ones as N/A.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path as FsPath
from typing import Any

from chexpercept.escape import markdown_cell
from chexpercept.metrics.csv_files import csv_text, write_csv
from chexpercept.metrics.partial import PARTIAL_COLUMN, csv_columns, csv_value, heading

SETTING_KEYS: dict[str, tuple[str, ...]] = {
    "e2e": ("e2e/stage1/all", "e2e/stage2/all", "e2e/stage3/all", "e2e/stage4/all"),
    "op": ("e2e/stage1/all", "op/stage2/all", "op/stage3/all", "op/stage4/all"),
}
SETTING_TITLES = {"e2e": "End-to-End", "op": "Oracle-Passed"}
DEPTH_KEYS = ("depth/RR", "depth/RF", "depth/LF")
CSV_COLUMNS = (
    "setting",
    "rank",
    "model",
    "score",
    "stage1",
    "stage2",
    "stage3",
    "stage4",
    "depth_RR",
    "depth_RF",
    "depth_LF",
)


def setting_score(values: Mapping[str, float | None], setting: str) -> float | None:
    """A model's score under ``setting`` (e2e or op): the mean of its four stage accuracies, None
    when one of them is N/A."""
    stages = [values.get(k) for k in SETTING_KEYS[setting]]
    return None if any(v is None for v in stages) else sum(stages) / len(stages)


def leaderboard_rows(reports: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows for both settings: setting, rank (None when N/A), model, score and the stage values.

    reports: model name -> the metric library's ModelScores (``values``, optional ``intervals``).
    """
    rows: list[dict[str, Any]] = []
    for setting, keys in SETTING_KEYS.items():
        entries = []
        for name, rep in reports.items():
            stages = [rep.values.get(k) for k in keys]
            score = setting_score(rep.values, setting)
            intervals = rep.intervals or {}
            entries.append(
                {
                    "setting": setting,
                    "model": name,
                    "score": score,
                    **{f"stage{i + 1}": v for i, v in enumerate(stages)},
                    **{f"stage{i + 1}_ci": intervals.get(k) for i, k in enumerate(keys)},
                    **{f"depth_{k.split('/')[1]}": rep.values.get(k) for k in DEPTH_KEYS},
                    PARTIAL_COLUMN: csv_value(rep),
                }
            )
        ranked = sorted(
            (e for e in entries if e["score"] is not None), key=lambda e: (-e["score"], e["model"])
        )
        rank, previous = 0, None
        for i, e in enumerate(ranked, start=1):
            if e["score"] != previous:
                rank, previous = i, e["score"]
            e["rank"] = rank
        unranked = sorted((e for e in entries if e["score"] is None), key=lambda e: e["model"])
        for e in unranked:
            e["rank"] = None
        rows.extend(ranked + unranked)
    return rows


def _pct(v: float | None, ci: Sequence[float] | None = None) -> str:
    if v is None:
        return "–"
    text = f"{100 * v:.1f}"
    if ci:
        text += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return text


def render_leaderboard(rows: Sequence[Mapping[str, Any]]) -> str:
    """Two markdown tables (End-to-End, Oracle-Passed), best model first; a line before them names
    the models whose numbers are partial (metrics/partial.py)."""
    mark = heading({r["model"]: [r[PARTIAL_COLUMN]] for r in rows if r.get(PARTIAL_COLUMN)})
    parts = [mark.rstrip("\n") + "\n"] if mark else []
    for setting, title in SETTING_TITLES.items():
        stage_heads = ["S1", "S2", "S3", "S4"] if setting == "e2e" else ["S1", "OP S2", "OP S3", "OP S4"]
        head = ["Rank", "Model", "Score (%)", *stage_heads]
        if setting == "e2e":
            head += ["Depth RR", "Depth RF", "Depth LF"]
        lines = [
            f"**Leaderboard, {title}** (score: mean of the four stage accuracies, %)",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join(" --- " for _ in head) + "|",
        ]
        for r in (r for r in rows if r["setting"] == setting):
            cells = [
                "–" if r["rank"] is None else str(r["rank"]),
                markdown_cell(r["model"]),
                _pct(r["score"]),
                *[_pct(r[f"stage{k}"], r.get(f"stage{k}_ci")) for k in (1, 2, 3, 4)],
            ]
            if setting == "e2e":
                cells += [
                    "–" if r[f"depth_{p}"] is None else f"{r[f'depth_{p}']:.2f}" for p in ("RR", "RF", "LF")
                ]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def write_leaderboard_csv(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> FsPath:
    """Both boards as one CSV (fractions; empty where N/A; a ``partial`` column when a model's
    numbers are partial)."""
    return write_csv(path, csv_columns(CSV_COLUMNS, rows), rows)


def leaderboard_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """The CSV ``write_leaderboard_csv`` writes, as text."""
    return csv_text(csv_columns(CSV_COLUMNS, rows), rows)
