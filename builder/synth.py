"""``chexpercept synth``: a phantom release bundle = phantom sources + ``generate`` with the morphology deformer.

There is one generation path: the phantom bundle goes through exactly the pipeline a real
regeneration uses. Its sources are kept in ``<out>/.chexpercept-work/phantom-sources`` (redrawn only
when the settings change), so a rerun resumes like ``generate`` does.

    from chexpercept.builder.synth import synthesize
    bundle_dir = synthesize(tmp_path / "bundle", per_cell=1, seed=0)   # 21 cases, about 12 s on one core

Phantom data is for testing software, never for comparing models.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path as FsPath
from typing import Any

from chexpercept.fileio import write_atomic
from chexpercept.input_json import read_json
from chexpercept.vocab import LESIONS

from .config import GenerateConfig, parse_lesions
from .export import WORK_DIR
from .pipeline import generate
from .summary import GenerationSummary
from .synth_sources import synthesize_sources
from .workspace import PHANTOM_SOURCES_DIR, Workspace

STAMP = "phantom-sources.json"


def _stamp(path: FsPath) -> Any:
    """The stamp of earlier phantom sources, or None when it cannot be read (they are drawn again)."""
    try:
        return read_json(path, what="phantom sources stamp")
    except (OSError, ValueError):
        return None


def phantom_sources(
    out_dir: FsPath, *, per_cell: int, seed: int, lesions: tuple[str, ...], num_proc: int, progress: bool
) -> FsPath:
    """Draw (or reuse) the phantom sources for a synth run."""
    sources = out_dir / WORK_DIR / PHANTOM_SOURCES_DIR
    stamp = {"per_cell": per_cell, "seed": seed, "lesions": list(lesions)}
    stamp_file = sources / STAMP
    if stamp_file.is_file() and _stamp(stamp_file) == stamp:
        return sources
    if sources.exists():
        shutil.rmtree(sources)
    synthesize_sources(
        sources, per_cell=per_cell, seed=seed, lesions=lesions, num_proc=num_proc, progress=progress
    )
    write_atomic(stamp_file, json.dumps(stamp))
    return sources


def synthesize_run(
    out_dir: str | os.PathLike[str],
    *,
    per_cell: int = 1,
    seed: int = 0,
    num_proc: int = 1,
    lesions: tuple[str, ...] = LESIONS,
    partition: str = "reference",
    overwrite: bool = False,
    progress: bool = False,
) -> GenerationSummary:
    """Write a phantom release bundle to ``out_dir`` and return the run's summary. The lesions are
    checked before anything is drawn (SourceError names an unknown one)."""
    out = FsPath(out_dir)
    parse_lesions(lesions)  # raises for an unknown lesion; the draw keeps the order given
    sources = out / WORK_DIR / PHANTOM_SOURCES_DIR
    config = GenerateConfig(
        out=str(out),
        per_cell=per_cell,
        seed=seed,
        mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"),
        mimic_ils=str(sources / "mimic-ils"),
        anatomy=str(sources / "anatomy"),
        lesions=list(lesions),
        deformer="morphology",
        num_proc=num_proc,
        partition=partition,
        overwrite=overwrite,
        progress=progress,
    )
    # a folder that refuses these settings refuses them before the sources are drawn (seconds to
    # minutes), as generate would after
    Workspace(out).check(config.fingerprint(), overwrite)
    phantom_sources(out, per_cell=per_cell, seed=seed, lesions=lesions, num_proc=num_proc, progress=progress)
    return generate(config)


def synthesize(
    out_dir: str | os.PathLike[str],
    per_cell: int = 1,
    seed: int = 0,
    num_proc: int = 1,
    *,
    lesions: tuple[str, ...] = LESIONS,
    progress: bool = False,
) -> FsPath:
    """Write a phantom release bundle (``per_cell`` cases per lesion and path) and return its folder.

    Raises RuntimeError when the run did not complete (it never should on phantom sources).
    """
    summary = synthesize_run(
        out_dir, per_cell=per_cell, seed=seed, num_proc=num_proc, lesions=lesions, progress=progress
    )
    if summary.exit_code:
        raise RuntimeError(f"phantom generation did not complete:\n{summary.text()}")
    return FsPath(out_dir)
