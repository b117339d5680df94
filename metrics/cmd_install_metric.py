"""``chexpercept install-metric``: copy the evaluate module where ``evaluate.load`` finds it by name."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--modules-cache",
        default=None,
        help="evaluate's modules cache (default: $HF_MODULES_CACHE, else $HF_HOME/modules)",
    )


def run(args: argparse.Namespace) -> int:
    from .evaluate_support import METRIC_PATH, install_metric

    dest = install_metric(args.modules_cache)
    print(f"installed {METRIC_PATH.name} to {dest}")
    print('evaluate.load("chexpercept_metric") now works offline with this HF_HOME')
    return 0
