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
from pathlib import Path as FsPath
from typing import Any

from chexpercept.cli_options import add_data_dir_option, add_option, add_parse_mode_option, write_output
from chexpercept.errors import BundleValidationError, ReleaseNotFoundError
from chexpercept.escape import terminal, terminal_lines
from chexpercept.results import ORACLE_SETTINGS

from .tables import TABLE_IDS, table_choices


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="run folder, results file, model folder, or a folder of model folders (run --output-dir)",
    )
    add_data_dir_option(parser, help="release bundle folder (required for the reference's all_results.json)")
    add_parse_mode_option(parser, help="answer parsing (default: reference)")
    parser.add_argument("--oracle", choices=ORACLE_SETTINGS, help="oracle setting, when the run does not say")
    decoding = parser.add_mutually_exclusive_group()
    decoding.add_argument(
        "--greedy",
        dest="greedy",
        action="store_true",
        default=None,
        help="decoding was greedy (if not recorded)",
    )
    decoding.add_argument("--sampled", dest="greedy", action="store_false", help="decoding was sampled")
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
    out.add_argument("--compare", action="store_true", help="paired comparison of exactly two PATHs")
    parser.add_argument("--format", choices=("markdown", "csv"), default="markdown", help="table format")
    parser.add_argument("--cases", action="store_true", help="with --details: add every case's verdicts")
    parser.add_argument(
        "--bootstrap", type=int, default=0, metavar="N", help="bootstrap resamples for intervals (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap/permutation seed (default 0)")
    parser.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
    add_option(
        parser, "--output", "--out", metavar="FILE", help="write the output to this file instead of stdout"
    )


def _names(args: argparse.Namespace) -> list[str | None]:
    if args.name and len(args.name) != len(args.paths):
        raise ValueError(f"--name given {len(args.name)} times for {len(args.paths)} paths")
    return list(args.name) if args.name else [None] * len(args.paths)


def _expanded(paths: list[str], names: list[str | None]) -> list[tuple[str, str | None]]:
    """(model path, name) per model: a folder of several models (``run --output-dir``) stands for
    each of them, said on stderr."""
    from .discovery import model_folders

    out: list[tuple[str, str | None]] = []
    for path, name in zip(paths, names):
        folders = model_folders(path)
        if folders != [FsPath(path)]:
            if name is not None:
                raise ValueError(
                    f"--name {name!r}: {path} holds {len(folders)} models; name each model folder"
                )
            print(
                f"{path}: scoring each of its {len(folders)} model folders: "
                + ", ".join(f.name for f in folders),
                file=sys.stderr,
            )
        out.extend((str(f), name) for f in folders)
    return out


def run(args: argparse.Namespace) -> int:
    from .answer_warnings import warning_lines
    from .api import score_path

    try:
        models = _expanded(args.paths, _names(args))
        if args.compare and len(models) != 2:
            raise ValueError(f"--compare needs exactly two models, got {len(models)}")
        reports = []
        for path, name in models:
            reports.append(
                score_path(
                    path,
                    bundle=args.data_dir,
                    mode=args.parse_mode,
                    oracle=args.oracle,
                    greedy=args.greedy,
                    missing=args.missing,
                    name=name,
                )
            )
    except (ValueError, FileNotFoundError, BundleValidationError, ReleaseNotFoundError) as e:
        print(f"chexpercept score: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    seen: dict[str, int] = {}
    for report in reports:
        seen[report.name] = seen.get(report.name, 0) + 1
        if seen[report.name] > 1:
            report.name = f"{report.name} ({seen[report.name]})"
        name = terminal(report.name)  # a model's name and notes come from its run folder
        for line in report.source_lines():
            print(f"[{name}] {terminal(line)}", file=sys.stderr)
        for note in report.notes:
            print(f"[{name}] note: {terminal(note)}", file=sys.stderr)
        for line in warning_lines(report):
            print(line, file=sys.stderr)
        if args.bootstrap > 0 and not args.compare:
            report.with_intervals(args.bootstrap, seed=args.seed, level=args.level)
    if args.cases and not args.details:
        print(
            "note: --cases adds every case's verdicts to --details; without --details it does nothing",
            file=sys.stderr,
        )
    write_output(args.output, _output(args, reports))
    return 0


def _output(args: argparse.Namespace, reports: list[Any]) -> str:
    from .bootstrap import compare_reports
    from .tables import legend, render_table

    if args.compare:
        a, b = reports
        result = {
            "a": a.name,
            "b": b.name,
            "mode": args.parse_mode,
            "n_resamples": args.bootstrap or 1000,
            "metrics": compare_reports(
                a,
                b,
                n_resamples=args.bootstrap or 1000,
                n_permutations=args.bootstrap or 1000,
                seed=args.seed,
                level=args.level,
            ),
        }
        return json.dumps(result, indent=2) + "\n"
    if args.table:
        ids = TABLE_IDS if args.table == "all" else (args.table,)
        models = {r.name: r for r in reports}
        parts = [
            render_table(
                t, models, fmt=args.format, intervals=args.bootstrap > 0, title=args.format == "markdown"
            )
            for t in ids
        ]
        if args.format == "markdown":
            parts.insert(0, legend(args.bootstrap, seed=args.seed, level=args.level) + "\n")
        return "\n".join(parts)
    if args.details:
        data = [r.to_dict(cases=args.cases) for r in reports]
    else:
        data = [r.flat for r in reports]
    payload = data[0] if len(reports) == 1 else {r.name: d for r, d in zip(reports, data)}
    return json.dumps(payload, indent=2) + "\n"
