"""Finding the runs a report covers: our runner's folders and the reference's result folders.

Our layout is ``OUT/<model>/oracle_<setting>/results.jsonl`` with ``run.json`` beside it (which names
the model and oracle). The reference's layout is ``<provider>_<model>/oracle_<setting>/all_results.json``;
its model name is the folder name after the first underscore, as the reference's analysis splits it.
``--results`` may point at a folder of many models, at one model's folder, or at one run folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, Literal

from chexpercept.results import ORACLE_SETTINGS, RESULTS_NAME, RUN_NAME

from .runs import REFERENCE_RESULTS_NAME, _oracle_from_folder, read_json_object

Layout = Literal["chexpercept", "reference"]


@dataclass
class RunFolder:
    """One run: one model under one oracle setting."""

    folder: FsPath
    model: str
    oracle: str
    layout: Layout
    #: run.json (empty for reference runs, which have none)
    meta: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.model} · {self.oracle}"

    @property
    def results_file(self) -> FsPath:
        name = RESULTS_NAME if self.layout == "chexpercept" else REFERENCE_RESULTS_NAME
        return self.folder / name


def _read_run(folder: FsPath) -> RunFolder | None:
    if (folder / RESULTS_NAME).is_file():
        notes: list[str] = []
        meta: dict[str, Any] = {}
        if (folder / RUN_NAME).is_file():
            meta = read_json_object(folder / RUN_NAME)
        else:
            notes.append(f"{RUN_NAME} is missing: model and oracle taken from the folder names")
        model = str(meta.get("model") or folder.parent.name)
        oracle = str(meta.get("oracle") or _oracle_from_folder(folder) or "")
        if oracle not in ORACLE_SETTINGS:
            raise ValueError(
                f"{folder}: cannot tell the oracle setting (run.json has none and the folder is not "
                f"named oracle_<{'|'.join(ORACLE_SETTINGS)}>)"
            )
        return RunFolder(folder, model, oracle, "chexpercept", meta, notes)
    if (folder / REFERENCE_RESULTS_NAME).is_file():
        oracle = _oracle_from_folder(folder)
        if oracle is None:
            raise ValueError(f"{folder}: a reference {REFERENCE_RESULTS_NAME} must sit in oracle_<setting>/")
        parent = folder.parent.name
        model = parent.split("_", 1)[1] if "_" in parent else parent
        return RunFolder(folder, model, oracle, "reference", {"provider": parent.split("_", 1)[0]})
    return None


def _runs_under(root: FsPath) -> list[RunFolder]:
    if not root.is_dir():
        raise FileNotFoundError(f"results folder {root} does not exist")
    runs: list[RunFolder] = []
    for dirpath, dirnames, _ in os.walk(root):
        dirnames.sort()
        run = _read_run(FsPath(dirpath))
        if run is not None:
            runs.append(run)
            dirnames[:] = []
    if not runs:
        raise FileNotFoundError(
            f"no runs found under {root}: expected <model>/oracle_<setting>/{RESULTS_NAME} (this toolkit) "
            f"or <provider>_<model>/oracle_<setting>/{REFERENCE_RESULTS_NAME} (reference)"
        )
    return runs


def discover_runs(*results: str | os.PathLike[str]) -> list[RunFolder]:
    """Every run folder at or below each of ``results`` (sorted by model, then oracle setting);
    two runs of one model and oracle setting are an error."""
    runs = [run for root in results for run in _runs_under(FsPath(root))]
    seen: dict[tuple[str, str], RunFolder] = {}
    for run in runs:
        key = (run.model, run.oracle)
        if key in seen:
            raise ValueError(
                f"two runs of model {run.model!r} with oracle {run.oracle!r}: {seen[key].folder} and "
                f"{run.folder}; point --results at one of them"
            )
        seen[key] = run
    order = {s: i for i, s in enumerate(ORACLE_SETTINGS)}
    return sorted(runs, key=lambda r: (r.model, order[r.oracle]))
