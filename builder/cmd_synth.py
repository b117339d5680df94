"""``chexpercept synth``: a phantom release bundle (synth-sources + generate --deformer morphology)."""

from __future__ import annotations

import argparse
import sys

from chexpercept.cli_options import progress_enabled, require
from chexpercept.escape import terminal_lines

from .cmd_synth_sources import add_phantom_arguments
from .regions import PARTITION_MODES
from .sources import SourceError
from .synth import synthesize_run


def configure(parser: argparse.ArgumentParser) -> None:
    add_phantom_arguments(
        parser, out_help="bundle folder to write", per_cell_help="cases per (lesion, path) cell (21 cells)"
    )
    parser.add_argument(
        "--partition",
        choices=PARTITION_MODES,
        default="reference",
        help="lung partition: reference (default, as published) or corrected (per-side footprint)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="discard an earlier bundle with other settings"
    )


def run(args: argparse.Namespace) -> int:
    require(args, "chexpercept synth", "--output-dir", dest="out")
    try:
        summary = synthesize_run(
            args.out,
            per_cell=args.per_cell,
            seed=args.seed,
            num_proc=args.num_proc,
            lesions=tuple(args.lesions),
            partition=args.partition,
            overwrite=args.overwrite,
            progress=progress_enabled(args),
        )
    except (SourceError, ValueError) as e:
        print(f"chexpercept synth: {terminal_lines(e)}", file=sys.stderr)
        return 2
    print(summary.text())
    return summary.exit_code
