"""``chexpercept power [A B]``: the smallest difference a paired comparison can detect, and the cases
a subset needs for a given difference, per stage and path.

Without runs the answer rests on stated assumptions: the share of cases on which the two models'
verdicts differ (``--discordance``; 0.5 by default, the most that two models with independent errors
reach); with two runs of the same cases (``A B``) it rests on their own paired differences. The
statistics are metrics/inference.py's (``detectable_difference``, ``cases_needed``): the same
standard error, degrees of freedom and t quantiles as the test ``score --compare`` runs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chexpercept.cli_options import (
    add_data_dir_option,
    add_output_option,
    add_parse_mode_option,
    write_output,
)
from chexpercept.domains import ALPHA, FAMILY, POWER, SHARE, real, whole
from chexpercept.errors import BundleValidationError, ReleaseNotFoundError
from chexpercept.escape import csv_cell, markdown_cell, terminal_lines
from chexpercept.metrics.partial import PARTIAL_COLUMN, heading, partial_models, partial_reasons

RELEASE_PER_CELL = 100
FORMATS = ("markdown", "csv", "json")


#: --difference, in percentage points: below 0.01 pp the cases needed overflow any count
DIFFERENCE = real(0.01, 100)
#: --per-cell: a cell's variance needs two cases
PER_CELL = whole(2)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="two runs (or model folders) of the same cases: use their own paired differences instead of "
        "--discordance",
    )
    parser.add_argument(
        "--difference",
        type=DIFFERENCE,
        default=5.0,
        metavar="PP",
        help="the difference to detect, in percentage points (default 5): cases needed for it",
    )
    parser.add_argument(
        "--discordance",
        type=SHARE,
        default=0.5,
        metavar="Q",
        help="without runs: share of cases on which the two models' verdicts differ (default 0.5, the most "
        "two models with independent errors reach, at 50%% accuracy each)",
    )
    parser.add_argument(
        "--per-cell",
        type=PER_CELL,
        default=RELEASE_PER_CELL,
        metavar="N",
        help=f"cases per lesion x path cell of the design (default {RELEASE_PER_CELL}, the release)",
    )
    parser.add_argument("--alpha", type=ALPHA, default=0.05, help="two-sided test level (default 0.05)")
    parser.add_argument("--power", type=POWER, default=0.8, help="power (default 0.8)")
    parser.add_argument(
        "--tests",
        type=FAMILY,
        default=1,
        metavar="M",
        help="tests in the family the comparison belongs to: level alpha/M, the strictest step of Holm's "
        "(default 1; score --compare's Table 2 family has 10)",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="markdown", help="output format (default markdown)"
    )
    add_data_dir_option(parser, help="release bundle folder (for the reference's all_results.json)")
    add_parse_mode_option(parser)
    add_output_option(parser, help="write the output to this file instead of stdout")


@dataclass(frozen=True)
class PowerRow:
    """One metric: its design, the detectable difference and the cases needed (fractions)."""

    metric: str
    label: str
    cells: int
    design_cases: int
    sd: float | None
    detectable: float | None
    cases_needed: int | None
    per_cell: int | None
    discordance: float | None = None
    run_cases: int | None = None
    run_detectable: float | None = None


def stage_metrics(*, oracle_passed: bool = False) -> list[tuple[str, str, int]]:
    """(metric, label, cells it uses) of every stage accuracy per path and over paths, End-to-End (and
    Oracle-Passed) as the release asks them (cardiomegaly has no Stage 4)."""
    from chexpercept.vocab import LESIONS, PATHS, route_stages

    out = []
    settings = (("e2e", "E2E"), ("op", "OP")) if oracle_passed else (("e2e", ""),)
    for setting, tag in settings:
        for k in (1, 2, 3, 4):
            if setting == "op" and k == 1:
                continue
            asking = {p.value for lesion in LESIONS for p in PATHS if k in route_stages(lesion, p)}
            for path in (*(p.value for p in PATHS), "all"):
                cells = sum(
                    1
                    for lesion in LESIONS
                    for p in PATHS
                    if k in route_stages(lesion, p) and path in (p.value, "all")
                )
                if cells and not (path == "all" and len(asking) == 1):  # Stage 3: all is RR
                    label = " ".join(x for x in (tag, f"S{k}", path) if x)
                    out.append((f"{setting}/stage{k}/{path}", label, cells))
    return out


def _row(metric: str, label: str, cells: int, sd: float | None, args: argparse.Namespace) -> PowerRow:
    from .inference import cases_needed, detectable_difference

    level, n = 1 - args.alpha, cells * args.per_cell
    if sd is None or sd <= 0:
        return PowerRow(metric, label, cells, n, sd, None, None, None)
    mde = detectable_difference(sd / math.sqrt(n), n - cells, level=level, power=args.power, tests=args.tests)
    need = cases_needed(
        sd, args.difference / 100, cells=cells, level=level, power=args.power, tests=args.tests
    )
    return PowerRow(metric, label, cells, n, sd, mde, need, math.ceil(need / cells))


def assumed_rows(args: argparse.Namespace) -> list[PowerRow]:
    """Rows under the stated discordance: the per-case SD of the paired difference is sqrt(Q)."""
    sd = math.sqrt(args.discordance)
    return [_row(m, label, cells, sd, args) for m, label, cells in stage_metrics()]


def run_rows(args: argparse.Namespace, a: Any, b: Any) -> list[PowerRow]:
    """Rows from two models' paired differences: SD = the difference's standard error x sqrt(cases)."""
    from .comparisons import discordance, paired_estimates
    from .inference import detectable_difference

    _, paired = paired_estimates(a, b)
    shares = discordance(a, b)
    rows = []
    for metric, label, cells in stage_metrics(oracle_passed=True):
        p = paired.get(metric)
        if p is None:
            continue
        d = p.difference
        sd = d.se * math.sqrt(d.n) if d.se > 0 else None
        row = _row(metric, label, cells, sd, args)
        run_mde = (
            detectable_difference(d.se, d.df, level=1 - args.alpha, power=args.power, tests=args.tests)
            if d.se > 0 and d.df > 0  # one case per cell leaves no degrees of freedom
            else None
        )
        rows.append(
            PowerRow(
                **{
                    **asdict(row),
                    "discordance": shares.get(metric),
                    "run_cases": d.n,
                    "run_detectable": run_mde,
                }
            )
        )
    return rows


def _pp(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def _int(v: int | None) -> str:
    return "–" if v is None else f"{v:,}"


def render(
    rows: list[PowerRow],
    args: argparse.Namespace,
    names: tuple[str, str] | None,
    partial: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The rows in ``args.format``: markdown (title, assumptions, table), csv or json. ``partial``:
    {model: reasons} of runs that are not whole (metrics/partial.py), said in every format: a torn
    run's 20 of 21 cases were used without a word (red team, stop 44)."""
    partial = {name: list(why) for name, why in (partial or {}).items() if why}
    if args.format == "json":
        data: dict[str, Any] = {"settings": _settings(args, names), "rows": [asdict(r) for r in rows]}
        return json.dumps({**data, **({"partial": partial} if partial else {})}, indent=2) + "\n"
    if args.format == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        fields = list(asdict(rows[0])) if rows else []
        why = partial_reasons(partial)
        writer.writerow([*fields, PARTIAL_COLUMN] if why else fields)
        writer.writerows(
            [
                *["" if v is None else csv_cell(v) for v in asdict(r).values()],
                *([csv_cell(why)] if why else []),
            ]
            for r in rows
        )
        return buf.getvalue()
    design = "the release" if args.per_cell == RELEASE_PER_CELL else "a subset"
    level = f"α = {args.alpha:g}" + (
        f"/{args.tests} (a family of {args.tests} tests)" if args.tests > 1 else ""
    )
    lines = [heading(partial).rstrip("\n"), ""] if partial else []
    lines += [
        f"**Paired comparison of two models on {design} ({args.per_cell} cases per lesion x path cell): "
        "minimum detectable difference (MDE) and cases needed**",
        "",
        f"Two-sided paired t test at {level}, power {args.power:.0%}, the test `score --compare` runs "
        "(design-based standard error: cases the unit, cells the strata). "
        + (
            f"Assumed: the two models' verdicts differ on {args.discordance:.0%} of the cases "
            f"(--discordance; per-case SD of the difference sqrt({args.discordance:g})); 50% is the most "
            "two models with independent errors reach, correlated errors lower it and with it every "
            "MDE. Give two runs of the same cases to use their own."
            if names is None
            else f"From the runs: {markdown_cell(names[0])} vs {markdown_cell(names[1])}, the per-case SD of their paired difference "
            "within cells (Discordance: share of the runs' cases on which their verdicts differ)."
        )
        + f" Cases for {args.difference:g} pp: cases the metric needs, spread over its cells (Per cell).",
        "",
    ]
    head = ["Metric", "Cells", "Cases", "MDE (pp)", f"Cases for {args.difference:g} pp", "Per cell"]
    if names is not None:
        head = ["Metric", "Discordance", "Cases (runs)", "MDE runs (pp)", *head[1:]]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for r in rows:
        cells = [r.label]
        if names is not None:
            cells += [
                _pp(r.discordance) + ("%" if r.discordance is not None else ""),
                _int(r.run_cases),
                _pp(r.run_detectable),
            ]
        need = _int(r.cases_needed)
        if r.cases_needed is not None and r.cases_needed > r.design_cases:
            need += "*"
        cells += [str(r.cells), _int(r.design_cases), _pp(r.detectable), need, _int(r.per_cell)]
        lines.append("| " + " | ".join(cells) + " |")
    if any(r.cases_needed is not None and r.cases_needed > r.design_cases for r in rows):
        lines += [
            "",
            f"*: more cases than the design has ({args.per_cell} per cell): it cannot detect "
            f"{args.difference:g} pp with {args.power:.0%} power.",
        ]
    if any(r.sd is None for r in rows):
        lines += ["", "–: the runs never differ on this metric, so they say nothing about its variance."]
    return "\n".join(lines) + "\n"


def _settings(args: argparse.Namespace, names: tuple[str, str] | None) -> dict[str, Any]:
    return {
        "alpha": args.alpha,
        "power": args.power,
        "tests": args.tests,
        "difference": args.difference / 100,
        "per_cell": args.per_cell,
        "discordance": None if names else args.discordance,
        "runs": list(names) if names else None,
    }


def _check(args: argparse.Namespace) -> None:
    if len(args.runs) not in (0, 2):
        raise ValueError(f"give two runs of the same cases (or none), got {len(args.runs)}")
    if not args.runs and args.discordance < args.difference / 100:  # |difference| <= discordance
        raise ValueError(
            f"--discordance {args.discordance:g}: two models that differ on that share of cases cannot "
            f"differ by --difference {args.difference:g} pp; give a discordance of at least "
            f"{args.difference / 100:g}"
        )


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
        if args.runs:
            from .api import score_path

            a, b = (score_path(p, bundle=args.data_dir, mode=args.parse_mode) for p in args.runs)
            rows, names = run_rows(args, a, b), (a.name, b.name if b.name != a.name else f"{b.name} (2)")
            partial = partial_models(dict(zip(names, (a, b))))
        else:
            rows, names, partial = assumed_rows(args), None, {}
    except (ValueError, FileNotFoundError, BundleValidationError, ReleaseNotFoundError) as e:
        print(f"chexpercept power: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    write_output(args.output, render(rows, args, names, partial))
    return 0
