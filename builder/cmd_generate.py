"""``chexpercept generate``: regenerate the benchmark (a release bundle) from PhysioNet sources."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from chexpercept.cli_options import add_option, add_progress_option, progress_enabled
from chexpercept.domains import config_yaml_loader
from chexpercept.escape import terminal, terminal_lines
from chexpercept.input_files import TEXT_FILE, read_input_text
from chexpercept.vocab import LESIONS

from .config import NUMBER_DOMAINS, GenerateConfig
from .deformers import DEFORMERS, implementations
from .pipeline import generate
from .regions import PARTITION_MODES
from .sources import SourceError
from .workspace import Workspace


def _load_yaml(path: str) -> dict:
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - pyyaml is in the test extra
        raise SourceError("--config needs PyYAML (pip install pyyaml)") from e
    try:
        text = read_input_text(path, TEXT_FILE, what="--config")
    except (OSError, ValueError) as e:
        raise SourceError(f"--config {path}: {e}") from e
    try:
        data = yaml.load(text, Loader=config_yaml_loader()) or {}  # a SafeLoader
    except (yaml.YAMLError, RecursionError) as e:
        raise SourceError(f"--config {path}: not readable YAML ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise SourceError(f"--config {path}: expected a mapping of option: value")
    return data


def add_candidate_sources(group: Any, *, rosalia_help: str) -> None:
    """The inputs candidates are chosen from (``generate`` and ``review`` spell them alike): the CXRs
    (--mimic-cxr-jpg or --cxr-png), --mimic-ils, --lesion-masks, --rosalia-pred."""
    cxr = group.add_mutually_exclusive_group()
    cxr.add_argument(
        "--mimic-cxr-jpg", metavar="DIR", help="MIMIC-CXR-JPG root (files/pXX/pXXXXXXXX/sXXXXXXXX/*.jpg)"
    )
    cxr.add_argument(
        "--cxr-png", metavar="DIR", help="flat folder of 1024x1024 <dicom_id>.png (the reference's layout)"
    )
    group.add_argument(
        "--mimic-ils", metavar="DIR", help="MIMIC-ILS root (mimic_ils_instruction_answer.json, lesion_mask/)"
    )
    group.add_argument(
        "--lesion-masks", metavar="DIR", help="lesion mask root (default: MIMIC-ILS lesion_mask/)"
    )
    group.add_argument("--rosalia-pred", metavar="DIR", help=rosalia_help)


def configure(parser: argparse.ArgumentParser) -> None:
    src = parser.add_argument_group("inputs")
    add_candidate_sources(
        src, rosalia_help="use the reference's ROSALIA predictions <lesion>/<pair_id>/pred_mask.png"
    )
    src.add_argument(
        "--anatomy",
        metavar="PATH",
        help="lung masks: per-image folders <dicom_id>/{right_lung,left_lung}.png, or the CheXmask CSV table "
        "(MIMIC-CXR-JPG.csv[.gz], OriginalResolution) or its download folder",
    )
    src.add_argument(
        "--cxas", metavar="DIR", help="optional CXAS masks <dicom_id>/{right lung,left lung}.png, intersected"
    )
    src.add_argument(
        "--review",
        metavar="CSV",
        nargs="+",
        default=[],
        help="expert review sheets (key_id, optimal?) selecting cases",
    )
    src.add_argument("--config", metavar="YAML", help="options as YAML (keys are the long option names)")
    out = parser.add_argument_group("output")
    add_option(
        out, "--output-dir", "--out", dest="out", metavar="DIR", help="bundle folder to write (resumable)"
    )
    out.add_argument(
        "--per-cell",
        type=NUMBER_DOMAINS["per_cell"],
        default=None,
        help="cases per (lesion, path) cell (100 in the release)",
    )
    out.add_argument("--seed", type=NUMBER_DOMAINS["seed"], default=None, help="random seed (default 0)")
    out.add_argument("--lesions", nargs="+", metavar="LESION", help=f"subset of {', '.join(LESIONS)}")
    out.add_argument(
        "--neutral-option-names",
        action="store_true",
        default=None,
        help="name revision option images option_<i>_mask.png (the reference's names reveal the answer)",
    )
    out.add_argument(
        "--overwrite", action="store_true", default=None, help="discard an earlier run in --output-dir"
    )
    run = parser.add_argument_group("method and execution")
    run.add_argument(
        "--deformer", choices=DEFORMERS, default=None, help="mask deformation (default morphology)"
    )
    run.add_argument(
        "--sam3-checkpoint",
        metavar="PATH_OR_ID",
        help="transformers: Sam3TrackerModel weights (folder or Hub id); meta: Meta's checkpoint file (sam3.pt)",
    )
    run.add_argument(
        "--sam3-impl",
        choices=implementations("sam3"),
        default=None,
        help="SAM 3 implementation: transformers (default) or meta (Meta's sam3 package, "
        "pip install 'chexpercept[sam3-meta]' or scripts/setup_sam3_meta.sh)",
    )
    run.add_argument("--device", help="torch device for sam3 (default: cuda if available, else cpu)")
    run.add_argument(
        "--partition",
        choices=PARTITION_MODES,
        default=None,
        help="lung partition: reference (default, as published) or corrected (per-side footprint)",
    )
    run.add_argument(
        "--num-proc", type=NUMBER_DOMAINS["num_proc"], default=None, help="worker processes (default 1)"
    )
    run.add_argument("--fail-fast", action="store_true", default=None, help="stop at the first failing case")
    add_progress_option(run, default=None)


def build_config(args: argparse.Namespace) -> GenerateConfig:
    values: dict = {}
    if args.config:
        for key, value in _load_yaml(args.config).items():
            name = str(key).replace("-", "_")
            name = "out" if name == "output_dir" else name  # the option's name; "out" its earlier one
            if name in values:  # per-cell and per_cell, out and output_dir: one would silently win
                raise SourceError(f"--config {args.config}: {name.replace('_', '-')} is given twice")
            values[name] = value
    for key, value in vars(args).items():
        if key == "config" or value is None or value == []:
            continue
        values[key] = value
    if isinstance(values.get("review"), str):
        values["review"] = [values["review"]]
    progress = values.pop("progress", True)
    if not isinstance(progress, bool):  # a switch is true or false (``off`` and ``no`` are strings here)
        raise SourceError(
            f"--progress in --config {args.config} must be true or false, got {terminal(repr(progress))}"
        )
    no_progress = values.pop("no_progress", False) or not progress
    if "out" not in values or "per_cell" not in values:
        raise SourceError("--output-dir and --per-cell are required")
    known = set(GenerateConfig.__dataclass_fields__)
    unknown = sorted(set(values) - known)
    if unknown:
        raise SourceError(f"unknown option(s) in --config: {', '.join(unknown)}")
    _check_types(values, args.config)
    return GenerateConfig(**values, progress=progress_enabled({"no_progress": no_progress}))


def _check_types(values: dict, source: str | None) -> None:
    """SourceError naming the option when a value (from --config: YAML may give "7" or [1] for a
    number) is not of the type GenerateConfig declares for it (an int is never a bool)."""
    import types
    import typing

    hints = typing.get_type_hints(GenerateConfig)
    for key, value in values.items():
        hint = hints[key]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        allowed = typing.get_args(hint) if union else (hint,)
        ok = any(
            value is None
            if t is type(None)
            else isinstance(value, list) and all(isinstance(v, str) for v in value)
            if typing.get_origin(t) is list
            else isinstance(value, t) and not (t is int and isinstance(value, bool))
            for t in allowed
        )
        if not ok:
            domain = NUMBER_DOMAINS.get(key)
            names = " or ".join(_type_words(t) for t in allowed)
            where = f" in --config {source}" if source else ""
            must = domain.describe() if domain is not None else names
            raise SourceError(f"--{key.replace('_', '-')}{where} must be {must}, got {terminal(repr(value))}")


def _type_words(kind: object) -> str:
    """A config value's type in words: "true or false", "a number", "a list of strings"..."""
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "a string",
             type(None): "empty (null)"}  # fmt: skip
    if kind in words:
        return words[kind]  # type: ignore[index]
    return (
        "a list of strings"
        if getattr(kind, "__origin__", None) is list
        else getattr(kind, "__name__", str(kind))
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = build_config(args)
        summary = generate(config)
    except SourceError as e:
        print(f"chexpercept generate: {terminal_lines(e)}", file=sys.stderr)
        return 2
    print(summary.text())
    print(f"report: {Workspace(summary.out).summary_file}")
    return summary.exit_code
