"""Publish scores to a Hugging Face Hub dataset repo, never the data they were computed from.

``stage(runs_dir, staging)`` scores every model folder under ``runs_dir`` with the public scorer API
and writes, into a fresh staging folder, what a paper's table needs: per model the flat metrics,
the intervals, the tables (markdown and CSV) and run.json provenance with local paths removed; for
all models the tables, a leaderboard and a README (dataset card). ``check_staging(staging)``
refuses anything derived from the credentialed data (images, per-case results, conversations,
raw responses, key_ids) before ``upload`` sends exactly the staged files in one commit.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

from .report.leaderboard import leaderboard_rows, render_leaderboard, write_leaderboard_csv
from .tables import TABLE_IDS

#: the only kinds of file a results repo holds
ALLOWED_SUFFIXES = (".md", ".csv", ".json")
#: names of the per-case and raw files of runs (ours and the reference's)
FORBIDDEN_NAMES = ("results.jsonl", "failures.jsonl", "all_results.json", "chexpercept.json")
#: name parts that mean conversations, raw responses or per-case data
FORBIDDEN_NAME_PARTS = ("conversation", "response", "transcript", "per_case", "cases", "key_id")
#: JSON keys that carry conversations, raw model output or per-case identifiers
#: (a count under such a key is fine: run.json's last_session.cases)
FORBIDDEN_KEYS = frozenset(
    {"key_id", "key_ids", "raw_response", "raw_responses", "response", "responses", "conversation"}
    | {"conversations", "messages", "turns", "reasoning", "cases", "results", "failures"}
)
#: a CheXpercept case id: <lesion>_s<study digits>_...
KEY_ID_RE = re.compile(r"\b[a-z][a-z_]*_s\d+_[A-Za-z0-9_]+")
#: image file signatures (raw) and their base64 openings
IMAGE_MAGIC = (
    b"\x89PNG",
    b"\xff\xd8\xff",
    b"GIF8",
    b"II*\x00",
    b"MM\x00*",
    b"BM",
    b"RIFF",
    b"\x00\x00\x00\x0cjP",
)
IMAGE_TEXT = ("data:image/", "iVBORw0KGgo", "/9j/4", "R0lGOD", "DICM")
AGREEMENT = (
    "CheXpercept is built from MIMIC-CXR, credentialed data under the PhysioNet Credentialed Health Data "
    "Use Agreement: images, per-case results, conversations, raw responses and case ids (key_ids) may "
    "not be shared; only aggregate scores are published"
)
LOCAL = "<local path removed>"


class PushRefused(ValueError):
    """The staging folder holds something derived from the credentialed data."""


@dataclass
class Staged:
    folder: FsPath
    models: list[str]
    files: list[str]


# ------------------------------------------------------------------------------------ discovery
def _is_model_folder(p: FsPath) -> bool:
    return any(c.is_dir() and (c / "run.json").is_file() for c in p.glob("oracle_*"))


def model_folders(runs_dir: str | os.PathLike[str]) -> dict[str, FsPath]:
    """Results-folder name -> model folder (``<name>/oracle_<setting>/run.json``)."""
    root = FsPath(runs_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder of runs")
    if _is_model_folder(root):
        return {root.resolve().name: root}
    found = {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and _is_model_folder(p)}
    if not found:
        raise FileNotFoundError(
            f"no runs in {root}: expected <model>/oracle_<setting>/run.json (made by chexpercept run)"
        )
    return found


# ------------------------------------------------------------------------------------ provenance
def _looks_local(value: str) -> bool:
    v = value.strip()
    return (
        v.startswith(("/", "~", "./", "../", "file:"))
        or bool(re.match(r"^[A-Za-z]:[\\/]", v))
        or os.path.isabs(v)
        or "/home/" in v
        or "/Users/" in v
    )


def scrub(value: Any) -> Any:
    """run.json without local paths: ``path`` and ``command`` entries go, path-like strings are masked."""
    if isinstance(value, Mapping):
        return {k: scrub(v) for k, v in value.items() if k not in ("path", "command", "cwd", "hostname")}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, str) and _looks_local(value):
        return LOCAL
    return value


def _read_json(path: FsPath) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


# ------------------------------------------------------------------------------------ staging
def _write(folder: FsPath, rel: str, text: str) -> str:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return rel


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stage(
    runs_dir: str | os.PathLike[str],
    staging: str | os.PathLike[str],
    *,
    parse_mode: str = "reference",
    bootstrap: int = 1000,
    seed: int = 0,
    repo: str | None = None,
) -> Staged:
    """Score every model under ``runs_dir`` and write what gets published into ``staging``."""
    from chexpercept.metrics import render_table, score_path

    out = FsPath(staging)
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    reports: dict[str, Any] = {}
    provenance: dict[str, list[dict[str, Any]]] = {}
    for folder_name, folder in model_folders(runs_dir).items():
        metas = {p.parent.name: scrub(_read_json(p)) for p in sorted(folder.glob("oracle_*/run.json"))}
        display = next((m.get("display_name") for m in metas.values() if m.get("display_name")), folder_name)
        report = score_path(folder, mode=parse_mode, name=display)
        if bootstrap:
            report.with_intervals(bootstrap, seed=seed)
        reports[display] = report
        provenance[display] = list(metas.values())
        base = f"models/{folder_name}"
        metrics = {
            "model": display,
            "parse_mode": parse_mode,
            "bundle_fingerprint": report.fingerprint,
            "sources": {k: (s.oracle if s is not None else None) for k, s in report.sources.items()},
            "flat": report.flat,
        }
        files.append(_write(out, f"{base}/metrics.json", _json(metrics)))
        if report.intervals is not None:
            intervals = {
                "level": report.level,
                "n_resamples": report.n_resamples,
                "seed": seed,
                "stratified_by": ["lesion", "path"],
                "values": {k: (list(v) if v else None) for k, v in sorted(report.intervals.items())},
            }
            files.append(_write(out, f"{base}/intervals.json", _json(intervals)))
        for tid in TABLE_IDS:
            one = {display: report}
            ci = report.intervals is not None
            files.append(_write(out, f"{base}/table{tid}.md", render_table(tid, one, intervals=ci)))
            files.append(
                _write(out, f"{base}/table{tid}.csv", render_table(tid, one, fmt="csv", intervals=ci))
            )
        for setting, meta in metas.items():
            files.append(_write(out, f"{base}/run_{setting}.json", _json(meta)))
    ci = all(r.intervals is not None for r in reports.values())
    for tid in TABLE_IDS:
        files.append(_write(out, f"tables/table{tid}.md", render_table(tid, reports, intervals=ci)))
        files.append(
            _write(out, f"tables/table{tid}.csv", render_table(tid, reports, fmt="csv", intervals=ci))
        )
    rows = leaderboard_rows(reports)
    files.append(_write(out, "leaderboard.md", render_leaderboard(rows)))
    write_leaderboard_csv(out / "leaderboard.csv", rows)
    files.append("leaderboard.csv")
    card = dataset_card(reports, provenance, rows, parse_mode=parse_mode, bootstrap=bootstrap, repo=repo)
    files.append(_write(out, "README.md", card))
    return Staged(out, list(reports), sorted(files))


def dataset_card(
    reports: Mapping[str, Any],
    provenance: Mapping[str, Sequence[Mapping[str, Any]]],
    rows: Sequence[Mapping[str, Any]],
    *,
    parse_mode: str,
    bootstrap: int,
    repo: str | None,
) -> str:
    from chexpercept.metrics import render_table

    fingerprints = sorted({r.fingerprint for r in reports.values() if r.fingerprint})
    synthetic = {
        bool(m.get("bundle", {}).get("synthetic"))
        for metas in provenance.values()
        for m in metas
        if "bundle" in m
    }
    lines = [
        "---",
        "pretty_name: CheXpercept scores",
        "tags:",
        "- chexpercept",
        "- benchmark-results",
        "- chest-x-ray",
        "- vision-language-models",
        "---",
        "",
        f"# CheXpercept scores{f' ({repo})' if repo else ''}",
        "",
        "Aggregate scores of vision-language models on **CheXpercept**, the chest X-ray lesion-perception "
        "benchmark (detect, judge a contour, revise it, extract attributes; one multi-turn conversation per "
        "case). Made with `chexpercept push-results`.",
        "",
        "This repository holds scores only. " + AGREEMENT + ".",
        "",
        "## Benchmark bundle",
        "",
        *(f"- fingerprint `{fp}`" for fp in fingerprints),
        *(["- fingerprint: unknown (runs without run.json bundle fields)"] if not fingerprints else []),
        *(
            ["- synthetic (phantom) bundle: the numbers say nothing about the models"]
            if True in synthetic
            else []
        ),
        f"- answers parsed in `{parse_mode}` mode"
        + (f"; 95% intervals from {bootstrap} stratified bootstrap replicates" if bootstrap else ""),
        "",
        "## Models and settings",
        "",
        "| model | model id | backend | oracle runs | temperature | top_p | max tokens | revision (commit) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, metas in provenance.items():
        first = metas[0] if metas else {}
        sampling = first.get("sampling") or {}
        weights = first.get("weights") or {}
        oracles = ", ".join(str(m.get("oracle")) for m in metas)
        lines.append(
            f"| {name} | {first.get('model_id', '')} | {first.get('backend', '')} | {oracles} | "
            f"{sampling.get('temperature', '')} | {sampling.get('top_p', '')} | {sampling.get('max_tokens', '')} | "
            f"{weights.get('commit') or ''} |"
        )
    lines += ["", "## Leaderboard", "", render_leaderboard(rows), "## Table 2", "", render_table(2, reports)]
    lines += [
        "## Files",
        "",
        "- `leaderboard.md`, `leaderboard.csv`: models ranked under End-to-End and Oracle-Passed",
        "- `tables/table<N>.md|csv`: the paper's Tables 2, 3, 8, 9, 10, 11 for all models",
        "- `models/<model>/metrics.json`: the flat metrics (fractions; null = N/A); `intervals.json`; "
        "`table<N>.md|csv`; `run_oracle_<setting>.json`: run provenance (local paths removed)",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ the guard
def _forbidden_keys(value: Any) -> set[str]:
    """Keys of FORBIDDEN_KEYS anywhere in ``value`` that hold text, lists or objects (not counts)."""
    found: set[str] = set()
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k in FORBIDDEN_KEYS and isinstance(v, (str, list, Mapping)):
                found.add(str(k))
            found |= _forbidden_keys(v)
    elif isinstance(value, list):
        for v in value:
            found |= _forbidden_keys(v)
    return found


def problems_of(path: FsPath, rel: str) -> list[str]:
    """Why ``path`` (shown as ``rel``) may not be published; empty when it may."""
    name = path.name.lower()
    out: list[str] = []
    if path.is_symlink() or not path.is_file():
        return [f"{rel}: not a plain file"]
    if name in FORBIDDEN_NAMES:
        out.append(f"{rel}: per-case results of a run ({path.name})")
    parts = [p for p in FORBIDDEN_NAME_PARTS if p in name]
    if parts:
        out.append(f"{rel}: its name says it holds {parts[0].replace('_', ' ')} data")
    if not name.endswith(ALLOWED_SUFFIXES):
        out.append(
            f"{rel}: only {', '.join(ALLOWED_SUFFIXES)} files are published (images and data files never)"
        )
    data = path.read_bytes()
    if data.startswith(IMAGE_MAGIC) or data[128:132] == b"DICM":
        out.append(f"{rel}: image bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        out.append(f"{rel}: binary content")
        return out
    embedded = [t for t in IMAGE_TEXT if t in text]
    if embedded:
        out.append(f"{rel}: embedded image data ({embedded[0]!r})")
    m = KEY_ID_RE.search(text)
    if m:
        out.append(f"{rel}: a case id (key_id) such as {m.group(0)!r}")
    if name.endswith(".json"):
        try:
            keys = _forbidden_keys(json.loads(text))
        except ValueError:
            keys = set()
            out.append(f"{rel}: not valid JSON")
        if keys:
            out.append(f"{rel}: per-case or conversation fields ({', '.join(sorted(keys))})")
    return out


def check_staging(staging: str | os.PathLike[str]) -> list[str]:
    """Every file under ``staging`` (relative, sorted); PushRefused naming each file that may not go."""
    root = FsPath(staging)
    files = sorted(p for p in root.rglob("*") if not p.is_dir())
    problems = [msg for p in files for msg in problems_of(p, p.relative_to(root).as_posix())]
    if problems:
        raise PushRefused(
            "refusing to upload:\n  "
            + "\n  ".join(problems)
            + f"\n{AGREEMENT} (PhysioNet data use agreement)."
        )
    return [p.relative_to(root).as_posix() for p in files]


# ------------------------------------------------------------------------------------ upload
def upload(
    staging: str | os.PathLike[str],
    repo: str,
    *,
    private: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
    message: str = "CheXpercept scores (chexpercept push-results)",
) -> str:
    """Create the dataset repo if needed and commit exactly the checked files; the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    files = check_staging(staging)
    api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
    api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
    root = FsPath(staging)
    operations = [CommitOperationAdd(path_in_repo=rel, path_or_fileobj=str(root / rel)) for rel in files]
    info = api.create_commit(repo, operations, commit_message=message, repo_type="dataset")
    return str(info.commit_url)
