"""Writing the release bundle: per-case image folders and records, atomically, then chexpercept.json.

A case's images are written into a hidden temporary folder and renamed into
``chexpercept/<key_id>/`` in one step; its record (entry or rejection reason) is then written to the
work folder with an atomic replace. A crash therefore leaves either a finished case or nothing, and a
rerun skips every case that has a record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path as FsPath
from typing import Any

from chexpercept.bundle import IMAGES_DIR, JSON_NAME
from chexpercept.containment import check_name, check_relative
from chexpercept.fileio import private_dir, replaced_dir, write_atomic, write_new
from chexpercept.input_json import read_json

WORK_DIR = ".chexpercept-work"
CASES_DIR = "cases"


def write_case_folder(root: FsPath, key_id: str, files: dict[str, bytes]) -> None:
    """Write ``files`` (relative path -> bytes) as ``chexpercept/<key_id>/`` in one rename; the key_id
    and every file name must stay inside that folder (ContainmentError otherwise)."""
    check_name(key_id, "key_id")
    for rel in files:
        check_relative(rel, f"{key_id}: image")
    images = private_dir(root / IMAGES_DIR)
    with replaced_dir(images / key_id, marker=None) as folder:  # a case folder is always ours
        for rel, data in files.items():
            write_new(folder / rel, data)


def record_path(root: FsPath, key_id: str) -> FsPath:
    return root / WORK_DIR / CASES_DIR / f"{check_name(key_id, 'key_id')}.json"


def write_record(root: FsPath, key_id: str, record: dict[str, Any]) -> None:
    write_atomic(record_path(root, key_id), json.dumps(record, ensure_ascii=False).encode("utf-8"))


def read_record(root: FsPath, key_id: str) -> dict[str, Any] | None:
    """The finished record of a case, or None (also when the record or its images are incomplete)."""
    path = record_path(root, key_id)
    try:
        record = read_json(path, what="work record")
    except (FileNotFoundError, ValueError):  # none, or not a finished record (it is made again)
        return None
    if not isinstance(record, dict):
        return None
    if record.get("status") == "ok" and not (root / IMAGES_DIR / key_id).is_dir():
        return None
    return record


def bundle_json(entries: dict[str, dict[str, Any]]) -> bytes:
    """chexpercept.json as the reference writes it: one object, indent 2, non-ASCII kept."""
    return json.dumps(entries, indent=2, ensure_ascii=False).encode("utf-8")


def write_bundle_json(root: FsPath, entries: dict[str, dict[str, Any]]) -> FsPath:
    path = root / JSON_NAME
    write_atomic(path, bundle_json(entries))
    return path


def remove_stale_case_folders(root: FsPath, keep: set[str]) -> list[str]:
    """Delete case folders (and leftover temporaries) that are not part of the final bundle."""
    images = root / IMAGES_DIR
    removed = []
    if not images.is_dir():
        return removed
    for child in images.iterdir():
        if child.is_dir() and child.name not in keep:
            shutil.rmtree(child)
            removed.append(child.name)
    return removed
