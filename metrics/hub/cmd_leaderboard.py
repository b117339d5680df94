"""``chexpercept leaderboard ORG/NAME``: the Hub's leaderboard of a benchmark, read back as a table
(rank, model, value, verified or not, notes), through huggingface_hub's get_dataset_leaderboard."""

from __future__ import annotations

import argparse
import sys

from chexpercept.cli_options import add_output_option
from chexpercept.escape import terminal_lines

PROG = "chexpercept leaderboard"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "repo", metavar="ORG/NAME", help="the benchmark dataset repo (chexpercept benchmark-card)"
    )
    parser.add_argument(
        "--all-models",
        action="store_true",
        help="every submitted result, fine-tunes included (default: the Hub's view, models without a base_model)",
    )
    parser.add_argument(
        "--format",
        choices=("markdown", "csv", "json"),
        default="markdown",
        help="output format (default: markdown)",
    )
    add_output_option(parser, help="write the table to FILE instead of printing it")


def run(args: argparse.Namespace) -> int:

    from chexpercept.cli_options import output_file
    from chexpercept.fileio import write_atomic
    from chexpercept.metrics.hub.leaderboard import (
        LeaderboardError,
        hub_leaderboard_csv,
        hub_leaderboard_json,
        read_leaderboard,
        render_hub_leaderboard,
    )
    from chexpercept.metrics.hub.names import NameRefused, check_repo_id

    try:  # the Hub's rule for a repo id, as push-results checks it ("me/b b" was taken)
        check_repo_id(args.repo, "the benchmark repo")
    except NameRefused as e:
        print(f"{PROG}: {terminal_lines(e)}", file=sys.stderr)
        return 2
    try:
        entries = read_leaderboard(args.repo, all_models=args.all_models)
    except LeaderboardError as e:
        print(f"{PROG}: {terminal_lines(e)}", file=sys.stderr)
        return 1
    if args.format == "csv":
        text = hub_leaderboard_csv(entries)
    elif args.format == "json":
        text = hub_leaderboard_json(entries)
    else:
        text = render_hub_leaderboard(entries, args.repo)
    target = output_file(args.output) if args.output else None
    if target is not None:
        out = write_atomic(target, text)
        print(f"{len(entries)} entries of {args.repo} written to {out}")
    else:
        print(text, end="")
    return 0
