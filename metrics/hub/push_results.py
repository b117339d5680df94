"""Publish scores to a Hugging Face Hub dataset repo, never the data they were computed from.

``stage(runs_dir, staging)`` scores every model folder under ``runs_dir`` with the public scorer API
and writes, through a manifest (``chexpercept.metrics.hub.guard``), what a paper's table needs: per
model the flat metrics, the intervals, the tables (markdown and CSV) and run.json reduced to its known
fields with local paths removed; for all models the tables, a leaderboard and a README (dataset
card). Each model is published under a name of the registry or a baseline, or under the label the user
gives it (``names``: ``--name FOLDER=LABEL``), never under the text its run folder holds
(``chexpercept.metrics.hub.names``). Each file has its schema (``chexpercept.metrics.hub.scores_repo``); ``Staged.verify()`` checks
the folder against the manifest, the schemas and the bundle's own case identifiers, and ``upload``
sends exactly the verified bytes in one commit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any, cast

from chexpercept.escape import terminal
from chexpercept.input_json import read_json
from chexpercept.metrics.hub.guard import AGREEMENT, Context, Manifest, PushRefused, json_text, round_floats
from chexpercept.metrics.hub.identifiers import for_runs
from chexpercept.metrics.hub.names import LOCAL, NameRefused, PublishedModel, check_repo_id, published_model
from chexpercept.metrics.hub.scores_repo import (
    INTERVALS,
    METRICS,
    PROVENANCE,
    PROVENANCE_FILE,
    card_schema,
    dataset_card,
    leaderboard_schemas,
    table_schemas,
)
from chexpercept.metrics.leaderboard import leaderboard_csv, leaderboard_rows, render_leaderboard
from chexpercept.metrics.tables import TABLE_IDS
from chexpercept.os_errors import explain_os_error

__all__ = ["AGREEMENT", "LOCAL", "PushRefused", "Staged", "model_folders", "scrub", "stage", "upload"]


@dataclass
class Staged:
    """What ``stage`` wrote: the folder, the models, the files (sorted) and the manifest."""

    folder: FsPath
    models: list[str]
    files: list[str]
    manifest: Manifest

    def verify(self) -> dict[str, bytes]:
        """The files' bytes when the guard passes them; PushRefused otherwise."""
        return self.manifest.verify()


# ------------------------------------------------------------------------------------ discovery
def _is_model_folder(p: FsPath) -> bool:
    return any(c.is_dir() and (c / "run.json").exists() for c in p.glob("oracle_*"))


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


def provenance(run_json: Mapping[str, Any]) -> dict[str, Any]:
    """What is published of a run.json: its known fields (``scores_repo.PROVENANCE``), local paths
    masked, numbers rounded to 6 decimals."""
    return round_floats(PROVENANCE.project(scrub(dict(run_json))))


def _read_json(path: FsPath) -> dict[str, Any]:
    try:
        data = read_json(path, what="run.json")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {explain_os_error(e).what}") from e
    except ValueError as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


# ------------------------------------------------------------------------------------ staging
def _model_metas(folder: FsPath) -> dict[str, dict[str, Any]]:
    """oracle_<setting> -> that run's run.json (as read) for one model folder."""
    return {p.parent.name: _read_json(p) for p in sorted(folder.glob("oracle_*/run.json"))}


def publish_as(meta: Mapping[str, Any], model: PublishedModel) -> dict[str, Any]:
    """A published run.json (``provenance``) with the model's names replaced by how it is published:
    ``model`` its slug, ``display_name`` its name, ``model_id`` (and the weights') the registry's or
    baseline's id, else null."""
    out = dict(meta)
    out.update(model=model.slug, display_name=model.name, model_id=model.model_id)
    if isinstance(out.get("weights"), Mapping):
        out["weights"] = {**out["weights"], "model_id": model.model_id}
    return out


def _labels(names: Mapping[str, str] | None, folders: Mapping[str, FsPath]) -> dict[str, str]:
    """``--name`` as folder -> label: ``{"": LABEL}`` names the one model folder."""
    labels = dict(names or {})
    if "" in labels:
        if len(folders) != 1:
            raise NameRefused(
                f"--name LABEL names the one model of RUNS_DIR, but it holds {len(folders)} "
                f"({', '.join(terminal(f) for f in folders)}): give --name FOLDER=LABEL for each"
            )
        labels[next(iter(folders))] = labels.pop("")
    unknown = sorted(set(labels) - set(folders))
    if unknown:
        raise NameRefused(f"--name names no model folder of RUNS_DIR: {', '.join(map(repr, unknown))}")
    return labels


def _recorded(metas: Mapping[str, Mapping[str, Any]]) -> list[tuple[str | None, str | None, str | None]]:
    return [
        (
            (m.get("bundle") or {}).get("path"),
            (m.get("bundle") or {}).get("fingerprint"),
            (m.get("settings") or {}).get("bundle_images"),
        )
        for m in metas.values()
    ]


def stage(
    runs_dir: str | os.PathLike[str],
    staging: str | os.PathLike[str],
    *,
    parse_mode: str | None = None,
    bootstrap: int = 1000,
    seed: int = 0,
    repo: str | None = None,
    bundle: str | os.PathLike[str] | None = None,
    names: Mapping[str, str] | None = None,
) -> Staged:
    """Score every model under ``runs_dir`` and write what gets published into ``staging`` (new or
    empty). ``bundle``: the bundle the runs were made on (default: the one run.json names), whose
    case identifiers the upload is checked against; ValueError when it is not on this disk.
    ``names``: results-folder name -> the label to publish that model under (``""`` for the one
    model of ``runs_dir``); a model outside the registry and the baselines needs one. NameRefused
    (a ValueError) when a model has no name that may be published, or a label or ``repo`` breaks
    its rule (``chexpercept.metrics.hub.names``)."""
    from chexpercept.metrics import render_table, score_path
    from chexpercept.metrics.partial import refuse_not_own, refuse_partial

    if repo is not None:
        check_repo_id(repo, "--repo")
    folders = model_folders(runs_dir)
    all_metas = {name: _model_metas(folder) for name, folder in folders.items()}
    labels = _labels(names, folders)
    models = {f: published_model(f, all_metas[f], labels.get(f)) for f in folders}
    for attr in ("slug", "name"):
        seen: dict[str, str] = {}
        for f, m in models.items():
            other = seen.setdefault(getattr(m, attr), f)
            if other != f:
                raise NameRefused(
                    f"models {terminal(other)} and {terminal(f)} would both be published as "
                    f"{getattr(m, attr)!r}: give one of them another name with --name FOLDER=LABEL"
                )
    identifiers = for_runs(bundle, [r for metas in all_metas.values() for r in _recorded(metas)])
    reports: dict[str, Any] = {}
    published: dict[str, dict[str, dict[str, Any]]] = {}
    for folder_name, folder in folders.items():
        model = models[folder_name]
        metas = {setting: publish_as(provenance(m), model) for setting, m in all_metas[folder_name].items()}
        display = model.name
        report = score_path(folder, bundle=bundle, mode=cast(Any, parse_mode), name=display)
        refuse_partial(report, str(folder))
        refuse_not_own(report, str(folder))
        if bootstrap:
            report.with_intervals(bootstrap, seed=seed)
        for key_id in report.matrix.key_ids:
            identifiers.add("key_id", key_id)
        reports[display] = report
        published[display] = metas
    modes = {report.mode for report in reports.values()}
    if len(modes) > 1:
        made = ", ".join(f"{name}: {report.mode}" for name, report in reports.items())
        raise ValueError(
            f"the models were made with different parse modes ({terminal(made)}); one publication states "
            "one: publish them separately"
        )
    parse_mode = modes.pop()
    manifest = Manifest(
        staging, Context(identifiers, frozenset().union(*(m.strings for m in models.values())))
    )

    ci = bool(bootstrap)
    md_table = {tid: table_schemas(tid, intervals=ci) for tid in TABLE_IDS}
    for (folder_name, _), (display, report) in zip(folders.items(), reports.items()):
        base = f"models/{models[folder_name].slug}"
        metrics = {
            "model": display,
            "parse_mode": parse_mode,
            "bundle_fingerprint": report.fingerprint,
            "sources": {k: (s.oracle if s is not None else None) for k, s in report.sources.items()},
            "flat": round_floats(report.flat),
        }
        manifest.write(f"{base}/metrics.json", json_text(metrics), METRICS)
        if report.intervals is not None:
            intervals = {
                "level": report.level,
                "n_resamples": report.n_resamples,
                "seed": seed,
                "stratified_by": ["lesion", "path"],
                "values": {k: (list(v) if v else None) for k, v in sorted(report.intervals.items())},
            }
            manifest.write(f"{base}/intervals.json", json_text(round_floats(intervals)), INTERVALS)
        for tid in TABLE_IDS:
            one = {display: report}
            md, csv_schema = md_table[tid]
            manifest.write(f"{base}/table{tid}.md", render_table(tid, one, intervals=ci), md)
            manifest.write(
                f"{base}/table{tid}.csv", render_table(tid, one, fmt="csv", intervals=ci), csv_schema
            )
        for setting, meta in published[display].items():
            manifest.write(f"{base}/run_{setting}.json", json_text(meta), PROVENANCE_FILE)
    for tid in TABLE_IDS:
        md, csv_schema = md_table[tid]
        manifest.write(f"tables/table{tid}.md", render_table(tid, reports, intervals=ci), md)
        manifest.write(
            f"tables/table{tid}.csv", render_table(tid, reports, fmt="csv", intervals=ci), csv_schema
        )
    rows = leaderboard_rows(reports)
    board_md, board_csv = leaderboard_schemas()
    manifest.write("leaderboard.md", render_leaderboard(rows), board_md)
    manifest.write("leaderboard.csv", leaderboard_csv(round_floats(rows)), board_csv)
    card = dataset_card(
        reports,
        {name: list(m.values()) for name, m in published.items()},
        rows,
        parse_mode=parse_mode,
        bootstrap=bootstrap,
        repo=repo,
    )
    manifest.write("README.md", card, card_schema(repo))
    return Staged(manifest.root, list(reports), manifest.files, manifest)


# ------------------------------------------------------------------------------------ upload
def upload(
    staged: Staged,
    repo: str,
    *,
    private: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
    message: str = "CheXpercept scores (chexpercept push-results)",
) -> str:
    """Create the dataset repo if needed and commit exactly the verified files; the commit URL.
    PushRefused when the staging folder no longer passes the guard."""
    from chexpercept.metrics.hub.commit import upload as commit

    done = commit(
        staged.manifest,
        repo,
        repo_type="dataset",
        message=message,
        private=private,
        endpoint=endpoint,
        token=token,
    )
    return done.commit_url
