"""``chexpercept review``: the expert review of the generation candidates as a local web app.

chexpercept review --mimic-cxr-jpg DIR --mimic-ils DIR --output-dir REVIEW [--annotators N]
                   [--reviews-per-case K] [--port P]
chexpercept review export REVIEW

The app listens on 127.0.0.1 only (credentialed data): there is no option to choose the address.
"""

from __future__ import annotations

import argparse
import sys

from chexpercept.cli_options import add_output_dir_option, add_progress_option, progress_enabled
from chexpercept.domains import ANNOTATORS, COUNT, PORT, SEED
from chexpercept.escape import shell_word, terminal, terminal_lines
from chexpercept.vocab import LESIONS

from ..cmd_generate import add_candidate_sources
from ..sources import SourceError
from .export import RULES, export
from .manifest import MANIFEST
from .server import LOOPBACK, ReviewServerError, make_server
from .store import StoreError

DEFAULT_PORT = 8765


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", nargs="?", choices=("serve", "export"), default="serve", help="serve (default) or export"
    )
    parser.add_argument("review_dir", nargs="?", metavar="REVIEW_DIR", help="the review folder (for export)")
    src = parser.add_argument_group("inputs (spelled as chexpercept generate's)")
    add_candidate_sources(src, rosalia_help="review the ROSALIA predictions <lesion>/<pair_id>/pred_mask.png")
    src.add_argument("--seed", type=SEED, default=0, help="random seed, as given to generate (default 0)")
    src.add_argument(
        "--lesions", nargs="+", metavar="LESION", default=list(LESIONS), help="subset of lesions"
    )
    src.add_argument(
        "--per-cell",
        type=COUNT,
        default=None,
        help="review only the first N candidates of each (lesion, path) cell in generate's order (default: all)",
    )
    rev = parser.add_argument_group("review")
    add_output_dir_option(rev, help="the review folder (review.json, overlays/, decisions/, export/)")
    rev.add_argument(
        "--annotators", type=ANNOTATORS, default=6, help="number of annotators (default 6, as the paper)"
    )
    rev.add_argument(
        "--reviews-per-case",
        type=ANNOTATORS,
        default=1,
        help="annotators per case (default 1; >= 2 for agreement)",
    )
    rev.add_argument(
        "--port", type=PORT, default=DEFAULT_PORT, help=f"port on {LOOPBACK} (default {DEFAULT_PORT})"
    )
    rev.add_argument("--prepare-only", action="store_true", help="prepare the review folder and exit")
    rev.add_argument("--rule", choices=RULES, default="unanimous", help="how annotators' decisions combine")
    add_progress_option(rev)


def _has_sources(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, k) for k in ("mimic_cxr_jpg", "cxr_png", "mimic_ils", "rosalia_pred", "lesion_masks")
    )


def run(args: argparse.Namespace) -> int:
    prog = "chexpercept review"
    review_dir = args.output_dir or args.review_dir
    if args.output_dir and args.review_dir and args.output_dir != args.review_dir:
        print(
            f"{prog}: error: two review folders given ({args.review_dir}, --output-dir {args.output_dir})",
            file=sys.stderr,
        )
        return 2
    if not review_dir:
        print(
            f"{prog}: error: the review folder is required (chexpercept review export REVIEW_DIR, or --output-dir REVIEW_DIR)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.action == "export":
            result = export(review_dir, rule=args.rule)
            print(result.summary())
            return 0
        from pathlib import Path as FsPath

        if _has_sources(args) or not (FsPath(review_dir) / MANIFEST).is_file():
            from .prepare import ReviewSources, prepare  # generation code: only when preparing

            sources = ReviewSources(
                mimic_cxr_jpg=args.mimic_cxr_jpg,
                cxr_png=args.cxr_png,
                mimic_ils=args.mimic_ils,
                lesion_masks=args.lesion_masks,
                rosalia_pred=args.rosalia_pred,
                seed=args.seed,
                lesions=args.lesions,
                per_cell=args.per_cell,
            )
            prepared = prepare(
                review_dir,
                sources,
                annotators=args.annotators,
                reviews_per_case=args.reviews_per_case,
                progress=progress_enabled(args),
            )
            manifest = prepared.manifest
            verb = "reused" if prepared.reused else f"prepared in {prepared.seconds:.1f} s"
            print(f"review of {len(manifest['items'])} candidate(s) {verb}: {review_dir}/{MANIFEST}")
            for key, error in prepared.errors:
                print(terminal(f"  LEFT OUT {key}: {error}"), file=sys.stderr)
        if args.prepare_only:
            return 0
        server = make_server(review_dir, LOOPBACK, args.port)
    except (SourceError, ReviewServerError, StoreError, ValueError) as e:
        print(f"{prog}: {terminal_lines(e)}", file=sys.stderr)
        return 2
    port = server.server_address[1]
    app = server.app
    base = f"http://{LOOPBACK}:{port}"
    print(f"serving the review on {base}/ (this machine only); Ctrl-C to stop")
    if app.tightened:
        print(f"note: {review_dir} was readable by other users; it is now owner-only (mode 0700)")
    print("each annotator's personal link (it opens their cases only; give it to them alone):")
    for a in app.annotators:
        print(f"  annotator {a}: {app.access.link(base, a)}  ({len(app.assigned[a])} cases)")
    print(
        f"the links are kept in {app.access.path} (owner-only); from another machine: "
        f"ssh -L {port}:{LOOPBACK}:{port} this-host, then open the link there"
    )
    print(
        f"decisions: {terminal(review_dir)}/decisions/<annotator>.jsonl; afterwards: chexpercept review export "
        f"{shell_word(review_dir)}"
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped; every acknowledged decision is on disk")
    finally:
        server.server_close()
    return 0
