"""``chexpercept push-results RUNS_DIR (--repo ORG/NAME | --model-repo ORG/MODEL --benchmark ORG/NAME)``.

With ``--repo``: scores (flat metrics, tables, intervals, leaderboard, provenance, a dataset card)
committed to a Hub dataset repo of our own format. With ``--model-repo``: the Hub's Eval Results, one
``.eval_results/*.yaml`` file per variant of one model's runs, proposed as a pull request on the model
repo (never a direct push), so the scores show on the model page and on the benchmark's leaderboard.
Either way only the files the stager wrote go, each checked against its schema and against the
bundle's own case identifiers (metrics/hub/guard.py) right before the upload.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from chexpercept.domains import COUNT_OR_NONE, SEED
from chexpercept.escape import terminal, terminal_lines

PROG = "chexpercept push-results"


def configure(parser: argparse.ArgumentParser) -> None:
    from chexpercept.cli_options import add_data_dir_option, add_parse_mode_option

    parser.add_argument(
        "runs_dir", metavar="RUNS_DIR", help="folder of runs: <model>/oracle_<setting>/ (chexpercept run)"
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", metavar="ORG/NAME", help="Hub dataset repo of scores to commit to")
    where.add_argument(
        "--model-repo",
        metavar="ORG/MODEL",
        help="the model's Hub repo: open a pull request adding .eval_results/ files (RUNS_DIR: one model)",
    )
    parser.add_argument(
        "--benchmark",
        metavar="ORG/NAME",
        help="with --model-repo: the benchmark dataset repo the results are for (chexpercept benchmark-card)",
    )
    parser.add_argument(
        "--source-url",
        metavar="URL",
        help="with --model-repo: the link each result's source gives (default: the benchmark's Hub page)",
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="[FOLDER=]LABEL",
        help="with --repo: publish the model of results folder FOLDER (RUNS_DIR/FOLDER; FOLDER= may be left "
        "out when RUNS_DIR holds one model) as LABEL: a letter, then letters, digits, '.' and '-', at most "
        "24 characters. A model outside the registry and the baselines is published only under such a name, "
        "never under the name its runs hold",
    )
    parser.add_argument(
        "--allow-synthetic",
        action="store_true",
        help="with --model-repo: stage runs made on a phantom bundle too (tests, demos; the notes say so)",
    )
    parser.add_argument(
        "--private", action="store_true", help="with --repo: create the repo as private (if it is new)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list exactly what would be uploaded (with --model-repo: print the YAML); upload nothing",
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
    add_parse_mode_option(parser)
    parser.add_argument(
        "--bootstrap",
        type=COUNT_OR_NONE,
        default=None,
        metavar="N",
        help="with --repo: 0 leaves the intervals out; any other number keeps them (they are design-based "
        "and need no resampling: the number is not used)",
    )
    parser.add_argument("--seed", type=SEED, default=None, help=argparse.SUPPRESS)  # no resampling: unused


def _fail(message: str, code: int = 2) -> int:
    print(f"{PROG}: {terminal_lines(message)}", file=sys.stderr)
    return code


def _misused(args: argparse.Namespace) -> str | None:
    """An option given that the chosen mode does not take, or a repo id of the wrong shape."""
    from chexpercept.metrics.hub.names import NameRefused, check_repo_id

    for flag, value in (
        ("--repo", args.repo),
        ("--model-repo", args.model_repo),
        ("--benchmark", args.benchmark),
    ):
        if value is not None:
            try:
                check_repo_id(value, flag)
            except NameRefused as e:
                return str(e)
    if args.model_repo:
        if not args.benchmark:
            return "--model-repo needs --benchmark ORG/NAME (the benchmark dataset repo, see benchmark-card)"
        options = (
            ("--private", args.private),
            ("--bootstrap", args.bootstrap is not None),
            ("--seed", args.seed is not None),
            ("--name", bool(args.name)),
        )
        given = [f for f, v in options if v]
        return f"{', '.join(given)} apply only to --repo" if given else None
    given = [
        f
        for f, v in (
            ("--benchmark", args.benchmark),
            ("--source-url", args.source_url),
            ("--allow-synthetic", args.allow_synthetic),
        )
        if v
    ]
    if given:
        return f"{', '.join(given)} apply only to --model-repo"
    return None


def run(args: argparse.Namespace) -> int:
    from pathlib import Path as FsPath

    from chexpercept.metrics.hub.guard import PushRefused

    problem = _misused(args)
    if problem:
        return _fail(problem)
    with tempfile.TemporaryDirectory(prefix="chexpercept-push-") as tmp:
        staging = FsPath(args.output_dir) if args.output_dir else FsPath(tmp) / "staging"
        try:
            if args.model_repo:
                return _model_repo(args, staging)
            return _dataset_repo(args, staging)
        except PushRefused as e:
            return _fail(str(e))
        except (ValueError, FileNotFoundError) as e:
            return _fail(f"error: {e}")


def _dataset_repo(args: argparse.Namespace, staging) -> int:
    from chexpercept.metrics.hub.commit import preview_then_commit
    from chexpercept.metrics.hub.push_results import stage, upload

    staged = stage(
        args.runs_dir,
        staging,
        parse_mode=args.parse_mode,
        bootstrap=1000 if args.bootstrap is None else args.bootstrap,
        seed=args.seed or 0,
        repo=args.repo,
        bundle=args.data_dir,
        names=dict(n.partition("=")[::2] if "=" in n else ("", n) for n in args.name),
    )
    files = staged.verify()
    size = sum(len(b) for b in files.values())
    verb = "would upload" if args.dry_run else "uploading"
    heading = (
        f"{verb} {len(files)} files ({size} bytes) for {len(staged.models)} model(s) to dataset {args.repo}:"
    )
    return preview_then_commit(
        files,
        heading,
        dry_run=args.dry_run,
        commit=lambda: upload(staged, args.repo, private=args.private),
        contents=False,
        prog=PROG,
    )


def _model_repo(args: argparse.Namespace, staging) -> int:
    from chexpercept.metrics.hub.commit import preview_then_commit, upload
    from chexpercept.metrics.hub.eval_results import (
        default_source_url,
        model_folder,
        pr_description,
        stage_eval_results,
    )

    folder = model_folder(args.runs_dir)
    staged = stage_eval_results(
        folder,
        staging,
        benchmark=args.benchmark,
        source_url=args.source_url or default_source_url(args.benchmark),
        parse_mode=args.parse_mode,
        bundle=args.data_dir,
        allow_synthetic=args.allow_synthetic,
        model_repo=args.model_repo,
    )
    files = staged.verify()
    for note in staged.notes:
        print(f"note: {terminal(note)}")
    verb = "would open" if args.dry_run else "opening"
    heading = (
        f"{verb} a pull request on model {args.model_repo} adding {len(files)} file(s) "
        f"for benchmark {args.benchmark}:"
    )

    def commit() -> str:
        done = upload(
            staged.manifest,
            args.model_repo,
            repo_type="model",
            create_pr=True,
            message="Add CheXpercept evaluation results",
            description=pr_description(staged, args.benchmark),
        )
        return f"pull request {done.pr_url}"

    return preview_then_commit(files, heading, dry_run=args.dry_run, commit=commit, prog=PROG)
