"""Data for the HTML case viewer: a small index of every case, and one script file per case.

The browser opens the report from disk (``file://``), where it may not fetch JSON, so data travels as
JavaScript files that call ``CHX.index(...)`` and ``CHX.case(...)``. The index holds what the filters
need (lesion, path, each run's first failing stage); a case's file (questions, images, every run's raw
answers) is loaded only when the case is opened, so reports of many models over the whole benchmark
stay light.

Images are credentialed data: by default the viewer links to the bundle's files where they are on
disk; with ``embed_images`` they are copied (hard-linked when possible) into the report folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

from chexpercept.bundle import Bundle
from chexpercept.case import Case
from chexpercept.containment import Tree, image_file, output_path
from chexpercept.fileio import copy_file, private_dir, write_atomic
from chexpercept.input_files import IMAGE
from chexpercept.progress import progress_bar
from chexpercept.results import CaseResult
from chexpercept.vocab import LESIONS, PATHS, STAGE_NAMES, TASK_STAGE

DATA_DIR = "data"
CASES_DIR = "data/cases"
IMAGES_DIR = "images"
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class ViewerRun:
    """One run as the viewer shows it.

    scored: per key_id, the metric library's per-case detail (``CaseScores.case(i)``: ``stages`` with
    their End-to-End flags, ``turns`` re-parsed and re-judged in the report's parse mode). Without it
    the viewer shows the verdicts the run recorded.
    """

    run_id: str
    label: str
    model: str
    oracle: str
    records: dict[str, CaseResult]
    scored: dict[str, dict[str, Any]] | None = None


def first_failing_stage(record: CaseResult, scored: dict[str, Any] | None = None) -> int:
    """The stage where the End-to-End chain breaks (0 when every asked stage was passed).

    From the metric library's per-case detail when given, else from the verdicts the record carries.
    """
    if scored is not None:
        broken = [int(name[len("stage") :]) for name, s in scored["stages"].items() if not s["e2e"]]
        return min(broken, default=0)
    for turn in record.turns:
        if not turn.correct:
            return int(turn.stage)
    return 0


def case_file_name(key_id: str) -> str:
    """A file name for a case's data that is safe on every file system and unique per key_id."""
    safe = _SAFE.sub("_", key_id)
    if safe != key_id:
        safe += "-" + hashlib.sha1(key_id.encode()).hexdigest()[:8]
    return f"{safe}.js"


def _js_call(fn: str, *args: Any) -> str:
    return f"{fn}({', '.join(json.dumps(a, ensure_ascii=True, separators=(',', ':')) for a in args)});\n"


class _ImageLinker:
    """Turns bundle-relative image paths into what the page's <img> and <a> point at.

    Every path must resolve inside the bundle (links followed) and every copy must land under the
    report folder (chexpercept.containment): ContainmentError otherwise; a copied file must be a PNG
    or JPEG."""

    def __init__(self, bundle_root: FsPath | None, out: FsPath, embed: bool):
        self.root, self.out, self.embed = bundle_root, out, embed
        self.tree = Tree(bundle_root) if bundle_root is not None else None
        self.copied = 0

    def __call__(self, rel: str) -> dict[str, Any]:
        if self.tree is None:
            return {"name": rel, "src": None}
        source = self.tree.resolve(rel, what="bundle image")
        if not self.embed:
            return {"name": rel, "src": source.as_uri() if source.exists() else None}
        if not source.exists():
            return {"name": rel, "src": None}
        source = image_file(self.tree, rel, what="bundle image")
        target = output_path(self.out, f"{IMAGES_DIR}/{rel}", what="copied image")
        if not target.exists():
            copy_file(source, target, limit=IMAGE, what="bundle image")  # private, bounded
            self.copied += 1
        return {"name": rel, "src": f"{IMAGES_DIR}/{rel}"}


def _question_turns(case: Case | None, first: CaseResult, link: _ImageLinker) -> list[dict[str, Any]]:
    """The questions of a case, from the bundle when it is there, else from a run's conversation."""
    if case is not None:
        return [
            {
                "task": t.task,
                "stage": t.stage,
                "text": t.text,
                "images": [link(p) for p in t.images],
                "options": list(t.options),
                "gold": list(t.answer_index),
                "gold_text": t.answer,
            }
            for t in case.turns
        ]
    users = [m for m in first.conversation if m.get("role") == "user"]
    out = []
    for i, t in enumerate(first.turns):
        msg = users[i] if i < len(users) else {"text": "", "images": []}
        out.append(
            {
                "task": t.task,
                "stage": t.stage,
                "text": msg.get("text", ""),
                "images": [link(p) for p in msg.get("images", [])],
                "options": [],
                "gold": list(t.gold),
                "gold_text": None,
            }
        )
    return out


def _run_turns(
    record: CaseResult, base_text: dict[str, str], scored: dict[str, Any] | None
) -> dict[str, Any]:
    users = [m for m in record.conversation if m.get("role") == "user"]
    judged = {t["task"]: t for t in scored["turns"]} if scored is not None else {}
    turns = {}
    for i, t in enumerate(record.turns):
        user_text = users[i].get("text") if i < len(users) else None
        verdict = judged.get(t.task, {"parsed": t.parsed, "status": t.parse_status, "correct": t.correct})
        turns[t.task] = {
            "response": t.response,
            "parsed": list(verdict["parsed"]),
            "status": verdict["status"],
            "correct": bool(verdict["correct"]),
            "oracle_text": t.oracle_text,
            "patched_to": t.patched_to,
            # the runner records a backend failure on the turn it happened (field added by the runner)
            "error": getattr(t, "error", None),
            # only when the model saw a different text than the bundle's question (explicit oracle)
            "user_text": user_text if user_text and user_text != base_text.get(t.task) else None,
        }
    return {"turns": turns, "first_fail": first_failing_stage(record, scored), "usage": record.usage or None}


def case_order(keys: Sequence[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Cases sorted by lesion, then path (RR, RF, LF), then key_id."""
    lesion_rank = {name: i for i, name in enumerate(LESIONS)}
    path_rank = {p.value: i for i, p in enumerate(PATHS)}
    return sorted(
        keys, key=lambda k: (lesion_rank.get(k[1], len(LESIONS)), k[1], path_rank.get(k[2], 9), k[0])
    )


def write_viewer_data(
    out: str | os.PathLike[str],
    runs: Sequence[ViewerRun],
    bundle: Bundle | None,
    *,
    embed_images: bool = False,
) -> dict[str, Any]:
    """Write ``data/index.js`` and ``data/cases/*.js``; return a summary of what was written.

    bundle: the bundle the runs were made on (questions, gold texts, images); without it the viewer
    shows the conversations the records carry, without images.
    """
    out = FsPath(out)
    cases_dir = out / CASES_DIR
    if cases_dir.exists():
        shutil.rmtree(cases_dir)
    private_dir(cases_dir)
    root = FsPath(bundle.root) if bundle is not None else None
    link = _ImageLinker(root, out, embed_images)
    by_key = {c.key_id: c for c in bundle.cases} if bundle is not None else {}

    seen: dict[str, tuple[str, str, str]] = {}
    for run in runs:
        for key, rec in run.records.items():
            seen.setdefault(key, (key, rec.lesion, rec.path))
    ordered = case_order(list(seen.values()))
    missing_in_bundle = [k for k, _, _ in ordered if bundle is not None and k not in by_key]
    if missing_in_bundle:
        raise ValueError(
            f"{len(missing_in_bundle)} case(s) of the runs are not in the bundle {bundle.root} "
            f"(first: {missing_in_bundle[0]}); was the run made on another bundle? Pass the right --data-dir"
        )

    index_cases = []
    fail: dict[str, list[int | None]] = {r.run_id: [] for r in runs}
    for key, lesion, path in progress_bar(
        ordered, desc="case viewer", unit="case", disable=None, leave=False
    ):
        recs = {r.run_id: r.records.get(key) for r in runs}
        judged = {r.run_id: r.scored.get(key) if r.scored is not None else None for r in runs}
        first = next(rec for rec in recs.values() if rec is not None)
        questions = _question_turns(by_key.get(key), first, link)
        base_text = {q["task"]: q["text"] for q in questions}
        payload = {
            "key": key,
            "lesion": lesion,
            "path": path,
            "turns": questions,
            "runs": {
                rid: _run_turns(rec, base_text, judged[rid]) for rid, rec in recs.items() if rec is not None
            },
        }
        file_name = case_file_name(key)
        write_atomic(cases_dir / file_name, _js_call("CHX.case", key, payload))
        index_cases.append([key, lesion, path, file_name])
        for rid, rec in recs.items():
            fail[rid].append(None if rec is None else payload["runs"][rid]["first_fail"])

    index = {
        "runs": [{"id": r.run_id, "label": r.label, "model": r.model, "oracle": r.oracle} for r in runs],
        "cases": index_cases,
        "fail": fail,
        "lesions": [name for name in LESIONS if any(c[1] == name for c in index_cases)],
        "paths": [p.value for p in PATHS if any(c[2] == p.value for c in index_cases)],
        "stages": {str(k): v for k, v in STAGE_NAMES.items()},
        "task_stage": TASK_STAGE,
        "images": {
            "mode": "embedded" if embed_images else "linked",
            "root": str(root) if root is not None else None,
            "found": bool(root is not None and root.is_dir()),
        },
    }
    write_atomic(out / DATA_DIR / "index.js", _js_call("CHX.index", index))
    return {"cases": len(index_cases), "images_copied": link.copied}
