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
    import importlib.util

    from chexpercept.extras import needs

    from .evaluate_support import METRIC_PATH, install_metric

    dest = install_metric(args.modules_cache)
    print(f"installed {METRIC_PATH.name} to {dest}")
    if importlib.util.find_spec("evaluate") is None:  # the core install: the module waits for evaluate
        print(
            f'evaluate.load("chexpercept_metric") works offline with this HF_HOME once evaluate is here; {needs("evaluate")}'
        )
        return 0
    print('evaluate.load("chexpercept_metric") now works offline with this HF_HOME')
    return 0
