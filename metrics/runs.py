"""Runs: the records of one model under one oracle setting, and reading our runner's run folders.

A ``Run`` is the records of one model under one oracle setting plus what is known about how they
were made (run.json). ``read_chexpercept_run`` reads one of our run folders; the reference's
``all_results.json`` is read by ``reference``; finding runs on disk (``detect``, ``load_run``,
``load_runs``, ``discover_runs``) is ``discovery``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from chexpercept.bundle import Bundle, read_bundle
from chexpercept.escape import shown, terminal
from chexpercept.input_files import RESULTS
from chexpercept.input_json import read_json
from chexpercept.results import (
    FAILURES_NAME,
    ORACLE_SETTINGS,
    RESULTS_NAME,
    RUN_NAME,
    CaseFailure,
    CaseResult,
    being_written,
    check_identity,
    check_one_identity,
    check_oracle,
    iter_numbered_results,
    read_failures,
    run_identity,
    served_models,
    torn_tail,
)
from chexpercept.run_metadata import RunMetadata

MISSING_POLICIES: tuple[str, ...] = ("wrong", "skip")


@dataclass
class Run:
    """The records of one model under one oracle setting, and how they were made."""

    records: list[CaseResult]
    #: run.json as written by the runner (or what is known, for other sources)
    meta: RunMetadata
    #: "chexpercept" (our runner), "reference" (all_results.json) or "records" (built in memory)
    kind: str
    oracle: str
    #: True/False when known; None when the decoding is unknown
    greedy: bool | None
    model: str = ""
    path: FsPath | None = None
    notes: list[str] = field(default_factory=list)
    #: reference results read with the reference's policy for unscored turns (see score_records)
    allow_missing: bool = False
    #: cases left unfinished by failed requests (failures.jsonl, for cases without a result):
    #: never scored
    failed: list[CaseFailure] = field(default_factory=list)
    #: why these records are not the whole run (a run writing them now, a run not finished, lines
    #: torn or missing against run.json); empty when they are. Every writer of numbers says it
    #: (metrics/partial.py)
    partial: list[str] = field(default_factory=list)

    @property
    def parse_mode(self) -> str | None:
        """The parse mode the run was made with: run.json's, else the one every record's run
        identity names (a harness's records: eval/harnesses/inspect_ai/solver.py ``run_identity``),
        else None (unknown). Before (round 2, stop 48): an Inspect eval made with strict parsing
        was scored by its own metric and by ``chexpercept score`` with reference parsing."""
        if self.meta.parse_mode:
            return self.meta.parse_mode
        said = {r.run.get("parse_mode") if isinstance(r.run, dict) else None for r in self.records}
        return next(iter(said)) if len(said) == 1 and None not in said else None

    @property
    def fingerprint(self) -> str | None:
        return self.meta.bundle.fingerprint if self.meta.bundle else None

    @property
    def images_fingerprint(self) -> str | None:
        return self.meta.images_fingerprint

    @property
    def label(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"oracle {self.oracle} run{where}"


def greedy_from_meta(meta: RunMetadata) -> tuple[bool | None, str | None]:
    """(greedy, note): sampling.greedy when present, else temperature 0, else unknown."""
    sampling = meta.sampling
    fingerprinted = (meta.settings or {}).get("sampling")
    if (
        sampling is not None
        and isinstance(fingerprinted, dict)
        and fingerprinted.get("greedy", sampling.greedy) != sampling.greedy  # the identity's copy
    ):
        raise ValueError(
            f"run.json says greedy {sampling.greedy!r} under sampling and {fingerprinted['greedy']!r} "
            "under settings.sampling (the run's identity): it was changed after the run"
        )
    if sampling is None:
        return None, "run.json has no 'sampling': decoding unknown, so End-to-End needs an oracle none run"
    if sampling.greedy is not None:
        return sampling.greedy, None
    temperature = sampling.temperature
    if temperature is not None:
        return (
            temperature == 0,
            f"run.json has no sampling.greedy; taken from temperature={temperature}",
        )
    return None, "run.json has no sampling.greedy or temperature: decoding unknown"


def open_bundle(bundle: Bundle | str | os.PathLike[str] | None) -> Bundle | None:
    """A Bundle, or the one in a folder (read for its questions: images are not checked, but every
    path it names must stay inside it), or None."""
    if bundle is None or isinstance(bundle, Bundle):
        return bundle
    return read_bundle(bundle, check_images="none")


#: bundles read for their answer keys, by (path, fingerprint): one read per command
_ANSWER_KEYS: dict[tuple[str, str], Bundle] = {}


def recorded_bundle(run: Run) -> tuple[Bundle | None, str | None]:
    """(the bundle a run's run.json names, where it is on this disk with the fingerprint the run
    records, read once per command for its questions; else None and why its answer key cannot be
    checked, or None where run.json names no bundle)."""
    from chexpercept.bundle import JSON_NAME, fingerprint

    path, recorded = (run.meta.bundle.path, run.fingerprint) if run.meta.bundle else (None, None)
    if not path or not recorded:
        return None, None
    unchecked = (
        f"{run.label}: its answer key (each line's gold) is not checked against a bundle: the bundle its "
        f"run.json names ({terminal(path)}) {{}}; pass the bundle it was made on with --data-dir"
    )
    if not (FsPath(path) / JSON_NAME).is_file():
        return None, unchecked.format("is not on this disk")
    key = (os.path.realpath(path), recorded)
    if key not in _ANSWER_KEYS:
        try:
            if fingerprint(path) != recorded:
                return None, unchecked.format("has changed since the run (another fingerprint)")
            _ANSWER_KEYS[key] = read_bundle(path, check_images="none")
        except (OSError, ValueError) as e:
            return None, unchecked.format(f"cannot be read ({shown(e, 200)})")
    return _ANSWER_KEYS[key], None


def check_answer_key(run: Run, bundle: Bundle) -> None:
    """ValueError unless each record of ``run`` carries the bundle's answer key: the case is in the
    bundle, on its route, and every turn's gold is the bundle's. Every reader of our runs asks it
    wherever the bundle is known (given, or the one run.json names, on disk with its fingerprint:
    ``recorded_bundle``): a gold edited in results.jsonl changed the numbers of score, the report
    and push-results without a word (red team, stop 44)."""
    cases = {c.key_id: c for c in bundle.cases}
    for rec in run.records:
        case = cases.get(rec.key_id)
        if case is None:
            raise ValueError(f"{run.label}: case {rec.key_id} is not in the bundle {bundle.root}")
        if case.path.value != rec.path:
            raise ValueError(
                f"{run.label}: case {rec.key_id} ran on path {rec.path}, the bundle says {case.path.value}"
            )
        if case.lesion != rec.lesion:
            raise ValueError(
                f"{run.label}: case {rec.key_id} is recorded as lesion {rec.lesion}, the bundle says "
                f"{case.lesion}; its results.jsonl was edited"
            )
        turns = {t.task: t for t in case.turns}
        for t in rec.turns:
            turn = turns.get(t.task)
            key = answer_key(turn) if turn is not None else None
            mine = {"gold": sorted(t.gold), "n_options": t.n_options, "multi_select": t.multi_select,
                    "none_index": t.none_index}  # fmt: skip
            differ = [k for k in mine if key is None or mine[k] != key[k]]
            if differ:
                theirs = (
                    "none (no such question)" if key is None else ", ".join(f"{k} {key[k]}" for k in differ)
                )
                raise ValueError(
                    f"{run.label}: case {rec.key_id}, {t.task}: {', '.join(f'{k} {mine[k]}' for k in differ)} "
                    f"differs from the bundle's {theirs} at {bundle.root}; the run was made on another "
                    "release, or its results.jsonl was edited"
                )


def answer_key(turn: Any) -> dict[str, Any]:
    """What a bundle turn says of its answers, as a result line records it (``TurnResult``)."""
    return {
        "gold": sorted(turn.answer_index),
        "n_options": len(turn.options),
        "multi_select": turn.multi_select,
        "none_index": turn.none_index,
    }


class NoFinishedCases(ValueError):
    """A run folder (or every run folder of a model) holds no finished case: nothing to score. A
    command that scores several runs or models says so and scores the others
    (``discovery.load_runs``, ``score``, ``report``); one asked for this run alone stops here."""

    def __init__(self, where: str, unfinished: int = 0):
        listed = f" ({unfinished} unfinished, listed in {FAILURES_NAME})" if unfinished else ""
        super().__init__(f"{terminal(where)}: no finished cases{listed}")
        self.where = where
        self.unfinished = unfinished


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def read_json_object(path: FsPath, expected: str = "a JSON object") -> dict[str, Any]:
    """A JSON file whose top level must be an object; errors name the file. A key that appears twice
    in one object is an error (json.loads would keep the last one silently: a case given twice). The
    file is read through chexpercept.input_json (a regular file within input_files.RESULTS, nested at
    most MAX_DEPTH levels: ValueError naming the file otherwise)."""
    try:
        data = read_json(path, limit=RESULTS, what=path.name, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise ValueError(
            f"{path}: key {str(e)!r} appears twice in one object; each key (case) must be given once"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected {expected}")
    return data


def oracle_from_folder(folder: FsPath) -> str | None:
    """The setting of a folder named ``oracle_<setting>``, else None."""
    name = folder.name
    if name.startswith("oracle_") and name[len("oracle_") :] in ORACLE_SETTINGS:
        return name[len("oracle_") :]
    return None


def read_chexpercept_run(
    folder: FsPath, *, oracle: str | None = None, greedy: bool | None = None, model: str | None = None
) -> Run:
    """One run folder of our runner (results.jsonl, run.json, failures.jsonl) as a Run."""
    notes: list[str] = []
    run_json = folder / RUN_NAME
    has_meta = run_json.exists()
    meta = RunMetadata.from_json(run_json) if has_meta else RunMetadata()
    if not has_meta:
        notes.append(f"{folder}: no {RUN_NAME}; oracle setting taken from the records, decoding unknown")
    numbered = list(iter_numbered_results(folder / RESULTS_NAME))
    first_line: dict[str, int] = {}
    for n, r in numbered:  # named with the file and both lines, as a resume names it
        if first_line.setdefault(r.key_id, n) != n:
            raise ValueError(
                f"{folder / RESULTS_NAME}: case {terminal(r.key_id)} appears twice (lines {first_line[r.key_id]} "
                f"and {n}); the file was edited or written by two runs at once"
            )
    records = [r for _n, r in numbered]
    if has_meta and meta.settings:  # records appended by another run would change the scores
        identity = run_identity(meta.settings)
        check_identity(folder / RESULTS_NAME, ((n, r.key_id, r.run) for n, r in numbered), identity)
        failures = read_failures(folder / FAILURES_NAME)
        check_identity(
            folder / FAILURES_NAME, ((i + 1, f.key_id, f.run) for i, f in enumerate(failures)), identity
        )
    else:  # no settings to check against: the lines' own identities, one run's at most
        failures = read_failures(folder / FAILURES_NAME)
        check_one_identity(
            folder / RESULTS_NAME,
            [
                *((n, r.key_id, r.run) for n, r in numbered),
                *(
                    (i + 1, f"{f.key_id}, line {i + 1} of {FAILURES_NAME}", f.run)
                    for i, f in enumerate(failures)
                ),
            ],
        )
    if not records:
        raise NoFinishedCases(str(folder / RESULTS_NAME), len(read_failures(folder / FAILURES_NAME)))
    settings = {r.oracle for r in records}
    if len(settings) > 1:
        raise ValueError(
            f"{terminal(folder / RESULTS_NAME)}: cases of several oracle settings mixed: "
            f"{terminal(sorted(settings))}"
        )
    recorded = settings.pop()
    if oracle is not None and oracle != recorded:  # never without a word (docs/differences.md)
        notes.append(
            f"WARNING: {folder}: its cases were run with oracle {recorded}, scored here as oracle "
            f"{oracle} (--oracle overrides what the run recorded, the reference's way of reading a run): "
            "these are not the run's own numbers"
        )
    setting = oracle or meta.oracle or recorded
    check_oracle(setting, str(run_json if meta.oracle is not None else folder / RESULTS_NAME))
    if setting != recorded and oracle is None:
        raise ValueError(
            f"{terminal(run_json)}: says oracle {terminal(repr(setting))} but the cases were run with "
            f"{terminal(repr(recorded))}"
        )
    said, note = greedy_from_meta(meta) if has_meta else (None, None)
    if greedy is not None and said is not None and greedy != said:
        notes.append(
            f"WARNING: {run_json} records {'greedy' if said else 'sampled'} decoding, scored here as "
            f"{'greedy' if greedy else 'sampled'} (--greedy/--sampled override what the run recorded): "
            "these are not the run's own numbers"
        )
    if greedy is None:
        greedy = said
        if note and has_meta:
            notes.append(f"{run_json}: {note}")
    partial: list[str] = []
    selected = getattr(meta.selection, "n_selected", None) if has_meta else None
    so_far = (
        f"{len(records)} of {selected} selected cases so far" if selected else f"{len(records)} cases so far"
    )
    if being_written(folder):
        partial.append(f"{folder}: a run is writing this folder now ({so_far})")
        notes.append(f"{partial[-1]}: these numbers are partial")
    else:
        if has_meta and not meta.finished:
            unfinished = f"{run_json}: the run has not finished ({so_far})"
            notes.append(unfinished)
            if "finished" in read_json_object(run_json):  # the runner said so (null), not a hand-made file
                partial.append(unfinished)
        lost = _lost_lines(folder, meta if has_meta else None, len(records))
        partial += lost
        notes += lost
    finished = {r.key_id for r in records}
    failed = {f.key_id: f for f in read_failures(folder / FAILURES_NAME) if f.key_id not in finished}
    if failed:
        listed = "; ".join(
            f"{f.key_id} ({terminal(f.task)}): {shown(f.error, 160)}" for f in list(failed.values())[:5]
        )
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        notes.append(
            f"{folder / FAILURES_NAME}: {len(failed)} cases have no result because a request failed "
            f"(no answer, never scored; rerun the command to retry them): {listed}{more}"
        )
    errored = [(r.key_id, t.task) for r in records for t in r.turns if t.error]
    if errored:
        notes.append(
            f"{folder / RESULTS_NAME}: {len(errored)} turns hold a failed request recorded as unanswered "
            f"(written by an older version of the runner), scored as wrong answers, e.g. "
            f"{errored[0][0]} ({errored[0][1]}); rerun those cases for a model's answer"
        )
    served = served_models(t.usage for r in records for t in r.turns)
    if len(served) > 1:
        listed = ", ".join(f"{terminal(m)} ({n} turns)" for m, n in served.items())
        notes.append(
            f"{folder / RESULTS_NAME}: the answers come from {len(served)} served models ({listed}): the "
            "server resolved the model asked for to different snapshots, so these numbers mix models"
        )
    for key in ("model", "parse_mode", "bundle"):
        if has_meta and getattr(meta, key) is None:
            notes.append(f"{run_json}: no '{key}' field")
    return Run(
        records=records,
        meta=meta,
        kind="chexpercept",
        oracle=setting,
        greedy=greedy,
        model=model or str(meta.model or folder.parent.name),
        path=folder,
        notes=notes,
        failed=list(failed.values()),
        partial=partial,
    )


def _lost_lines(folder: FsPath, meta: RunMetadata | None, read: int) -> list[str]:
    """What score reads, checked against what the run recorded: a torn last line of results.jsonl
    or failures.jsonl (left out when read), and run.json's ``n_results`` against the results read.
    Each difference is said: the file, how many lines, and what to do."""
    rerun = "rerun the same command: it removes a torn line and runs the missing cases again"
    out = []
    for name in (RESULTS_NAME, FAILURES_NAME):
        torn = torn_tail(folder / name)
        if torn:
            out.append(
                f"{folder / name}: its last line is torn ({torn} bytes after the last complete line: a "
                f"process was stopped while writing it) and is not read; {rerun}"
            )
    recorded = meta.n_results if meta is not None else None
    if recorded is not None and recorded != read:
        if recorded > read:
            what = f"{recorded - read} of them are missing (lost or torn lines): these numbers are partial"
        else:
            what = f"{read - recorded} more than the run wrote (lines added since it finished)"
        out.append(
            f"{folder / RESULTS_NAME}: {folder / RUN_NAME} records {recorded} results but {read} complete "
            f"lines were read: {what}; {rerun}"
        )
    return out


def run_from_records(
    records: list[CaseResult],
    *,
    oracle: str,
    greedy: bool | None = True,
    model: str = "",
    meta: RunMetadata | dict[str, Any] | None = None,
) -> Run:
    """Wrap in-memory records (the evaluate module, simulations) as a Run."""
    check_oracle(oracle, "records")
    return Run(
        records=list(records),
        meta=RunMetadata.from_json(meta, source="records") if meta is not None else RunMetadata(),
        kind="records",
        oracle=oracle,
        greedy=greedy,
        model=model,
    )
