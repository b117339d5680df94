"""Reading the reference implementation's ``all_results.json`` (spec 3.8) so old runs can be re-scored.

The file stores, per case, the reference's pass-1 strings and correct flags per step, and the
conversation (``chat_history``) with each turn's raw text (``[query, images, shown_text, original]``,
the 4th element present when an implicit oracle patched the turn). It stores neither the options
nor the None option's index, so the release bundle is needed; it also provides the gold answers,
which are checked against the stored ones (a mismatch means a different bundle).

Each turn's raw text is taken from the conversation when it is there (so strict parsing and parse
statuses work), else the stored pass-1 string (which re-parses to the same reference verdict).
"""

from __future__ import annotations

import json
import os
from pathlib import Path as FsPath
from typing import Any

from chexpercept.answers import is_correct, parse_answer
from chexpercept.bundle import Bundle
from chexpercept.case import Case, Turn
from chexpercept.escape import terminal
from chexpercept.fileio import write_atomic
from chexpercept.results import CaseResult, TurnResult, check_oracle, judge_turn
from chexpercept.run_metadata import BundleInfo, RunMetadata, SamplingInfo
from chexpercept.vocab import TASK_INFO, parse_path

from .runs import MISSING_POLICIES, Run, open_bundle, oracle_from_folder, read_json_object


def reference_model_name(folder_name: str) -> tuple[str, str]:
    """(provider, model) of a reference model folder ``<provider>_<model>``: the model name is the
    folder name after the first underscore, as the reference's analysis splits it (a name without
    an underscore is both)."""
    provider, _, model = folder_name.partition("_")
    return provider, model or folder_name


def _step(task: str) -> tuple[str, str]:
    """(stage dict key in all_results.json, chat-history index name) of a task."""
    info = TASK_INFO[task]
    return info.result_section, info.history_name


def _stored(result: dict[str, Any], task: str) -> tuple[str | None, Any, bool]:
    """(pass-1 string or None, stored ground truth or None, stored correct) of one task."""
    stage_key, _ = _step(task)
    d = result.get(stage_key) or {}
    if task == "detection":
        return d.get("response"), d.get("ground_truth"), bool(d.get("correct"))
    if task == "contour_eval":
        return d.get("responses"), d.get("ground_truth"), bool(d.get("correct"))
    sub = TASK_INFO[task].result_key
    responses = d.get("responses") or {}
    truth = d.get("ground_truth") or {}
    sub_d = d.get(sub) or {}
    return responses.get(sub), truth.get(sub), bool(sub_d.get("correct"))


def _raw(result: dict[str, Any], task: str) -> str | None:
    _, idx_name = _step(task)
    idx = (result.get("_chat_history_idx") or {}).get(idx_name)
    history = result.get("chat_history") or []
    if not isinstance(idx, int) or not 0 <= idx < len(history):
        return None
    entry = history[idx]
    if not isinstance(entry, list) or len(entry) < 3:
        return None
    raw = entry[3] if len(entry) > 3 else entry[2]
    return raw if isinstance(raw, str) else None


def _gold_list(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)]


def _as_bundle(bundle: Bundle | str | os.PathLike[str] | None) -> Bundle:
    found = open_bundle(bundle)
    if found is None:
        raise ValueError(
            "re-scoring the reference's all_results.json needs the release bundle it was run on "
            "(--data-dir DIR): the file stores neither the options nor the None option of the point questions"
        )
    return found


def read_reference_results(
    path: str | os.PathLike[str],
    bundle: Bundle | str | os.PathLike[str] | None,
    *,
    oracle: str | None = None,
    greedy: bool | None = None,
    model: str | None = None,
    missing: str = "wrong",
) -> Run:
    """Read ``<provider>_<model>/oracle_<setting>/all_results.json`` into a Run of CaseResult records.

    missing: "wrong" counts a turn the reference did not score (empty parsed reply, skipped turn) as
    wrong; "skip" reproduces the reference analysis, which drops such stages (spec 4.2, 7.2 item 18).
    """
    if missing not in MISSING_POLICIES:
        raise ValueError(f"unknown missing-turn policy {missing!r}; expected one of {MISSING_POLICIES}")
    path = FsPath(path)
    folder = path.parent
    setting = _oracle_setting(path, oracle)
    b = _as_bundle(bundle)
    cases: dict[str, Case] = {c.key_id: c for c in b.cases}
    data = read_json_object(path, "an object keyed by key_id (the reference's all_results.json)")
    provider, model_name = reference_model_name(folder.parent.name)
    model_name = model or model_name
    records: list[CaseResult] = []
    n_from_stored = n_missing = 0
    for key, result in data.items():
        case = _bundle_case(path, key, result, cases, b)
        turns, case_missing, case_from_stored = _case_turns(path, key, result, case, missing, model_name)
        n_missing += case_missing
        n_from_stored += case_from_stored
        records.append(
            CaseResult(key_id=key, lesion=case.lesion, path=case.path.value, oracle=setting, turns=turns)
        )
    meta = RunMetadata(
        model=model_name,
        provider=provider,
        oracle=setting,
        parse_mode="reference",
        bundle=BundleInfo(path=str(b.root), fingerprint=b.fingerprint(), synthetic=b.synthetic),
        source="reference all_results.json",
        sampling=SamplingInfo(greedy=greedy) if greedy is not None else None,
    )
    return Run(
        records=records,
        meta=meta,
        kind="reference",
        oracle=setting,
        greedy=greedy,
        model=model_name,
        path=folder,
        notes=_notes(path, len(cases), len(records), n_missing, n_from_stored, missing),
        allow_missing=missing == "skip",
    )


def _oracle_setting(path: FsPath, oracle: str | None) -> str:
    """--oracle, else the setting the folder is named after (oracle_<setting>); checked."""
    setting = oracle or oracle_from_folder(path.parent)
    if setting is None:
        raise ValueError(
            f"{path}: cannot tell the oracle setting (the folder is not named oracle_<setting>); pass --oracle"
        )
    check_oracle(setting, str(path))
    return setting


def _bundle_case(path: FsPath, key: str, result: Any, cases: dict[str, Case], b: Bundle) -> Case:
    """The bundle's case of one all_results.json entry; ValueError when the entry is not a case result,
    the case is not in the bundle or it ran on another path."""
    if not isinstance(result, dict) or "qa_path" not in result:
        raise ValueError(f"{path}: entry {key!r} is not a reference case result (no qa_path)")
    case = cases.get(key)
    if case is None:
        raise ValueError(
            f"{path}: case {terminal(key)} is not in the bundle {b.root}; was it run on another release?"
        )
    try:
        route = parse_path(result["qa_path"])
    except ValueError as e:
        raise ValueError(f"{path}: case {key}: {e}") from None
    if route is not case.path:
        raise ValueError(
            f"{path}: case {key} ran on path {route.value} but the bundle says {case.path.value}"
        )
    return case


def _case_turns(
    path: FsPath, key: str, result: dict[str, Any], case: Case, missing: str, model: str
) -> tuple[list[TurnResult], int, int]:
    """(turn results, turns without a scored response, turns re-parsed from the pass-1 string) of one
    case; ValueError when a stored ground truth differs from the bundle's."""
    turns: list[TurnResult] = []
    n_missing = n_from_stored = 0
    for turn in case.turns:
        stored, truth, stored_correct = _stored(result, turn.task)
        gold = list(turn.answer_index)
        truth_list = _gold_list(truth)
        if truth_list is not None and sorted(truth_list) != sorted(gold):
            raise ValueError(
                f"{path}: case {key}, {turn.task}: stored ground truth {truth} differs from the bundle's "
                f"{gold}; the results were made on another release"
            )
        if stored is None:
            n_missing += 1
        if missing == "skip" and not result.get(_step(turn.task)[0]):
            continue
        raw = _raw(result, turn.task)
        if raw is None and stored is not None:
            raw = stored
            n_from_stored += 1
        turns.append(_turn_result(turn, raw or "", stored_correct, model))
    return turns, n_missing, n_from_stored


def _notes(
    path: FsPath, n_cases: int, n_records: int, n_missing: int, n_from_stored: int, missing: str
) -> list[str]:
    """The run's notes: cases without a result, turns without a scored response, turns re-parsed."""
    notes = []
    unrun = n_cases - n_records
    if unrun:
        notes.append(f"{path}: {unrun} of the bundle's {n_cases} cases have no result")
    if n_missing:
        how = "left out as the reference analysis does" if missing == "skip" else "scored as wrong"
        notes.append(f"{path}: {n_missing} asked turns have no scored response in the file ({how})")
    if n_from_stored:
        notes.append(
            f"{path}: {n_from_stored} turns have no chat history; re-parsed from the stored pass-1 string"
        )
    return notes


def _turn_result(turn: Turn, response: str, stored_correct: bool, model: str) -> TurnResult:
    return judge_turn(turn, response, model=model, correct=stored_correct)


def write_reference_results(
    run: Run, bundle: Bundle | str | os.PathLike[str], path: str | os.PathLike[str]
) -> FsPath:
    """Export a run in the reference's ``all_results.json`` format (spec 3.8), for tools that read it.

    Responses are stored as the reference's pass-1 strings and verdicts as its scoring gives them;
    the conversation holds each turn's question, absolute image paths and raw reply (with the
    original kept as a 4th element when an implicit oracle patched it).
    """
    b = _as_bundle(bundle)
    cases = {c.key_id: c for c in b.cases}
    out: dict[str, Any] = {}
    for rec in run.records:
        case = cases.get(rec.key_id)
        if case is None:
            raise ValueError(f"case {rec.key_id} is not in the bundle {b.root}")
        turns = {t.task: t for t in case.turns}
        result: dict[str, Any] = {
            "key_id": rec.key_id,
            "qa_path": case.path.reference_name,
            "detection_qa": {},
            "contour_evaluation_qa": {},
            "contour_revision_qa": {},
            "attribute_extraction_qa": {},
            "_chat_history_idx": {},
        }
        history: list[list[Any]] = []
        for t in rec.turns:
            turn = turns[t.task]
            parsed = parse_answer(t.response, none_index=t.none_index, model=run.model)
            ok = is_correct(parsed, t.gold, multi_select=t.multi_select)
            gold: Any = list(t.gold) if t.multi_select else t.gold[0]
            stage_key, idx_name = _step(t.task)
            result["_chat_history_idx"][idx_name] = len(history)
            entry = [turn.text, [b.abspath(i) for i in turn.images], t.patched_to or t.response]
            if t.patched_to is not None:
                entry.append(t.response)
            history.append(entry)
            d = result[stage_key]
            if TASK_INFO[t.task].result_key is None:
                if parsed.text:
                    key = "response" if t.task == "detection" else "responses"
                    d.update({key: parsed.text, "ground_truth": gold, "correct": ok})
                continue
            sub = TASK_INFO[t.task].result_key
            d.setdefault("ground_truth", {})[sub] = gold
            d.setdefault("responses", {})[sub] = parsed.text
            d[sub] = {"correct": ok}
            d["correct"] = d.get("correct", True) and ok
        result["chat_history"] = history
        out[rec.key_id] = result
    return write_atomic(path, json.dumps(out, indent=2, ensure_ascii=False))
