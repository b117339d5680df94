"""Finding runs on disk, for ``chexpercept score`` (``load_runs``) and ``chexpercept report`` (``discover_runs``).

Two layouts hold a run (one model under one oracle setting):

- ours: ``OUT/<model>/oracle_<setting>/results.jsonl`` with ``run.json`` beside it (which names the
  model and the oracle setting; the folder names stand in when it is missing);
- the reference's: ``<provider>_<model>/oracle_<setting>/all_results.json``. Its model name is the
  folder name after the first underscore, as the reference's analysis splits it (``reference_model_name``);
  the provider is kept in the run's metadata.

``detect`` says what one path holds, ``load_run`` / ``load_runs`` load the run(s) at a path (a run
folder, a results file, or a model folder of ``oracle_*`` runs), and ``discover_runs`` finds every
run at any depth below folders of many models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, Literal

from chexpercept.errors import no_such_path
from chexpercept.escape import terminal
from chexpercept.results import ORACLE_SETTINGS, REFERENCE_RESULTS_NAME, RESULTS_NAME, RUN_NAME
from chexpercept.run_metadata import RunMetadata

from .reference import read_reference_results, reference_model_name
from .runs import (
    NoFinishedCases,
    Run,
    check_answer_key,
    open_bundle,
    oracle_from_folder,
    read_chexpercept_run,
    recorded_bundle,
)

Layout = Literal["chexpercept", "reference"]


def results_layout(folder: FsPath) -> Layout | None:
    """Which layout's results file FOLDER holds, if any (ours first); a file by that name that is not a
    regular file (a FIFO, a folder) counts, so that its reader refuses it by name (chexpercept.input_files)."""
    if (folder / RESULTS_NAME).exists():
        return "chexpercept"
    if (folder / REFERENCE_RESULTS_NAME).exists():
        return "reference"
    return None


@dataclass
class RunFolder:
    """One run on disk: one model under one oracle setting."""

    folder: FsPath
    model: str
    oracle: str
    layout: Layout
    #: run.json (for reference runs, which have none: the provider)
    meta: RunMetadata = field(default_factory=RunMetadata)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.model} · {self.oracle}"

    @property
    def results_file(self) -> FsPath:
        name = RESULTS_NAME if self.layout == "chexpercept" else REFERENCE_RESULTS_NAME
        return self.folder / name


def find_run(folder: FsPath) -> RunFolder | None:
    """The run FOLDER holds (its model and oracle setting, without reading the results), or None."""
    layout = results_layout(folder)
    if layout == "chexpercept":
        notes: list[str] = []
        meta = RunMetadata()
        if (folder / RUN_NAME).exists():
            meta = RunMetadata.from_json(folder / RUN_NAME)
        else:
            notes.append(f"{RUN_NAME} is missing: model and oracle taken from the folder names")
        model = meta.model or folder.parent.name
        oracle = meta.oracle or oracle_from_folder(folder) or ""
        if oracle not in ORACLE_SETTINGS:
            raise ValueError(
                f"{terminal(folder)}: cannot tell the oracle setting (run.json has none and the folder is not "
                f"named oracle_<{'|'.join(ORACLE_SETTINGS)}>)"
            )
        return RunFolder(folder, model, oracle, "chexpercept", meta, notes)
    if layout == "reference":
        oracle = oracle_from_folder(folder)
        if oracle is None:
            raise ValueError(
                f"{terminal(folder)}: a reference {REFERENCE_RESULTS_NAME} must sit in oracle_<setting>/"
            )
        provider, model = reference_model_name(folder.parent.name)
        return RunFolder(folder, model, oracle, "reference", RunMetadata(provider=provider))
    return None


#: the names of settings folders: the only ones read in a folder of runs (``oracle_none.old``, a run
#: set aside, was scored as the none setting; red team, stop 44); ``unread_entries`` names the others
SETTINGS_FOLDERS = frozenset(f"oracle_{setting}" for setting in ORACLE_SETTINGS)


def _runs_under(root: FsPath) -> list[RunFolder]:
    if not root.is_dir():
        raise FileNotFoundError(f"results folder {no_such_path(root)}")
    runs: list[RunFolder] = []
    for dirpath, dirnames, _ in os.walk(root):
        dirnames.sort()
        here = FsPath(dirpath)
        if here != root and here.name.lower().startswith("oracle_") and here.name not in SETTINGS_FOLDERS:
            dirnames[:] = []  # set aside under another name: said by unread_entries
            continue
        run = find_run(here)
        if run is not None:
            runs.append(run)
            dirnames[:] = []
            continue
        for name in dirnames:  # a linked settings folder is read as score reads it (walk does not enter it)
            if name in SETTINGS_FOLDERS and (here / name).is_symlink():
                linked = find_run(here / name)
                if linked is not None:
                    runs.append(linked)
    if not runs:
        raise FileNotFoundError(
            f"no runs found under {root}: expected <model>/oracle_<setting>/{RESULTS_NAME} (this toolkit) "
            f"or <provider>_<model>/oracle_<setting>/{REFERENCE_RESULTS_NAME} (reference)"
        )
    return runs


def unread_entries(root: str | os.PathLike[str]) -> list[tuple[FsPath, str]]:
    """(entry, why it is not read) for every entry at or below ``root`` named as a settings folder
    (``oracle_*``, in any case) that is not read as a run: a run.json without a results file (a run
    refused or stopped before its first case), an empty folder, a file, a name in other letters
    (``Oracle_None``). Said by the commands that score a folder of runs: an End-to-End number was
    quietly taken from another setting while ``oracle_none`` was a file (red team, stop 44)."""
    found = []
    start = FsPath(root).expanduser()
    for dirpath, dirnames, filenames in os.walk(start):
        dirnames.sort()
        here = FsPath(dirpath)
        for name in sorted([*dirnames, *filenames]):
            entry = here / name
            if not name.lower().startswith("oracle_"):
                continue
            if not entry.is_dir():
                found.append((entry, "a file where a settings folder would be"))
            elif name not in SETTINGS_FOLDERS:
                names = ", ".join(sorted(SETTINGS_FOLDERS))
                found.append((entry, f"not a settings folder's name ({names}): set aside, not read"))
            elif find_run(entry) is None:
                found.append((entry, _without_a_run(entry)))
    if start.name.lower().startswith("oracle_") and start.is_dir() and find_run(start) is None:
        found.append((start, _without_a_run(start)))
    return found


def _without_a_run(folder: FsPath) -> str:
    """Why a settings folder that holds no run is not read: a run.json without results, or nothing."""
    return f"no {RESULTS_NAME}" if os.path.lexists(folder / RUN_NAME) else "no run's files"


def discover_runs(*results: str | os.PathLike[str]) -> list[RunFolder]:
    """Every run folder at or below each of ``results`` (sorted by model, then oracle setting);
    two runs of one model and oracle setting are an error."""
    runs = [run for root in results for run in _runs_under(FsPath(root))]
    seen: dict[tuple[str, str], RunFolder] = {}
    for run in runs:
        key = (run.model, run.oracle)
        if key in seen:
            raise ValueError(
                f"two runs of model {terminal(repr(run.model))} with oracle {terminal(repr(run.oracle))}: "
                f"{terminal(seen[key].folder)} and {terminal(run.folder)}; point --results at one of them"
            )
        seen[key] = run
    order = {s: i for i, s in enumerate(ORACLE_SETTINGS)}
    return sorted(runs, key=lambda r: (r.model, order[r.oracle]))


def detect(path: str | os.PathLike[str]) -> tuple[str, FsPath]:
    """What PATH holds: ("chexpercept", run folder), ("reference", all_results.json) or
    ("model", folder with oracle_* runs)."""
    p = FsPath(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(no_such_path(path, "file or folder"))
    if not p.is_dir():  # a file, or a FIFO or device that its reader refuses by name
        if p.name == RESULTS_NAME:
            return "chexpercept", p.parent
        if p.suffix == ".jsonl":  # its folder's results.jsonl would be read instead (or nothing)
            raise ValueError(
                f"{p}: not a run's {RESULTS_NAME}: a run is read from its folder ({RESULTS_NAME} beside "
                f"{RUN_NAME}); give that folder, or the file under its own name"
            )
        if p.suffix == ".json":
            if p.name == RUN_NAME:
                return "chexpercept", p.parent
            return "reference", p
        raise ValueError(f"{p}: not a results file (expected {RESULTS_NAME} or {REFERENCE_RESULTS_NAME})")
    layout = results_layout(p)
    if layout == "chexpercept":
        return "chexpercept", p
    if layout == "reference":
        return "reference", p / REFERENCE_RESULTS_NAME
    if _run_folders(p):
        return "model", p
    raise ValueError(
        f"{p}: found no results: expected {RESULTS_NAME} (our runner), {REFERENCE_RESULTS_NAME} "
        "(the reference implementation) or oracle_<setting>/ folders holding either"
    )


def model_folders(path: str | os.PathLike[str]) -> list[FsPath]:
    """The model folders PATH stands for, in order: PATH itself when it holds a run or a model's
    ``oracle_*`` runs, else every model folder below it (a runs folder such as ``run --output-dir``
    writes: ``<model>/oracle_<setting>/``). Raises like ``detect`` when there is none."""
    try:
        detect(path)
        return [FsPath(path)]
    except ValueError:
        root = FsPath(path).expanduser()
        if not root.is_dir():
            raise
        try:
            runs = _runs_under(root)
        except FileNotFoundError:
            raise ValueError(
                f"{root}: found no results: expected {RESULTS_NAME} (our runner), {REFERENCE_RESULTS_NAME} "
                "(the reference implementation), oracle_<setting>/ folders holding either, or model "
                "folders of those below it"
            ) from None
    folders: list[FsPath] = []
    for run in runs:
        if run.folder.parent not in folders:
            folders.append(run.folder.parent)
    return folders


def _run_folders(p: FsPath) -> list[FsPath]:
    return [
        d
        for d in sorted(p.glob("oracle_*"))
        if d.name in SETTINGS_FOLDERS and d.is_dir() and results_layout(d) is not None
    ]


def load_run(
    path: str | os.PathLike[str],
    *,
    bundle: Any = None,
    oracle: str | None = None,
    greedy: bool | None = None,
    model: str | None = None,
    missing: str = "wrong",
) -> Run:
    """Load one run: our run folder (or its results.jsonl) or a reference all_results.json (or folder).

    oracle / greedy / model override what the run's metadata says (needed for reference results,
    whose decoding is not recorded). bundle (folder or Bundle) is required for reference results.
    missing: for reference results, how turns the reference did not score are counted: "wrong"
    (default) or "skip" (the reference analysis: the stage drops out of the denominators).
    """
    kind, where = detect(path)
    if kind == "model":
        raise ValueError(
            f"{where} holds several runs ({', '.join(d.name for d in _run_folders(where))}); use load_runs"
        )
    if kind == "reference":
        return read_reference_results(
            where, bundle, oracle=oracle, greedy=greedy, model=model, missing=missing
        )
    run = read_chexpercept_run(where, oracle=oracle, greedy=greedy, model=model)
    against, unchecked = (open_bundle(bundle), None) if bundle is not None else recorded_bundle(run)
    if against is not None:  # the answer key a line carries is the bundle's (red team, stop 44)
        check_answer_key(run, against)
    elif unchecked:  # said, never passed over
        run.notes.append(unchecked)
    return run


def load_runs(path: str | os.PathLike[str], **kwargs: Any) -> list[Run]:
    """Load every run under PATH: one run, or all oracle_* runs of a model folder."""
    kind, where = detect(path)
    if kind != "model":
        return [load_run(path, **kwargs)]
    runs: list[Run] = []
    empty: list[NoFinishedCases] = []
    for folder in _run_folders(where):
        try:
            runs.append(load_run(folder, **kwargs))
        except NoFinishedCases as e:  # the model's other settings are still scored, with a note
            empty.append(e)
    if not runs:
        raise NoFinishedCases(str(where), sum(e.unfinished for e in empty))
    runs[0].notes.extend(f"{e}: not scored" for e in empty)
    check_one_identity(where, runs)
    return runs


def _models_of(run: Run) -> set[str]:
    """The model ids a run's answers were made by: run.json's settings where it records them, else
    the run identities its lines carry (empty for an older version's or the reference's)."""
    settings = getattr(getattr(run, "meta", None), "settings", None)
    if isinstance(settings, dict) and settings.get("model_id"):
        return {str(settings["model_id"])}
    return {
        str(r.run["model"])
        for r in run.records
        if isinstance(getattr(r, "run", None), dict) and r.run.get("model")
    }


def check_one_identity(folder: FsPath, runs: list[Run]) -> None:
    """ValueError when the settings folders of one model folder were made by another model or under
    other settings (all but the oracle; eval/runner/identity.py): their numbers would be combined into
    one row (End-to-End from one, Oracle-Passed from another). Folders without a recorded identity
    (older versions, the reference's) are compared by the model their lines name, where they name one."""
    recorded = [(r, getattr(getattr(r, "meta", None), "settings", None)) for r in runs]
    recorded = [(r, s) for r, s in recorded if isinstance(s, dict) and s]
    if len(runs) >= 2:
        _check_comparable(folder, [r for r in runs if all(r is not run for run, _ in recorded)])
        _check_made_alike(folder, runs)
    if len(recorded) >= 2:
        _check_recorded(folder, recorded)
    _check_models(folder, runs)


def _check_comparable(folder: FsPath, unrecorded: list[Run]) -> None:
    """``check_one_identity`` of the settings folders whose run.json records no settings: ValueError
    when one holds a line our runner stamped (its ``run`` identity, without ``harness``). The runner
    records its settings in run.json before its first line, so they were removed, and the lines
    cannot be compared with the other settings folders' (a runner's fingerprint holds the oracle
    setting). Before (red team, stop 48): another run's ``oracle_none`` (another seed) moved into a
    model folder, its run.json or only its ``settings`` removed, was scored and published as that
    model's End-to-End beside the model's own Oracle-Passed. Lines without an identity (an older
    version's, the reference's) are compared by model only (``_check_models``)."""
    for run in unrecorded:
        stamped = next((r for r, said in _stamps(run) if not said.get("harness")), None)
        if stamped is None:
            continue
        has_meta = run.path is not None and (run.path / RUN_NAME).exists()
        where = f"its {RUN_NAME} records no settings" if has_meta else f"it has no {RUN_NAME}"
        raise ValueError(
            f"{terminal(str(folder))}: oracle_{run.oracle} holds answers of this toolkit's runner (case "
            f"{terminal(stamped.key_id)}: model {terminal(repr(stamped.run.get('model')))}, settings "
            f"{terminal(stamped.run.get('fingerprint'))}), but {where}: its settings cannot be compared with "
            "the other settings folders', so they are not scored together (End-to-End from one, "
            f"Oracle-Passed from another). Put back the {RUN_NAME} its run wrote (copy the whole settings "
            "folder), or score that settings folder on its own"
        )


def _stamps(run: Run) -> list[tuple[Any, dict[str, Any]]]:
    """(record, its ``run`` identity) of the records of ``run`` that carry one."""
    return [(r, r.run) for r in run.records if isinstance(getattr(r, "run", None), dict)]


def _check_made_alike(folder: FsPath, runs: list[Run]) -> None:
    """``check_one_identity``: ValueError when the settings folders of one model folder were made by
    different tools (this toolkit's runner, a harness, the reference's layout), or by a harness's
    evals of different settings (their records' fingerprints, which leave the oracle out, differ).
    Before (round 2, helper-53): an Inspect eval at temperature 1 beside one at temperature 0, and
    another model's run exported in the reference's layout placed as ``oracle_none``, were scored
    as one model's row."""

    def made_by(run: Run) -> str:
        harnesses = {str(said["harness"]) for _r, said in _stamps(run) if said.get("harness")}
        return f"{run.kind} ({', '.join(sorted(harnesses))})" if harnesses else run.kind

    tools = {f"oracle_{r.oracle}": made_by(r) for r in runs}
    if len(set(tools.values())) > 1:
        shown = "; ".join(f"{name}: {tool}" for name, tool in tools.items())
        raise ValueError(
            f"{terminal(str(folder))}: its settings folders were made by different tools ({terminal(shown)}), so "
            "they are not scored together (End-to-End from one, Oracle-Passed from another); move one to a "
            "model folder of its own"
        )
    prints = {
        f"oracle_{run.oracle}": {
            str(said.get("fingerprint")) for _r, said in _stamps(run) if said.get("harness")
        }
        for run in runs
    }
    if len({p for ps in prints.values() for p in ps}) > 1:
        shown = "; ".join(f"{name}: {', '.join(sorted(p)[:2])}" for name, p in prints.items() if p)
        raise ValueError(
            f"{terminal(str(folder))}: its settings folders hold records of evals made under different settings "
            f"({terminal(shown)}), so they are not scored together; score each on its own"
        )


def _check_recorded(folder: FsPath, recorded: list[tuple[Run, dict[str, Any]]]) -> None:
    """``check_one_identity`` of the settings folders that record their settings."""
    from chexpercept.eval.runner.identity import setting_folders_mismatch

    first_run, first = recorded[0]
    others = {f"oracle_{r.oracle}": s for r, s in recorded[1:]}
    diff = setting_folders_mismatch(first, others)
    if diff:
        shown = "; ".join(terminal(line) for line in diff[:6])
        raise ValueError(
            f"{terminal(str(folder))}: its settings folders were made by different models or settings, "
            f"compared with oracle_{first_run.oracle} ({shown}), so they are not scored together; "
            "score each settings folder on its own, or move one to a model folder of its own"
        )


def _check_models(folder: FsPath, runs: list[Run]) -> None:
    """``check_one_identity`` of the models: a folder without settings is still one model's, by its
    lines (red team round 2, stop 43)."""
    models = {f"oracle_{r.oracle}": _models_of(r) for r in runs}
    named = {m for ms in models.values() for m in ms}
    if len(named) > 1:
        shown = "; ".join(
            f"{name}: {', '.join(terminal(m) for m in sorted(ms))}" for name, ms in models.items() if ms
        )
        raise ValueError(
            f"{terminal(str(folder))}: its settings folders hold answers of different models ({shown}), so "
            "they are not scored together; move one to a model folder of its own"
        )
