"""The prepared review's manifest (``review.json``); light, so that the command's
``--help``, the server and the export import no generation code."""

from __future__ import annotations

import json
import os
from pathlib import Path as FsPath

from ..sources import SourceError

MANIFEST = "review.json"
MANIFEST_VERSION = 1


def load_manifest(review_dir: str | os.PathLike[str]) -> dict:
    path = FsPath(review_dir) / MANIFEST
    if not path.is_file():
        raise SourceError(
            f"{review_dir} holds no prepared review ({MANIFEST}); run chexpercept review with the source options first"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SourceError(f"{path} is not valid JSON: {e}") from e
    if manifest.get("version") != MANIFEST_VERSION:
        raise SourceError(f"{path}: unknown review format version {manifest.get('version')!r}")
    return manifest
