"""``chexpercept validate DATA_DIR`` (or ``--data-dir DATA_DIR``): check a bundle the way the loader does, or more thoroughly."""

from __future__ import annotations

import argparse
import sys

from .bundle import CHECKSUMS_NAME, read_bundle
from .cli_options import add_data_dir_option, data_dir_of
from .errors import BundleValidationError, ReleaseNotFoundError
from .escape import terminal_lines


def configure(parser: argparse.ArgumentParser) -> None:
    add_data_dir_option(parser, positional=True)
    parser.add_argument("--full", action="store_true", help="decode every image (slower)")
    parser.add_argument("--checksums", action="store_true", help="verify files against SHA256SUMS.txt")


def run(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args, "chexpercept validate")
    if not data_dir:
        return 2
    try:
        bundle = read_bundle(
            data_dir, check_images="full" if args.full else "basic", verify_checksums=args.checksums
        )
    except (BundleValidationError, ReleaseNotFoundError) as e:
        print(terminal_lines(e), file=sys.stderr)
        return 1
    if args.checksums and not (bundle.root / CHECKSUMS_NAME).exists():
        print(f"note: {bundle.root} has no {CHECKSUMS_NAME}: no checksum was verified", file=sys.stderr)
    kind = "phantom (synthetic)" if bundle.synthetic else "release"
    n_items = sum(len(c.tasks) for c in bundle.cases)
    print(f"OK: {len(bundle)} cases, {n_items} questions ({kind} bundle at {bundle.root})")
    return 0
