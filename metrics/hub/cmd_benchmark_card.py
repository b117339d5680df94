"""``chexpercept benchmark-card --repo ORG/NAME``: the metadata-only benchmark dataset repo on the Hub.

Commits README.md (the toolkit's dataset card: how to get credentialed access, ``load_dataset``
usage, the task ids) and eval.yaml (the Hub's benchmark registration naming the task ids the
``.eval_results/`` files of ``push-results --model-repo`` use). No data: the release stays on
PhysioNet. Both files go through the upload guard (metrics/hub/guard.py)."""

from __future__ import annotations

import argparse
import sys
import tempfile

from chexpercept.escape import terminal_lines

PROG = "chexpercept benchmark-card"


def configure(parser: argparse.ArgumentParser) -> None:
    from chexpercept.cli_options import add_data_dir_option
    from chexpercept.metrics.hub import DEFAULT_FRAMEWORK

    parser.add_argument(
        "--repo", required=True, metavar="ORG/NAME", help="the benchmark dataset repo to commit to"
    )
    parser.add_argument("--private", action="store_true", help="create the repo as private (if it is new)")
    parser.add_argument(
        "--evaluation-framework",
        default=DEFAULT_FRAMEWORK,
        metavar="NAME",
        help=f"eval.yaml's evaluation_framework (default: {DEFAULT_FRAMEWORK}; the Hub accepts the names "
        "listed in huggingface.js packages/tasks/src/eval.ts)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print both files; upload nothing")
    parser.add_argument(
        "--output-dir", metavar="DIR", help="keep the staged files in DIR (must be empty or new)"
    )
    add_data_dir_option(
        parser, help="a bundle to check the files against too (optional: they are fixed text)"
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path as FsPath

    from chexpercept.metrics.hub.benchmark_card import stage_benchmark_card
    from chexpercept.metrics.hub.commit import preview_then_commit, upload
    from chexpercept.metrics.hub.identifiers import Identifiers

    if args.repo.count("/") != 1:
        print(f"{PROG}: --repo must be ORG/NAME, got {args.repo!r}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="chexpercept-card-") as tmp:
        staging = FsPath(args.output_dir) if args.output_dir else FsPath(tmp) / "staging"
        try:
            ids = Identifiers.from_bundle(args.data_dir) if args.data_dir else None
            manifest = stage_benchmark_card(
                staging, repo=args.repo, framework=args.evaluation_framework, identifiers=ids
            )
            files = manifest.verify()
        except (ValueError, FileNotFoundError) as e:  # PushRefused is a ValueError
            print(f"{PROG}: {terminal_lines(e)}", file=sys.stderr)
            return 2
        verb = "would commit" if args.dry_run else "committing"
        heading = f"{verb} {len(files)} files to dataset {args.repo} (no data):"

        def commit() -> str:
            done = upload(
                manifest,
                args.repo,
                repo_type="dataset",
                private=args.private,
                message="CheXpercept benchmark card and eval.yaml (chexpercept benchmark-card)",
            )
            return done.commit_url

        try:
            return preview_then_commit(files, heading, dry_run=args.dry_run, commit=commit, prog=PROG)
        except (ValueError, FileNotFoundError) as e:  # PushRefused is a ValueError
            print(f"{PROG}: {terminal_lines(e)}", file=sys.stderr)
            return 2
