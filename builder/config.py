"""``GenerateConfig``: the settings of one ``generate`` run, checking itself.

The command line maps onto the dataclass one to one; ``check`` rejects bad or missing options before
anything is read, and ``fingerprint`` names the settings that decide the bundle's content (a
rerun must match them to resume).
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

import chexpercept
from chexpercept.domains import COUNT, PROCESSES, SEED
from chexpercept.escape import terminal
from chexpercept.input_files import SOURCE_TABLE, read_input
from chexpercept.vocab import LESIONS

from .deformers import DEFORMERS, implementations
from .regions import PARTITION_MODES
from .sources import ILS_MASK_DIR, SourceError

#: the settings that decide the bundle's content, in the order run.json has always listed them
FINGERPRINT_KEYS = (
    "per_cell",
    "seed",
    "mimic_cxr_jpg",
    "cxr_png",
    "mimic_ils",
    "lesion_masks",
    "rosalia_pred",
    "anatomy",
    "cxas",
    "lesions",
    "deformer",
    "sam3_checkpoint",
    "partition",
    "neutral_option_names",
)
#: the domain of each number setting: the command line's types and ``check`` (for --config) alike
NUMBER_DOMAINS = {"per_cell": COUNT, "seed": SEED, "num_proc": PROCESSES}
#: the fingerprint's input paths, recorded resolved
FINGERPRINT_PATHS = (
    "mimic_cxr_jpg",
    "cxr_png",
    "mimic_ils",
    "lesion_masks",
    "rosalia_pred",
    "anatomy",
    "cxas",
)


def parse_lesions(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``--lesions`` in the benchmark's order (SourceError for an unknown name or an empty list)."""
    asked = {x.lower() for x in names}
    lesions = tuple(name for name in LESIONS if name in asked)
    unknown = sorted(asked - set(LESIONS))
    if unknown or not lesions:
        raise SourceError(
            f"unknown lesion(s) {', '.join(unknown) or '(none given)'}; expected {', '.join(LESIONS)}"
        )
    return lesions


def check_cxr_choice(mimic_cxr_jpg: str | None, cxr_png: str | None) -> None:
    """Exactly one CXR source (shared by ``generate`` and ``review prepare``)."""
    if bool(mimic_cxr_jpg) == bool(cxr_png):
        raise SourceError(
            "give exactly one of --mimic-cxr-jpg (the JPG tree) or --cxr-png (flat 1024x1024 PNGs)"
        )


def check_ils_given(mimic_ils: str | None) -> None:
    """--mimic-ils must be given (shared by ``generate`` and ``review prepare``)."""
    if not mimic_ils:
        raise SourceError("--mimic-ils is required")


def lesion_mask_root(mimic_ils: str, lesion_masks: str | None) -> str:
    """--lesion-masks, or the lesion_mask/ folder beside the MIMIC-ILS JSON (or inside its folder)."""
    ils_root = FsPath(mimic_ils)
    ils_root = ils_root if ils_root.is_dir() else ils_root.parent
    return lesion_masks or str(ils_root / ILS_MASK_DIR)


@dataclass
class GenerateConfig:
    """Everything ``generate`` needs; the command line maps onto this one to one."""

    out: str
    per_cell: int
    seed: int = 0
    mimic_cxr_jpg: str | None = None
    cxr_png: str | None = None
    mimic_ils: str | None = None
    lesion_masks: str | None = None
    rosalia_pred: str | None = None
    anatomy: str | None = None
    cxas: str | None = None
    review: list[str] = field(default_factory=list)
    lesions: list[str] = field(default_factory=lambda: list(LESIONS))
    deformer: str = "morphology"
    sam3_checkpoint: str | None = None
    sam3_impl: str = "transformers"
    device: str | None = None
    num_proc: int = 1
    fail_fast: bool = False
    partition: str = "reference"
    neutral_option_names: bool = False
    overwrite: bool = False
    progress: bool = True

    def check(self) -> None:
        """Raise SourceError for a bad or missing option; the sources are checked as ``generate`` reads them."""
        for name, domain in NUMBER_DOMAINS.items():  # --config gives values argparse never saw
            problem = domain.problem(getattr(self, name))
            if problem:
                flag = "--" + name.replace("_", "-")
                raise SourceError(f"{flag} {problem}, got {terminal(repr(getattr(self, name)))}")
        if self.deformer not in DEFORMERS:
            raise SourceError(f"--deformer must be one of {', '.join(DEFORMERS)}")
        if self.partition not in PARTITION_MODES:
            raise SourceError(f"--partition must be one of {', '.join(PARTITION_MODES)}")
        self.selected_lesions()
        check_cxr_choice(self.mimic_cxr_jpg, self.cxr_png)
        check_ils_given(self.mimic_ils)
        if not self.anatomy:
            raise SourceError("--anatomy is required: per-image mask folders or the CheXmask table")
        if self.deformer == "sam3":
            if self.sam3_impl not in implementations("sam3"):
                raise SourceError(f"--sam3-impl must be one of {', '.join(implementations('sam3'))}")
            if self.sam3_impl == "meta":
                _check_meta_checkpoint(self.sam3_checkpoint)
            else:
                _check_checkpoint(self.sam3_checkpoint)

    def selected_lesions(self) -> tuple[str, ...]:
        """The lesions asked for, in the benchmark's order (SourceError for an unknown or empty list)."""
        return parse_lesions(self.lesions)

    def deformer_options(self) -> dict[str, Any]:
        """The keyword arguments of ``make_deformer`` besides the name."""
        if self.deformer == "sam3":
            return {"impl": self.sam3_impl, "checkpoint": self.sam3_checkpoint, "device": self.device}
        return {}

    def fingerprint(self) -> dict[str, Any]:
        """The settings that decide the bundle's content; a rerun must match them to resume."""
        d = {k: getattr(self, k) for k in FINGERPRINT_KEYS}
        if self.deformer == "sam3" and self.sam3_impl != "transformers":
            d["sam3_impl"] = self.sam3_impl  # only when not the default, so earlier runs still resume
        for k in FINGERPRINT_PATHS:
            if d[k]:
                d[k] = str(FsPath(d[k]).resolve())
        d["review"] = sorted(
            f"{FsPath(p).resolve()} sha256:{hashlib.sha256(read_input(p, SOURCE_TABLE, what='--review sheet')).hexdigest()}"
            for p in self.review
        )
        d["generator"] = f"chexpercept {chexpercept.__version__}"
        return d


def _check_checkpoint(checkpoint: str | None) -> None:
    """A local SAM 3 folder must exist; anything else must look like a Hub id (owner/name)."""
    if not checkpoint:
        raise SourceError("--deformer sam3 needs --sam3-checkpoint (a local folder or a Hub id)")
    path = FsPath(checkpoint).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise SourceError(f"--sam3-checkpoint: {path} has no config.json (a save_pretrained folder)")
        return
    if checkpoint.startswith((".", "/", "~")) or checkpoint.count("/") != 1:
        raise SourceError(f"--sam3-checkpoint: {checkpoint} is neither an existing folder nor a Hub id")


def _check_meta_checkpoint(checkpoint: str | None) -> None:
    """Meta's checkpoint must be an existing file, and Meta's package must be installed."""
    from .deformers.sam3_meta import INSTALL_HINT

    if not checkpoint:
        raise SourceError("--sam3-impl meta needs --sam3-checkpoint (Meta's checkpoint file, sam3.pt)")
    if not FsPath(checkpoint).expanduser().is_file():
        raise SourceError(f"--sam3-checkpoint: {checkpoint} is not a file (Meta's checkpoint, sam3.pt)")
    if importlib.util.find_spec("sam3") is None:
        raise SourceError(INSTALL_HINT)
