"""``chexpercept score PATH...``: score runs and print the flat metrics as JSON (or tables, details).

PATH is our run folder ``OUT/<model>/oracle_<setting>/`` (or its results.jsonl), a model folder
with several ``oracle_*`` runs (End-to-End and Oracle-Passed each from the run that measures it),
or the reference's ``all_results.json`` (or its folder; needs ``--data-dir``). Which run each kind of
number came from, and anything odd about the inputs, is printed on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path as FsPath
from typing import Any

from chexpercept.cli_options import (
    add_data_dir_option,
    add_decoding_override_options,
    add_output_option,
    add_parse_mode_option,
    write_output,
)
from chexpercept.domains import COUNT_OR_NONE, LEVEL, SEED
from chexpercept.errors import BundleValidationError, ReleaseNotFoundError
from chexpercept.escape import terminal, terminal_lines
from chexpercept.results import ORACLE_SETTINGS

from .tables import TABLE_IDS, table_choices

# the names of comparisons.FAMILIES, comparisons.FORMATS and inference.ADJUSTMENTS, spelled here so
# that --help imports no numpy (tests/test_metrics_compare.py checks they agree)
FAMILY_IDS: tuple[str, ...] = (*TABLE_IDS, "gains", "cells")
FORMATS: tuple[str, ...] = ("markdown", "csv", "json")
ADJUSTMENTS: tuple[str, ...] = ("holm", "bh", "none")


#: --level's and --adjust's defaults (an option at its default is no option given: _IDLE_OPTIONS)
LEVEL_DEFAULT = 0.95
ADJUST_DEFAULT = "holm"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="run folder, results file, model folder, or a folder of model folders (run --output-dir)",
    )
    add_data_dir_option(parser, help="release bundle folder (required for the reference's all_results.json)")
    add_parse_mode_option(parser)
    parser.add_argument(
        "--oracle",
        choices=ORACLE_SETTINGS,
        help="oracle setting, when the run does not say (over a recorded one: a WARNING, the reference's way, "
        "docs/differences.md)",
    )
    add_decoding_override_options(parser)
    parser.add_argument(
        "--missing",
        choices=("wrong", "skip"),
        default="wrong",
        help="reference results: count unscored turns as wrong (default) or drop their stage as the reference did",
    )
    parser.add_argument(
        "--name", action="append", help="model name for each PATH, in order (default: from the run)"
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument(
        "--details", action="store_true", help="print every table, source, note and parse rate as JSON"
    )
    out.add_argument(
        "--table",
        choices=(*TABLE_IDS, "all"),
        help="print the paper's table: " + table_choices() + "; all: every one (several PATHs: one row "
        "per model)",
    )
    out.add_argument(
        "--compare",
        action="store_true",
        help="paired comparison of exactly two PATHs: difference, interval, p-value adjusted within each "
        "family, cases and detectable difference per metric (see --family, --adjust)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="markdown",
        help="--table: markdown or csv; --compare: markdown, csv or json (default markdown)",
    )
    parser.add_argument("--cases", action="store_true", help="with --details: add every case's verdicts")
    parser.add_argument(
        "--intervals",
        action="store_true",
        help="add 95%% intervals (design-based: cases the unit, lesion x path cells the strata) to "
        "--table and --details",
    )
    parser.add_argument(
        "--family",
        action="append",
        choices=(*FAMILY_IDS, "all"),
        metavar="F",
        help="with --compare: the families of tests to show, repeatable: a table number ("
        + ", ".join(TABLE_IDS)
        + "), gains (Table 2's brackets), cells (lesion x path x stage) or all (default: 2, 3, 8); "
        "p-values are adjusted over the whole family",
    )
    parser.add_argument(
        "--adjust",
        choices=ADJUSTMENTS,
        default=ADJUST_DEFAULT,
        help="with --compare: multiplicity adjustment within each family: holm (family-wise error, the "
        "default), bh (Benjamini-Hochberg false discovery rate) or none",
    )
    parser.add_argument("--level", type=LEVEL, default=LEVEL_DEFAULT, help="interval level (default 0.95)")
    # earlier spellings: intervals came from a bootstrap; kept working, hidden from --help
    parser.add_argument("--bootstrap", type=COUNT_OR_NONE, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=SEED, default=None, help=argparse.SUPPRESS)
    add_output_option(parser, "--out", help="write the output to this file instead of stdout")


def _names(args: argparse.Namespace) -> list[str | None]:
    if args.name and len(args.name) != len(args.paths):
        raise ValueError(f"--name given {len(args.name)} times for {len(args.paths)} paths")
    return list(args.name) if args.name else [None] * len(args.paths)


def _expanded(paths: list[str], names: list[str | None]) -> list[tuple[str, str | None]]:
    """(model path, name) per model: a folder of several models (``run --output-dir``) stands for
    each of them, said on stderr."""
    from .discovery import model_folders, unread_entries

    out: list[tuple[str, str | None]] = []
    for path, name in zip(paths, names):
        folders = model_folders(path)
        for entry, why in unread_entries(path):
            print(f"chexpercept score: note: {terminal(entry)}: {why}: not scored", file=sys.stderr)
        if folders != [FsPath(path)]:
            if name is not None:
                raise ValueError(
                    f"--name {name!r}: {terminal(path)} holds {len(folders)} models; name each model folder"
                )
            print(
                terminal(f"{path}: scoring each of its {len(folders)} model folders: ")
                + ", ".join(terminal(f.name) for f in folders),
                file=sys.stderr,
            )
        out.extend((str(f), name) for f in folders)
    return out


def _say_once(items: list[tuple[str, str]]) -> None:
    """Print each (model, line) pair on stderr as ``[model] line``, a line that several models share
    once with all their names: ``[a, b] line``."""
    from .model_scores import said_once

    for line, models in said_once(items):  # a model's name and notes come from its run folder
        print(terminal(f"[{', '.join(models)}] {line}"), file=sys.stderr)


def _interval_options(args: argparse.Namespace) -> bool:
    """Whether intervals were asked for (``--intervals``, or the earlier ``--bootstrap N``), saying
    what the earlier options do now."""
    if args.bootstrap is not None:
        print(
            "note: --bootstrap is deprecated: the intervals are design-based and need no resampling "
            f"(N is not used); {'use --intervals' if args.bootstrap else 'leave --intervals out'}",
            file=sys.stderr,
        )
    if args.seed is not None:
        print("note: --seed is not used: nothing in score is random any more", file=sys.stderr)
    return args.intervals or bool(args.bootstrap)


def _check_formats(args: argparse.Namespace) -> None:
    """--format json is for --compare; every option given where it does nothing says so, one note
    each (``_IDLE_OPTIONS``: --intervals without --table or --details printed the flat JSON without a
    word; new user, stop 45)."""
    if args.format == "json" and args.table:
        raise ValueError("--table prints markdown or csv; --format json is for --compare")
    for idle, note in _IDLE_OPTIONS:
        if idle(args):
            print(f"note: {note.format(args=args)}", file=sys.stderr)


#: (given where it does nothing, what to say): each option of score that applies to some outputs only
_IDLE_OPTIONS: tuple[tuple[Callable[[argparse.Namespace], bool], str], ...] = (
    (
        lambda a: a.format != "markdown" and not (a.table or a.compare),
        "--format {args.format} applies to --table and --compare; the flat metrics are JSON",
    ),
    (
        lambda a: bool(a.family) and not a.compare,
        "--family chooses what --compare shows; without --compare it does nothing",
    ),
    (
        lambda a: a.compare and a.intervals,
        "--compare gives every difference its interval; --intervals adds nothing",
    ),
    (
        lambda a: a.intervals and not (a.table or a.details or a.compare),
        "--intervals adds intervals to --table and --details; the flat metrics have none",
    ),
    (
        lambda a: a.level != LEVEL_DEFAULT and not (a.intervals or a.compare or a.bootstrap),
        "--level sets the level of --intervals and --compare's intervals; without them it does nothing",
    ),
    (
        lambda a: a.adjust != ADJUST_DEFAULT and not a.compare,
        "--adjust is --compare's multiplicity adjustment; without --compare it does nothing",
    ),
    (
        lambda a: a.cases and not a.details,
        "--cases adds every case's verdicts to --details; without --details it does nothing",
    ),
)


def run(args: argparse.Namespace) -> int:
    from .answer_warnings import warning_lines
    from .api import score_path
    from .partial import bundle_difference
    from .runs import NoFinishedCases

    try:
        intervals = _interval_options(args)
        _check_formats(args)
        models = _expanded(args.paths, _names(args))
        if args.compare and len(models) != 2:
            raise ValueError(f"--compare needs exactly two models, got {len(models)}")
        reports = []
        for path, name in models:
            try:
                report = score_path(
                    path,
                    bundle=args.data_dir,
                    mode=args.parse_mode,
                    oracle=args.oracle,
                    greedy=args.greedy,
                    missing=args.missing,
                    name=name,
                )
            except NoFinishedCases as e:
                if len(models) == 1:
                    raise
                # one model with nothing finished (every request failed) leaves the others scored
                print(f"chexpercept score: note: {terminal_lines(e)}: not scored", file=sys.stderr)
                continue
            reports.append(report)
        if not reports:
            raise ValueError(f"no model of {', '.join(map(terminal, args.paths))} has a finished case")
        if args.compare and len(reports) != 2:
            raise ValueError(f"--compare needs two models with finished cases, got {len(reports)}")
    except (ValueError, FileNotFoundError, BundleValidationError, ReleaseNotFoundError) as e:
        print(f"chexpercept score: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    seen: dict[str, int] = {}
    for report in reports:
        seen[report.name] = seen.get(report.name, 0) + 1
        if seen[report.name] > 1:
            report.name = f"{report.name} ({seen[report.name]})"
    _say_once([(r.name, line) for r in reports for line in r.source_lines()])
    _say_once([(r.name, f"note: {note}") for r in reports for note in r.notes])
    for report in reports:
        for line in warning_lines(report):
            print(line, file=sys.stderr)
        if intervals and not args.compare:
            report.with_intervals(level=args.level)
    differ = bundle_difference({r.name: r for r in reports})
    if differ and not args.compare and not (args.table and args.format == "markdown"):  # those say it
        print(  # JSON, --details and CSV carry no note of their own (red team, stop 44)
            f"chexpercept score: note: the models were run on {terminal(differ)}: their numbers are not comparable",
            file=sys.stderr,
        )
    try:
        text = _output(args, reports, intervals)
    except ValueError as e:  # e.g. two models of different bundles
        print(f"chexpercept score: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    write_output(args.output, text)
    return 0


def _output(args: argparse.Namespace, reports: list[Any], intervals: bool) -> str:
    from .tables import legend, render_table, zero_width

    if args.compare:
        from .comparisons import compare, render_comparison

        a, b = reports
        comparison = compare(a, b, level=args.level, adjust_method=args.adjust)
        return render_comparison(comparison, args.format, families=args.family)
    if args.table:
        ids = TABLE_IDS if args.table == "all" else (args.table,)
        models = {r.name: r for r in reports}
        parts = [
            render_table(
                t,
                models,
                fmt=args.format,
                intervals=intervals,
                title=args.format == "markdown",
                mark_no_variation=intervals,
            )
            for t in ids
        ]
        if args.format == "markdown":
            marked = intervals and zero_width(models, ids)
            parts.insert(0, legend(intervals, level=args.level, marked=marked) + "\n")
        return "\n".join(parts)
    if args.details:
        data = [r.to_dict(cases=args.cases) for r in reports]
    else:  # a partial model's reasons in its numbers' own object (said on stderr alone before)
        data = [{**r.flat, **({"partial": list(r.partial)} if r.partial else {})} for r in reports]
    payload = data[0] if len(reports) == 1 else {r.name: d for r, d in zip(reports, data)}
    return json.dumps(payload, indent=2) + "\n"
