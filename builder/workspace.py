"""The output folder's bookkeeping: ``<out>/.chexpercept-work``.

The work folder holds ``run.json`` (the settings fingerprint a rerun must match to resume), the
per-case records written by ``export``, the CheXmask row cache, ``report.json`` (the run's
``GenerationSummary``) and, for ``chexpercept synth``, the phantom sources.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path as FsPath
from typing import Any

from chexpercept.bundle import IMAGES_DIR, JSON_NAME
from chexpercept.fileio import private_dir, write_atomic
from chexpercept.input_json import read_json

from .export import WORK_DIR
from .sources import SourceError

RUN_FILE = "run.json"
#: where ``chexpercept synth`` keeps its phantom sources inside the output's work folder
PHANTOM_SOURCES_DIR = "phantom-sources"
#: the run's summary (a GenerationSummary as JSON); the file name predates the HTML report
SUMMARY_FILE = "report.json"


class Workspace:
    """An output folder of ``generate``: the bundle (chexpercept/, chexpercept.json) plus its work folder."""

    def __init__(self, out: str | FsPath):
        self.root = FsPath(out)
        self.work = self.root / WORK_DIR

    @property
    def summary_file(self) -> FsPath:
        return self.work / SUMMARY_FILE

    def check(self, fingerprint: dict[str, Any], overwrite: bool) -> None:
        """SourceError where ``prepare`` would refuse a run with these settings; nothing is written
        (``chexpercept synth`` asks before it draws its phantom sources, which takes seconds to
        minutes: it refused only after drawing them; new user, stop 45)."""
        self._previous(fingerprint, overwrite)

    def _previous(self, fingerprint: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
        """The run record of the folder (None without one), or SourceError where a run with these
        settings may not go on in it (other settings, or files of no run, without ``overwrite``)."""
        root = self.root
        run_file = self.work / RUN_FILE
        if run_file.exists():
            try:
                previous = read_json(run_file, what=RUN_FILE)
            except (OSError, ValueError) as e:
                raise SourceError(f"{root}: its run record cannot be read ({e}); pass --overwrite") from e
            if not isinstance(previous, dict):
                raise SourceError(f"{run_file}: not a run record; pass --overwrite")
            if previous != fingerprint and not overwrite:
                changed = sorted(
                    k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k)
                )
                raise SourceError(
                    f"{root} holds a run with different settings ({', '.join(changed)}); "
                    "use a new --output-dir folder, or --overwrite to start over"
                )
            return previous
        if root.is_dir() and any(root.iterdir()) and not overwrite:
            # no run record: whatever is here was not written by a generate or synth run, a release
            # (chexpercept/, chexpercept.json) downloaded or copied here included, so it is never cleared
            # without --overwrite
            foreign = [p.name for p in root.iterdir() if p.name != WORK_DIR]
            if foreign:
                raise SourceError(
                    f"--output-dir {root} is not empty and holds no record of a generate or synth run "
                    f"({', '.join(sorted(foreign)[:5])}): nothing was changed. Use a new --output-dir, or "
                    "--overwrite to replace what is there"
                )
        return None

    def prepare(self, fingerprint: dict[str, Any], overwrite: bool) -> None:
        """Make the folder ready for a run with these settings: resume, start over, or refuse."""
        root = self.root
        run_file = self.work / RUN_FILE
        previous = self._previous(fingerprint, overwrite)
        if previous is not None:
            if previous != fingerprint:  # overwrite
                self.clear()
        elif overwrite and root.is_dir() and any(root.iterdir()):
            self.clear()
        private_dir(self.work)
        write_atomic(run_file, json.dumps(fingerprint, indent=1, sort_keys=True).encode("utf-8"))

    def clear(self) -> None:
        """Remove a previous run's output (the phantom sources that ``synth`` keeps in the work folder stay)."""
        root = self.root
        if (root / IMAGES_DIR).exists():
            shutil.rmtree(root / IMAGES_DIR)
        if (root / JSON_NAME).exists():
            (root / JSON_NAME).unlink()
        if self.work.is_dir():
            for child in self.work.iterdir():
                if child.name == PHANTOM_SOURCES_DIR:
                    continue
                if child.is_dir():
                    shutil.rmtree(child)
                else:
                    child.unlink()

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_atomic(self.summary_file, json.dumps(summary, indent=1).encode("utf-8"))
