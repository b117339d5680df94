"""``chexpercept push-results RUNS_DIR --repo ORG/NAME [--private] [--dry-run]``: publish scores (flat
metrics, tables, intervals, leaderboard, provenance, a dataset card) to a Hugging Face Hub dataset
repo. Nothing derived from the credentialed data is uploaded: a guard checks every staged file."""

from __future__ import annotations

import argparse
import sys
import tempfile


def configure(parser: argparse.ArgumentParser) -> None:
    from chexpercept.answers import PARSE_MODES

    parser.add_argument(
        "runs_dir", metavar="RUNS_DIR", help="folder of runs: <model>/oracle_<setting>/ (chexpercept run)"
    )
    parser.add_argument("--repo", required=True, metavar="ORG/NAME", help="Hub dataset repo to publish to")
    parser.add_argument("--private", action="store_true", help="create the repo as private (if it is new)")
    parser.add_argument(
        "--dry-run", action="store_true", help="list exactly what would be uploaded; upload nothing"
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        help="keep the staged files in DIR (must be empty or new) instead of a temporary folder",
    )
    parser.add_argument(
        "--parse-mode", choices=PARSE_MODES, default="reference", help="answer parsing (default: reference)"
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="N",
        help="bootstrap replicates (default 1000; 0 = none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path as FsPath

    from .push_results import PushRefused, check_staging, stage, upload

    if "/" not in args.repo or args.repo.count("/") != 1:
        print(f"chexpercept push-results: --repo must be ORG/NAME, got {args.repo!r}", file=sys.stderr)
        return 2
    if args.bootstrap < 0:
        print("chexpercept push-results: --bootstrap must be 0 or more", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="chexpercept-push-") as tmp:
        staging = FsPath(args.output_dir) if args.output_dir else FsPath(tmp) / "staging"
        if staging.exists() and any(staging.iterdir()):
            print(f"chexpercept push-results: {staging} is not empty", file=sys.stderr)
            return 2
        try:
            staged = stage(
                args.runs_dir,
                staging,
                parse_mode=args.parse_mode,
                bootstrap=args.bootstrap,
                seed=args.seed,
                repo=args.repo,
            )
            files = check_staging(staging)
        except PushRefused as e:
            print(f"chexpercept push-results: {e}", file=sys.stderr)
            return 2
        except (ValueError, FileNotFoundError) as e:
            print(f"chexpercept push-results: error: {e}", file=sys.stderr)
            return 2
        size = sum((staging / f).stat().st_size for f in files)
        verb = "would upload" if args.dry_run else "uploading"
        print(
            f"{verb} {len(files)} files ({size} bytes) for {len(staged.models)} model(s) to dataset {args.repo}:"
        )
        for f in files:
            print(f"  {f}")
        if args.dry_run:
            return 0
        try:
            url = upload(staging, args.repo, private=args.private)
        except PushRefused as e:
            print(f"chexpercept push-results: {e}", file=sys.stderr)
            return 2
        except Exception as e:  # the Hub's errors (auth, network) as one line
            print(f"chexpercept push-results: upload failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    print(f"done: {url}")
    return 0
