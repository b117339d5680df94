"""Command-line options that several commands share, so that one option means one thing everywhere."""

from __future__ import annotations

import argparse
from typing import Any

PROGRESS_HELP = "no progress bar (by default a progress bar goes to stderr)"


def add_progress_option(parser: Any, *, default: Any = False) -> None:
    """``--no-progress`` on ``parser`` (a parser or an argument group); ``default=None`` for commands
    that merge their options with a config file."""
    parser.add_argument("--no-progress", action="store_true", default=default, help=PROGRESS_HELP)


def progress_enabled(args: argparse.Namespace | dict[str, Any]) -> bool:
    """True unless ``--no-progress`` was given."""
    value = args.get("no_progress") if isinstance(args, dict) else getattr(args, "no_progress", False)
    return not value
