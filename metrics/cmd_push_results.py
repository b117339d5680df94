"""``chexpercept push-results RUNS_DIR --repo ORG/NAME [--private] [--dry-run]``: publish scores (flat
metrics, tables, intervals, leaderboard, provenance, a dataset card) to a Hugging Face Hub dataset
repo. Nothing derived from the credentialed data is uploaded: only the files the stager wrote go, each
checked against its schema and against the bundle's own case identifiers (metrics/hub/guard.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile

PROG = "chexpercept push-results"


def configure(parser: argparse.ArgumentParser) -> None:
    from chexpercept.cli_options import add_data_dir_option, add_parse_mode_option

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
    add_data_dir_option(
        parser,
        help="the bundle the runs were made on (default: the one run.json names); the upload is checked "
        "against its case identifiers, so it must be on this disk",
    )
    add_parse_mode_option(parser, help="answer parsing (default: reference)")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="N",
        help="bootstrap replicates (default 1000; 0 = none)",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def _fail(message: str, code: int = 2) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    from pathlib import Path as FsPath

    from .hub.guard import PushRefused
    from .push_results import stage, upload

    if args.repo.count("/") != 1:
        return _fail(f"--repo must be ORG/NAME, got {args.repo!r}")
    if args.bootstrap < 0:
        return _fail("--bootstrap must be 0 or more")
    with tempfile.TemporaryDirectory(prefix="chexpercept-push-") as tmp:
        staging = FsPath(args.output_dir) if args.output_dir else FsPath(tmp) / "staging"
        try:
            staged = stage(
                args.runs_dir,
                staging,
                parse_mode=args.parse_mode,
                bootstrap=args.bootstrap,
                seed=args.seed,
                repo=args.repo,
                bundle=args.data_dir,
            )
            files = staged.verify()
        except PushRefused as e:
            return _fail(str(e))
        except (ValueError, FileNotFoundError) as e:
            return _fail(f"error: {e}")
        size = sum(len(b) for b in files.values())
        verb = "would upload" if args.dry_run else "uploading"
        print(
            f"{verb} {len(files)} files ({size} bytes) for {len(staged.models)} model(s) to dataset {args.repo}:"
        )
        for f in files:
            print(f"  {f}")
        if args.dry_run:
            return 0
        try:
            url = upload(staged, args.repo, private=args.private)
        except PushRefused as e:
            return _fail(str(e))
        except Exception as e:  # the Hub's errors (auth, network) as one line
            return _fail(f"upload failed: {type(e).__name__}: {e}", 1)
    print(f"done: {url}")
    return 0
