"""``chexpercept report runs/ --output-dir report/`` (or ``--results runs/``): tables, leaderboard, CSVs,
figures and HTML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chexpercept.cli_options import (
    add_data_dir_option,
    add_decoding_override_options,
    add_output_dir_option,
    add_parse_mode_option,
)
from chexpercept.domains import COUNT_OR_NONE, SEED
from chexpercept.escape import terminal, terminal_lines

DEFAULT_OUTPUT_DIR = "report"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="*",
        metavar="RUNS",
        help="folder(s) of runs, as for score (the same as --results)",
    )
    parser.add_argument(
        "--results",
        action="append",
        default=[],
        metavar="DIR",
        help="folder of runs: <model>/oracle_<setting>/results.jsonl (this toolkit) or "
        "<provider>_<model>/oracle_<setting>/all_results.json (reference); repeat to combine folders",
    )
    add_output_dir_option(
        parser, default=None, help=f"report folder (default: ./{DEFAULT_OUTPUT_DIR}, said when used)"
    )
    add_data_dir_option(
        parser,
        help="the bundle the runs were made on (default: the one run.json names); needed for reference "
        "results and for images in the case viewer",
    )
    add_parse_mode_option(parser)
    add_decoding_override_options(parser)
    parser.add_argument(
        "--embed-images",
        action="store_true",
        help="copy the images the viewer shows into the report folder (credentialed data: the folder then "
        "falls under the data use agreement); by default the viewer links to the bundle on disk",
    )
    parser.add_argument(
        "--no-intervals",
        action="store_true",
        help="leave out the tables' 95%% intervals (design-based: cases the unit, lesion x path cells "
        "the strata; see docs/scoring.md)",
    )
    # earlier spellings: intervals came from a bootstrap; kept working, hidden from --help
    parser.add_argument("--bootstrap", type=COUNT_OR_NONE, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=SEED, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--reference-zeros",
        action="store_true",
        help="write 0.0 like the reference where a CSV cell does not apply (default: empty cell)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the figures (no matplotlib needed)")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML report and case viewer")
    parser.add_argument("--title", default="CheXpercept report", help="title of the HTML report")
    parser.add_argument(
        "--hub-leaderboard",
        metavar="ORG/NAME",
        help="also show the Hub's leaderboard of this benchmark dataset repo beside the local runs "
        "(read with huggingface_hub; rows marked as taken from the Hub)",
    )


def run(args: argparse.Namespace) -> int:
    from .build import write_report

    intervals = not args.no_intervals
    if args.bootstrap is not None:
        intervals = intervals and args.bootstrap > 0
        print(
            "note: --bootstrap is deprecated: the intervals are design-based and need no resampling "
            "(N is not used; 0 is --no-intervals)",
            file=sys.stderr,
        )
    if args.seed is not None:
        print("note: --seed is not used: nothing in the report is random any more", file=sys.stderr)
    results = list(dict.fromkeys([*args.runs, *args.results]))
    if not results:
        print(
            "chexpercept report: error: which runs? give their folder: chexpercept report RUNS",
            file=sys.stderr,
        )
        return 2
    output_dir = args.output_dir
    if output_dir is None:
        output_dir = DEFAULT_OUTPUT_DIR
        print(
            f"chexpercept report: no --output-dir given: writing to {terminal(Path(output_dir).resolve())}",
            file=sys.stderr,
        )
    hub = None
    if args.hub_leaderboard:
        from ..hub.leaderboard import HubBoard, LeaderboardError, read_leaderboard

        try:
            hub = HubBoard(args.hub_leaderboard, tuple(read_leaderboard(args.hub_leaderboard)))
        except LeaderboardError as e:
            print(f"chexpercept report: error: --hub-leaderboard: {terminal_lines(e)}", file=sys.stderr)
            return 2
    try:
        result = write_report(
            results,
            output_dir,
            bundle=args.data_dir,
            mode=args.parse_mode,
            greedy=args.greedy,
            embed_images=args.embed_images,
            intervals=intervals,
            na_as_zero=args.reference_zeros,
            plots=not args.no_plots,
            html=not args.no_html,
            title=args.title,
            hub_leaderboard=hub,
        )
    except (FileNotFoundError, ValueError, ImportError) as e:  # bad input, as the other commands: 2
        print(f"chexpercept report: error: {terminal_lines(e)}", file=sys.stderr)
        return 2
    print(result.table2)
    for note in result.notes:
        print(f"note: {terminal(note)}")
    for warning in result.warnings:
        print("\n".join(warning.lines()), file=sys.stderr)
    print(
        f"Report of {len(result.models)} model(s), {len(result.runs)} run(s), {result.cases} cases "
        f"written in {result.seconds:.1f} s to {terminal(result.out.resolve())}/"
    )
    if result.index_html is not None:
        print(f"Open {terminal(result.index_html.resolve().as_uri())}")
    return 0
