"""``chexpercept synth-sources``: phantom MIMIC-CXR-JPG, MIMIC-ILS and anatomy folders (testing only)."""

from __future__ import annotations

import argparse
import sys

from chexpercept.cli_options import add_option, add_progress_option, progress_enabled, require
from chexpercept.domains import COUNT, PROCESSES, SEED
from chexpercept.escape import shell_word, terminal, terminal_lines
from chexpercept.fileio import claim_output_dir
from chexpercept.vocab import LESIONS

from .synth_sources import ANATOMY_FORMATS, CHEXMASK_NAME, synthesize_sources


def add_phantom_arguments(parser: argparse.ArgumentParser, *, out_help: str, per_cell_help: str) -> None:
    """The options `synth` and `synth-sources` share (synth passes them on to synth-sources)."""
    add_option(parser, "--output-dir", "--out", dest="out", metavar="DIR", help=f"{out_help} (required)")
    parser.add_argument("--per-cell", type=COUNT, default=1, help=per_cell_help)
    parser.add_argument("--seed", type=SEED, default=0, help="random seed (default 0)")
    parser.add_argument("--num-proc", type=PROCESSES, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--lesions",
        nargs="+",
        default=list(LESIONS),
        metavar="LESION",
        help="subset of lesions (default: all seven)",
    )
    add_progress_option(parser)


def configure(parser: argparse.ArgumentParser) -> None:
    add_phantom_arguments(
        parser,
        out_help="folder to write the three source folders into",
        per_cell_help="cases per (lesion, path) cell to provide for",
    )
    parser.add_argument(
        "--anatomy-format",
        choices=ANATOMY_FORMATS,
        default="folders",
        help="per-image mask folders (CheXmask-U output) or a CheXmask-style CSV table",
    )
    parser.add_argument("--with-cxas", action="store_true", help="also write CXAS-style lung masks (cxas/)")
    parser.add_argument(
        "--layout",
        choices=("physionet", "reference"),
        default="physionet",
        help="physionet (default: MIMIC-CXR-JPG tree, anatomy/) or the reference implementation's folders "
        "(mimic_cxr/<dicom_id>.png, chexmasku_pred/, cxas_pred/, rosalia_pred/)",
    )


#: the file that marks a folder as phantom sources written here: a rerun writes there, nothing else
SOURCES_MARKER = ".chexpercept-phantom-sources"


def run(args: argparse.Namespace) -> int:
    require(args, "chexpercept synth-sources", "--output-dir", dest="out")
    claim_output_dir(args.out, SOURCES_MARKER)  # a folder of real PhysioNet files is never written over
    if args.layout == "reference":
        return _run_reference(args)
    try:
        root = synthesize_sources(
            args.out,
            per_cell=args.per_cell,
            seed=args.seed,
            num_proc=args.num_proc,
            lesions=tuple(args.lesions),
            anatomy_format=args.anatomy_format,
            with_cxas=args.with_cxas,
            progress=progress_enabled(args),
        )
    except ValueError as e:
        print(f"chexpercept synth-sources: {terminal_lines(e)}", file=sys.stderr)
        return 2
    anatomy = root / "anatomy" / CHEXMASK_NAME if args.anatomy_format == "chexmask-csv" else root / "anatomy"
    print(f"phantom sources (testing only) written to {terminal(root)}")
    print(
        f"next: chexpercept generate --mimic-cxr-jpg {shell_word(root / 'mimic-cxr-jpg')} --mimic-ils "
        f"{shell_word(root / 'mimic-ils')} --anatomy {shell_word(anatomy)} --output-dir BUNDLE --per-cell {args.per_cell}"
    )
    return 0


def _run_reference(args: argparse.Namespace) -> int:
    from .reference_layout import write_reference_layout

    try:
        root = write_reference_layout(
            args.out,
            per_cell=args.per_cell,
            seed=args.seed,
            lesions=tuple(args.lesions),
            progress=progress_enabled(args),
        )
    except ValueError as e:
        print(f"chexpercept synth-sources: {terminal_lines(e)}", file=sys.stderr)
        return 2
    print(f"phantom sources in the reference layout (testing only) written to {terminal(root)}")
    print(
        f"next: chexpercept generate --cxr-png {shell_word(root / 'mimic_cxr')} --mimic-ils "
        f"{shell_word(root / 'mimic_ils')} --anatomy {shell_word(root / 'chexmasku_pred')} --cxas "
        f"{shell_word(root / 'cxas_pred')} [--rosalia-pred {shell_word(root / 'rosalia_pred')}] --output-dir "
        f"BUNDLE --per-cell {args.per_cell}"
    )
    return 0
