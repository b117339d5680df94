"""What run.json records about the software that made a run: package versions and git commit."""

from __future__ import annotations

import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path as FsPath

PACKAGES = ("chexpercept", "torch", "transformers", "accelerate", "vllm", "datasets", "numpy", "pillow")


def versions() -> dict[str, str]:
    """Installed versions (read from package metadata, nothing is imported)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit() -> str | None:
    """HEAD of the toolkit's checkout, with ``-dirty`` when it has uncommitted changes; None if not git."""
    here = FsPath(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
