"""The prepared review's manifest (``review.json``); light, so that the command's
``--help``, the server and the export import no generation code."""

from __future__ import annotations

import os
from pathlib import Path as FsPath

from chexpercept.input_json import read_json

from ..sources import SourceError

MANIFEST = "review.json"
MANIFEST_VERSION = 1


def load_manifest(review_dir: str | os.PathLike[str]) -> dict:
    path = FsPath(review_dir) / MANIFEST
    if not path.exists():
        raise SourceError(
            f"{review_dir} holds no prepared review ({MANIFEST}); run chexpercept review with the source options first"
        )
    try:
        manifest = read_json(path, what=MANIFEST)
    except (OSError, ValueError) as e:  # not a regular file, too large or deep, not JSON
        raise SourceError(f"{path} is not a readable review manifest: {e}") from e
    if not isinstance(manifest, dict):
        raise SourceError(f"{path}: expected a JSON object")
    if manifest.get("version") != MANIFEST_VERSION:
        raise SourceError(f"{path}: unknown review format version {manifest.get('version')!r}")
    return manifest
