"""``write_report``: every output of ``chexpercept report`` from a folder of runs, in one call.

It finds the runs (metrics/discovery.py), loads and scores them with the metric library
(``load_run``, ``score_model``, intervals, ``render_table``), then writes:

- ``tables.md`` and ``tables/table<N>.{md,csv}``: the paper's Tables 2, 3, 8, 9, 10, 11 (with intervals);
- ``comparisons.{md,csv}``: paired comparisons of the models next to each other on the End-to-End
  leaderboard (metrics/comparisons.py);
- ``leaderboard.{md,csv}``: models ranked under End-to-End and under Oracle-Passed; with a leaderboard
  read from the Hub (``hub_leaderboard``), ``leaderboard.md`` also shows the Hub's rows and a ranking of
  the local End-to-End scores beside them, each row marked with where it comes from, and
  ``hub_leaderboard.csv`` holds the Hub's rows;
- the reference's CSVs per run and across models (metrics/report/reference_csv.py);
- ``figures/``: the four plots of the reference and a per-lesion heatmap for the models' headline
  numbers, and the reference's figures per oracle setting beside its CSVs (metrics/report/plots.py);
- ``index.html`` with ``data/`` and ``assets/``: the summary and the case viewer (metrics/report/page.py,
  metrics/report/cases.py); ``metrics.json``: every number as data.

A model's headline numbers combine its runs as the metric library decides (End-to-End from the
``none`` run or exactly from a greedy oracle run; Oracle-Passed from the ``implicit`` run). The per-run
CSVs and figures score each run on its own, as the reference does.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path as FsPath
from typing import Any, cast

from chexpercept.bundle import Bundle
from chexpercept.escape import csv_cell, markdown_cell
from chexpercept.fileio import copy_file, private_dir, replaced_dir, write_atomic
from chexpercept.input_files import IMAGE
from chexpercept.metrics.discovery import (
    RunFolder,
    check_one_identity,
    discover_runs,
    load_run,
    unread_entries,
)
from chexpercept.metrics.leaderboard import leaderboard_rows, render_leaderboard, write_leaderboard_csv
from chexpercept.metrics.model_scores import run_parse_mode, score_model
from chexpercept.metrics.partial import csv_value, different_cases, different_cases_markdown, markdown_line
from chexpercept.metrics.runs import NoFinishedCases, open_bundle
from chexpercept.metrics.tables import TABLE_IDS, legend, render_table, zero_width
from chexpercept.results import ORACLE_SETTINGS
from chexpercept.vocab import LESIONS, PATHS

from ..answer_warnings import (
    DEFAULT_THRESHOLD,
    AnswerWarning,
    answer_warnings,
    merge_warnings,
    parse_rate_table,
)
from ..hub.leaderboard import (
    HubBoard,
    hub_leaderboard_csv,
    render_hub_leaderboard,
    render_side_by_side,
    side_by_side,
)
from ..model_scores import said_once
from . import plots, reference_csv
from .cases import ViewerRun, write_viewer_data
from .page import Figure, Section, figures_html, markdown_to_html, write_index_html

FIGURES_DIR = "figures"
ANSWERS_NOTE = (
    "How each task's answers were read (the report's parse mode). An unread answer is scored as wrong; "
    "**Cut off**: unread replies that used the run's whole `--max-tokens` budget. A warning above the "
    f"page names every run where more than {DEFAULT_THRESHOLD:.0%} of a task's answers could not be read."
)
PHANTOM_BANNER = (
    "**Phantom data.** These runs were made on a synthetic bundle: the numbers test the software and "
    "say nothing about any model."
)
EMBEDDED_BANNER = (
    "**This folder contains credentialed images** (copied with --embed-images): share it only with "
    "people covered by the PhysioNet data use agreement."
)


@dataclass
class ReportOutput:
    """What ``write_report`` wrote, and what it noticed."""

    out: FsPath
    models: list[str]
    runs: list[str]
    cases: int
    index_html: FsPath | None
    tables_md: FsPath
    leaderboard_md: FsPath
    files: list[FsPath] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: runs whose answers could not be read (metrics/answer_warnings.py): shown as banners
    warnings: list[AnswerWarning] = field(default_factory=list)
    seconds: float = 0.0
    #: seconds per phase (load, score, intervals, tables, csv, figures, viewer, html)
    timings: dict[str, float] = field(default_factory=dict)
    table2: str = ""

    def moved(self, old: FsPath, new: FsPath) -> ReportOutput:
        """The same outputs after their folder moved from ``old`` to ``new``."""

        def there(p: FsPath) -> FsPath:
            return new / FsPath(p).relative_to(old)

        return replace(
            self,
            out=new,
            index_html=there(self.index_html) if self.index_html is not None else None,
            tables_md=there(self.tables_md),
            leaderboard_md=there(self.leaderboard_md),
            files=[there(p) for p in self.files],
        )


def resolve_bundle(
    bundle: str | os.PathLike[str] | Bundle | None, runs: Sequence[RunFolder]
) -> tuple[Bundle | None, list[str]]:
    """The bundle the runs were made on: the one given, else the one run.json names, if it is on disk."""
    notes: list[str] = []
    found = open_bundle(bundle)
    if found is None:
        recorded = [(r, r.meta.bundle.path) for r in runs if r.meta.bundle and r.meta.bundle.path]
        existing = [(r, p) for r, p in recorded if (FsPath(p) / "chexpercept.json").is_file()]
        if not existing:
            where = f" (run.json names {recorded[0][1]})" if recorded else ""
            notes.append(
                f"the bundle is not on this disk{where}: the case viewer shows the recorded conversations "
                "without images; pass --data-dir DIR to show them"
            )
            return None, notes
        found = open_bundle(existing[0][1])
    fingerprint = found.fingerprint()
    for run in runs:
        recorded_fp = run.meta.bundle.fingerprint if run.meta.bundle else None
        if recorded_fp and recorded_fp != fingerprint:
            raise ValueError(
                f"{run.folder}: run.json's bundle fingerprint {recorded_fp[:12]}... differs from the bundle "
                f"at {found.root} ({fingerprint[:12]}...): the run was made on other questions; pass the "
                "bundle it was made on with --data-dir"
            )
    images = found.images_fingerprint() if any(run.meta.images_fingerprint for run in runs) else None
    for run in runs:  # the case viewer shows the bundle's images as the ones the model saw
        recorded_images = run.meta.images_fingerprint
        if recorded_images and recorded_images != images:
            raise ValueError(
                f"{run.folder}: run.json's settings.bundle_images {recorded_images.removeprefix('sha256:')[:12]}"
                f"... differs from the images of the bundle at {found.root} "
                f"({(images or '').removeprefix('sha256:')[:12]}...): the run was made on other images; pass the "
                "bundle it was made on with --data-dir"
            )
    return found, notes


def _load(
    folders: Sequence[RunFolder], bundle: Bundle | None, *, greedy: bool | None = None
) -> tuple[list[RunFolder], list[Any], list[str]]:
    """(the run folders that hold a finished case, their runs, a note for each that holds none:
    left out of every table, the other runs reported); ``greedy``: ``load_run``'s override."""
    kept, loaded, notes = [], [], []
    for rf in folders:
        if rf.layout == "reference" and bundle is None:
            raise ValueError(
                f"{rf.results_file}: reference results do not store the questions; pass the bundle "
                "they were made on with --data-dir DIR"
            )
        try:
            loaded.append(load_run(rf.folder, bundle=bundle, model=rf.model, greedy=greedy))
        except NoFinishedCases as e:
            notes.append(f"{e}: not reported")
            continue
        kept.append(rf)
    if not kept:
        raise ValueError(f"no run has a finished case ({'; '.join(notes)})")
    return kept, loaded, notes


def _summary_rows(model: str, flat: dict[str, float | None]) -> list[dict[str, Any]]:
    """Rows of the stage-accuracy figure, read from the same CSV rows the reference writes."""
    out = []
    for row in reference_csv.summary_rows(model, flat):
        setting = reference_csv.SETTINGS[row["setting"]]
        path = next(p.value for p in PATHS if p.reference_name == row["path"])
        out.append(
            {
                "path": path,
                "model": model,
                "setting": setting,
                **{f"stage{k}": row[f"acc(stage{k})"] for k in (1, 2, 3, 4)},
                "depth": row["depth"],
            }
        )
    return out


def _draw_figures(
    folder: FsPath, values_by_model: dict[str, dict[str, float | None]], *, label: str
) -> dict[str, FsPath | str]:
    """The five figures for a set of models (flat values plus per-lesion values): per file name, the
    PNG drawn, or the sentence saying why there is nothing to draw (``plots.NothingToPlot``)."""
    models = list(values_by_model)
    rows = [row for name in models for row in _summary_rows(name, values_by_model[name])]
    sub = {
        name: {k[len("sub/") :]: v for k, v in values.items() if k.startswith("sub/")}
        for name, values in values_by_model.items()
    }
    depth = {
        name: {p.value: values.get(f"depth/{p.value}") for p in PATHS}
        for name, values in values_by_model.items()
    }
    lesion: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, values in values_by_model.items():
        lesion[name] = {}
        for les in LESIONS:
            cells = {
                key: values.get(
                    f"lesion/{les}/e2e/stage1/all" if key == "stage1" else f"lesion/{les}/{key}/all"
                )
                for key, _ in plots.LESION_PANELS
            }
            if any(v is not None for v in cells.values()):
                lesion[name][les] = cells
    drawers = {
        plots.STAGE_ACCURACY_PNG: lambda p: plots.plot_stage_accuracy(rows, p, oracle=label),
        plots.CONTOUR_REVISION_PNG: lambda p: plots.plot_contour_revision_detail(sub, p),
        plots.ATTRIBUTE_EXTRACTION_PNG: lambda p: plots.plot_attribute_extraction_detail(sub, p),
        plots.DEPTH_HEATMAP_PNG: lambda p: plots.plot_depth_heatmap(depth, p),
        plots.LESION_HEATMAP_PNG: lambda p: plots.plot_lesion_heatmap(lesion, p),
    }
    out: dict[str, FsPath | str] = {}
    for name, draw in drawers.items():
        try:
            out[name] = draw(folder / name)
        except plots.NothingToPlot as e:  # the sentence is shown in the figure's place
            out[name] = str(e)
    return out


def _figure_entries(out: FsPath, drawn: dict[str, FsPath | str], captions: bool = True) -> list[Figure]:
    """The page's figures: each drawn PNG, or the sentence saying why there is none."""
    return [
        Figure("", _FIGURE_CAPTIONS[name] if captions else name, note=what)
        if isinstance(what, str)
        else Figure(str(what.relative_to(out)), _FIGURE_CAPTIONS[name] if captions else name)
        for name, what in drawn.items()
    ]


def _sources_label(reports: dict[str, Any]) -> str:
    """Which runs the headline numbers come from, for the stage-accuracy figure's title."""
    e2e = sorted({src.oracle for rep in reports.values() if (src := rep.sources.get("e2e")) is not None})
    op = sorted({src.oracle for rep in reports.values() if (src := rep.sources.get("op")) is not None})
    if e2e == op and len(e2e) == 1:
        return e2e[0]
    return f"E2E from {'/'.join(e2e) or 'N/A'}, OP from {'/'.join(op) or 'N/A'}"


_FIGURE_CAPTIONS = {
    plots.STAGE_ACCURACY_PNG: "Stage accuracy per path (End-to-End rows blue, Oracle-Passed rows orange)",
    plots.CONTOUR_REVISION_PNG: "Stage 3 sub-tasks on RR, Oracle-Passed",
    plots.ATTRIBUTE_EXTRACTION_PNG: "Stage 4 sub-tasks on RR and RF, Oracle-Passed",
    plots.DEPTH_HEATMAP_PNG: "Mean End-to-End depth per path",
    plots.LESION_HEATMAP_PNG: "Stage accuracy per lesion",
}


def _runs_section(
    folders: Sequence[RunFolder], loaded: Sequence[Any], reports: dict[str, Any], mode: str
) -> Section:
    lines = [
        f"Scored with **{mode}** answer parsing. A model's End-to-End and Oracle-Passed numbers each come "
        "from the run that measures them:",
        "",
        "| Model | Oracle | Backend | Cases | Greedy | Run's parse mode | Folder |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rf, run in zip(folders, loaded):
        greedy = {True: "yes", False: "no", None: "unknown"}[run.greedy]
        backend = str(rf.meta.backend or rf.layout)
        lines.append(
            f"| {rf.model} | {rf.oracle} | {backend} | {len(run.records)} | {greedy} | "
            f"{run.parse_mode or 'unknown'} | `{rf.folder}` |"
        )
    lines.append("")
    for name, rep in reports.items():
        lines.append(f"- **{name}**: " + "; ".join(rep.source_lines()))
        lines.extend(f"- {name}: {note}" for note in rep.notes)
    return Section("runs", "Runs", markdown_to_html("\n".join(lines)))


def _score(
    folders: Sequence[RunFolder], loaded: Sequence[Any], mode: str
) -> tuple[dict[tuple[str, str], Any], list[str], dict[str, Any]]:
    """(per run scores, model names, per model scores): each run is scored once, and a model's
    scores reuse its runs' scores."""
    per_run = {
        (rf.model, rf.oracle): score_model([run], mode=mode, name=rf.model)
        for rf, run in zip(folders, loaded)
    }
    models = sorted({rf.model for rf in folders})
    reports = {}
    for name in models:
        mine = [(rf, run) for rf, run in zip(folders, loaded) if rf.model == name]
        runs = [run for _, run in mine]
        # one row from one identity, as score (a red team's finding: report mixed them without a word);
        # its settings folders may come from model folders of this name under several --results
        parents = list(dict.fromkeys(rf.folder.parent for rf, _ in mine))
        check_one_identity(FsPath(" and ".join(map(str, parents))) if len(parents) > 1 else parents[0], runs)
        scored = {run.oracle: per_run[(name, run.oracle)].scores[run.oracle] for run in runs}
        reports[name] = score_model(runs, mode=mode, name=name, scores=scored)
    return per_run, models, reports


@dataclass
class _Tables:
    """The paper's tables and the leaderboard, as written."""

    files: list[FsPath]
    #: each table in markdown, in paper order
    blocks: list[str]
    ci_note: str
    tables_md: FsPath
    board: list[dict[str, Any]]
    leaderboard_md: FsPath
    hub: HubBoard | None = None


def _board_markdown(board: Sequence[dict[str, Any]], hub: HubBoard | None) -> str:
    """The leaderboard in markdown; with ``hub``, the Hub's rows and both side by side after it."""
    text = render_leaderboard(board)
    if hub is not None:
        text += "\n" + render_hub_leaderboard(hub.entries, hub.repo)
        text += "\n" + render_side_by_side(side_by_side(board, hub), hub.repo)
    return text


def _write_tables(
    out: FsPath,
    reports: dict[str, Any],
    *,
    intervals: bool,
    title: str,
    hub: HubBoard | None = None,
    banner: str = "",
) -> _Tables:
    """The tables and the leaderboard as markdown and CSV; ``banner`` (the phantom-data warning)
    heads every markdown file, as the HTML page's banners head the page."""
    files: list[FsPath] = []
    private_dir(out / "tables")
    blocks = []
    for tid in TABLE_IDS:
        md = render_table(tid, reports, fmt="markdown", intervals=intervals, mark_no_variation=intervals)
        files.append(_write(out / "tables" / f"table{tid}.md", banner + md))
        files.append(
            _write(
                out / "tables" / f"table{tid}.csv",
                render_table(tid, reports, fmt="csv", intervals=intervals),
            )
        )
        blocks.append(md)
    ci_note = legend(intervals, marked=intervals and zero_width(reports))
    mark = markdown_line(reports)  # also before each table: a reader may jump to one
    tables_md = _write(
        out / "tables.md", f"# {title}: tables\n\n{banner}{mark}{ci_note}\n\n" + "\n".join(blocks)
    )
    files.append(tables_md)
    board = leaderboard_rows(reports)
    leaderboard_md = _write(
        out / "leaderboard.md", banner + different_cases_markdown(reports) + _board_markdown(board, hub)
    )
    files += [leaderboard_md, write_leaderboard_csv(out / "leaderboard.csv", board)]
    if hub is not None:
        files.append(_write(out / "hub_leaderboard.csv", hub_leaderboard_csv(hub.entries)))
    return _Tables(files, blocks, ci_note, tables_md, board, leaderboard_md, hub)


@dataclass
class _Comparisons:
    """The paired comparisons of models next to each other on the End-to-End leaderboard."""

    files: list[FsPath]
    markdown: str


def adjacent_pairs(board: Sequence[dict[str, Any]], setting: str = "e2e") -> list[tuple[str, str]]:
    """(better, next) model names for each two models next to each other on the ranked board."""
    ranked = [r["model"] for r in board if r["setting"] == setting and r["rank"] is not None]
    return list(itertools.pairwise(ranked))


def _write_comparisons(
    out: FsPath, reports: dict[str, Any], board: Sequence[dict[str, Any]], *, title: str
) -> _Comparisons:
    """``comparisons.md`` (Table 2's family for each adjacent pair of the End-to-End leaderboard) and
    ``comparisons.csv`` (every family of those pairs)."""
    from ..comparisons import compare, csv_rows, how_to_read, render_comparison

    intro = (
        "Each model against the next one on the End-to-End leaderboard, on the cases both were scored on: "
        "Table 2's numbers (every family, Table 8's paths and Table 9's lesions included, in "
        "`comparisons.csv`; any two models: `chexpercept score A B --compare`)."
    )
    blocks, rows, header = [intro, ""], [], ["model_a", "model_b"]
    pairs = adjacent_pairs(board)
    if not pairs:
        blocks.append("Comparisons need two models with End-to-End numbers; this report has fewer.")
    explained = False
    for a, b in pairs:
        try:
            comparison = compare(reports[a], reports[b])
        except ValueError as e:  # other bundles, no shared case: said, not fatal
            blocks += [f"**{markdown_cell(a)} - {markdown_cell(b)}**: not compared: {markdown_cell(e)}.", ""]
            continue
        if not explained:  # how to read the tables, once
            blocks += [how_to_read(comparison), ""]
            explained = True
        blocks.append(render_comparison(comparison, families=["2"], explain=False))
        names, pair_rows = csv_rows(comparison, families=["all"])
        header = max(header, ["model_a", "model_b", *names], key=len)  # with a partial column if any
        rows += [[csv_cell(a), csv_cell(b), *row] for row in pair_rows]
    rows = [row + [""] * (len(header) - len(row)) for row in rows]  # whole pairs: an empty partial cell
    markdown = "\n".join(blocks)
    md = _write(out / "comparisons.md", f"# {title}: paired comparisons\n\n{markdown}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return _Comparisons([md, _write(out / "comparisons.csv", buf.getvalue())], markdown)


def _write_reference_csvs(
    out: FsPath, per_run: dict[tuple[str, str], Any], settings: Sequence[str], na_as_zero: bool
) -> list[FsPath]:
    """The reference's CSVs: per run, then across models per oracle setting."""
    files: list[FsPath] = []
    for (name, oracle), rep in per_run.items():
        files += reference_csv.write_run_csvs(
            out / model_dirname(name) / f"oracle_{oracle}",
            name,
            rep.flat,
            na_as_zero=na_as_zero,
            partial=csv_value(rep),
        )
    for setting in settings:
        folder = out / f"all_models_oracle_{setting}"
        chosen = {name: rep for (name, oracle), rep in per_run.items() if oracle == setting}
        files += reference_csv.write_all_models_csvs(
            folder,
            {n: r.flat for n, r in chosen.items()},
            na_as_zero=na_as_zero,
            partial={n: csv_value(r) for n, r in chosen.items()},
        )
    return files


def _write_figures(
    out: FsPath, reports: dict[str, Any], per_run: dict[tuple[str, str], Any], settings: Sequence[str]
) -> tuple[list[FsPath], list[Figure], dict[str, list[Figure]]]:
    """(files, the headline figures, per oracle setting the per-run figures)."""
    files: list[FsPath] = []
    per_setting_figures: dict[str, list[Figure]] = {}
    headline_values = {n: r.values for n, r in reports.items()}
    label = _sources_label(reports)
    headline = _draw_figures(out / FIGURES_DIR, headline_values, label=label)
    files += [p for p in headline.values() if not isinstance(p, str)]
    figures = _figure_entries(out, headline)
    for setting in settings:
        chosen = {name: rep.values for (name, oracle), rep in per_run.items() if oracle == setting}
        folder = out / f"all_models_oracle_{setting}"
        if label == setting and chosen == headline_values:  # the same numbers: same figures
            drawn = {
                n: p if isinstance(p, str) else copy_file(p, folder / p.name, limit=IMAGE)
                for n, p in headline.items()
            }
        else:
            drawn = _draw_figures(folder, chosen, label=setting)
        files += [p for p in drawn.values() if not isinstance(p, str)]
        per_setting_figures[setting] = _figure_entries(out, drawn, captions=False)
    return files, figures, per_setting_figures


def _viewer_runs(
    folders: Sequence[RunFolder], loaded: Sequence[Any], per_run: dict[tuple[str, str], Any]
) -> list[ViewerRun]:
    viewer_runs = []
    for i, (rf, run) in enumerate(zip(folders, loaded)):
        scores = per_run[(rf.model, rf.oracle)].scores[rf.oracle]
        scored = {key: scores.case(j) for j, key in enumerate(scores.key_ids)}
        viewer_runs.append(
            ViewerRun(f"r{i}", rf.label, rf.model, rf.oracle, {r.key_id: r for r in run.records}, scored)
        )
    return viewer_runs


def _page_sections(
    out: FsPath,
    tables: _Tables,
    comparisons: _Comparisons,
    figures: Sequence[Figure],
    per_setting_figures: dict[str, list[Figure]],
    runs_section: Section,
    files: Sequence[FsPath],
    reports: dict[str, Any],
) -> list[Section]:
    sections = [
        Section("leaderboard", "Leaderboard", markdown_to_html(_board_markdown(tables.board, tables.hub))),
        Section("tables", "Tables", markdown_to_html(tables.ci_note + "\n\n" + "\n".join(tables.blocks))),
        Section("comparisons", "Comparisons", markdown_to_html(comparisons.markdown)),
        Section(
            "answers", "Answers read", markdown_to_html(ANSWERS_NOTE + "\n\n" + parse_rate_table(reports))
        ),
    ]
    if figures:
        extra = "".join(
            f"<details><summary>Per-run figures, oracle {s} (each run scored on its own, as the reference "
            f"does)</summary>{figures_html(ps)}</details>"
            for s, ps in per_setting_figures.items()
        )
        sections.append(Section("figures", "Figures", figures_html(figures) + extra))
    sections.append(runs_section)
    sections.append(Section("files", "Files", _files_html(out, files)))
    return sections


def _synthetic(folders: Sequence[RunFolder], bundle: Bundle | None) -> bool:
    """Whether these runs were made on a phantom bundle (the bundle says so, or a run.json does)."""
    return bool(bundle is not None and bundle.synthetic) or any(
        bool(rf.meta.bundle.synthetic) if rf.meta.bundle else False for rf in folders
    )


def _banners(
    folders: Sequence[RunFolder],
    bundle: Bundle | None,
    embed_images: bool,
    notes: Sequence[str],
    warnings: Sequence[AnswerWarning],
) -> list[str]:
    banners = []
    if _synthetic(folders, bundle):
        banners.append(PHANTOM_BANNER)
    if embed_images:
        banners.append(EMBEDDED_BANNER)
    banners.extend(f"**Unreadable answers.** {w.text()}" for w in warnings)
    banners.extend(notes)
    return banners


#: the file that marks a folder as a report, so that a rerun replaces it and nothing else
REPORT_MARKER = ".chexpercept-report"


def write_report(
    results: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] = "report",
    **options: Any,
) -> ReportOutput:
    """Write the whole report for the runs under ``results`` into ``out`` (see the module docstring
    and ``_write_into`` for the options).

    The report is built in a folder beside ``out`` and takes its place in one rename when it is
    complete (chexpercept/fileio.py ``replaced_dir``): a report stopped midway leaves the previous
    one whole. ``out`` must be new, empty, or an earlier report (it holds ``.chexpercept-report``);
    any other folder is refused (``NotOursError``) before any work.
    """
    final = FsPath(out)
    with replaced_dir(final, marker=REPORT_MARKER) as stage:
        output = _write_into(results, stage, **options)
    return output.moved(stage, final)


def _write_into(
    results: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: FsPath,
    *,
    bundle: str | os.PathLike[str] | Bundle | None = None,
    mode: str | None = None,
    greedy: bool | None = None,
    embed_images: bool = False,
    intervals: bool = True,
    n_resamples: int | None = None,
    seed: int | None = None,
    na_as_zero: bool = False,
    plots: bool = True,
    html: bool = True,
    title: str = "CheXpercept report",
    hub_leaderboard: HubBoard | None = None,
) -> ReportOutput:
    """Write the whole report for the runs under ``results`` into ``out`` (see the module docstring).

    intervals: the tables' 95% intervals (design-based, metrics/inference.py). n_resamples, seed: the
    earlier bootstrap's; n_resamples=0 still means no intervals, other values and seed are not used.
    na_as_zero: write the reference's 0.0 instead of an empty cell where a CSV cell does not apply.
    greedy: how every run was decoded where its run.json does not say (None: as recorded; over a
    recorded value a WARNING), as ``chexpercept score --greedy/--sampled``.
    hub_leaderboard: a leaderboard read from the Hub (``chexpercept.metrics.hub.leaderboard.read_leaderboard``) to show
    beside the local runs, marked as taken from the Hub.
    """
    start = time.perf_counter()
    clock = _Clock()
    roots = [results] if isinstance(results, (str, os.PathLike)) else list(results)
    folders = discover_runs(*roots)
    bundle_obj, notes = resolve_bundle(bundle, folders)
    notes += [f"{entry}: {why}: not reported" for root in roots for entry, why in unread_entries(root)]
    folders, loaded, empty = _load(folders, bundle_obj, greedy=greedy)
    notes.extend(empty)
    clock.lap("load")
    notes.extend(_notes_once((rf.label, note) for rf in folders for note in rf.notes))

    files: list[FsPath] = []

    # --- scores: per model (headline numbers) and per run (the reference's per-run view), in one
    # parse mode: the one the runs were made with unless --parse-mode says another
    mode = run_parse_mode(loaded, cast(Any, mode))[0]
    per_run, models, reports = _score(folders, loaded, mode)
    cases_line = different_cases(reports)
    if cases_line:  # said in the page and on the terminal too
        notes.append(cases_line)
    warnings = merge_warnings([w for rep in reports.values() for w in answer_warnings(rep)])
    clock.lap("score")
    if n_resamples is not None:
        intervals = intervals and n_resamples > 0
    if intervals:
        for rep in reports.values():
            rep.with_intervals()
    clock.lap("intervals")

    # --- the paper's tables and the leaderboard
    phantom = PHANTOM_BANNER + "\n\n" if _synthetic(folders, bundle_obj) else ""
    tables = _write_tables(
        out, reports, intervals=intervals, title=title, hub=hub_leaderboard, banner=phantom
    )
    files += tables.files
    comparisons = _write_comparisons(out, reports, tables.board, title=title)
    files += comparisons.files
    clock.lap("tables")

    # --- the reference's CSVs and figures, per run and per oracle setting
    settings = [s for s in ORACLE_SETTINGS if any(o == s for _, o in per_run)]
    files += _write_reference_csvs(out, per_run, settings, na_as_zero)
    clock.lap("csv")
    figures: list[Figure] = []
    per_setting_figures: dict[str, list[Figure]] = {}
    if plots:
        figure_files, figures, per_setting_figures = _write_figures(out, reports, per_run, settings)
        files += figure_files
    clock.lap("figures")

    # --- everything as data
    data = {
        "models": {name: rep.to_dict() for name, rep in reports.items()},
        "runs": {f"{name}/oracle_{oracle}": rep.flat for (name, oracle), rep in per_run.items()},
        "leaderboard": tables.board,
        "notes": notes,
    }
    if hub_leaderboard is not None:
        data["hub_leaderboard"] = {
            "repo": hub_leaderboard.repo,
            "entries": [{**vars(e), "status": e.status} for e in hub_leaderboard.entries],
        }
    files.append(_write(out / "metrics.json", json.dumps(data, indent=1, default=str)))

    # --- the HTML report
    index_html = None
    n_cases = len({r.key_id for run in loaded for r in run.records})
    if html:
        write_viewer_data(out, _viewer_runs(folders, loaded, per_run), bundle_obj, embed_images=embed_images)
        clock.lap("viewer")
        runs_section = _runs_section(folders, loaded, reports, mode)
        sections = _page_sections(
            out, tables, comparisons, figures, per_setting_figures, runs_section, files, reports
        )
        banners = _banners(folders, bundle_obj, embed_images, notes, warnings)
        subtitle = f"{len(models)} model(s), {len(folders)} run(s), {n_cases} cases"
        index_html = write_index_html(out, title=title, sections=sections, banners=banners, subtitle=subtitle)
        files.append(index_html)
        clock.lap("html")

    return ReportOutput(
        out=out,
        models=models,
        runs=[rf.label for rf in folders],
        cases=n_cases,
        index_html=index_html,
        tables_md=tables.tables_md,
        leaderboard_md=tables.leaderboard_md,
        files=files,
        notes=notes + _model_notes(folders, reports),
        warnings=warnings,
        seconds=time.perf_counter() - start,
        timings=clock.laps,
        table2=render_table("2", reports, fmt="markdown", intervals=False),
    )


def _notes_once(items: Iterable[tuple[str, str]]) -> list[str]:
    """Each distinct note once, naming what it concerns: (subject, note) pairs -> "note (a, b)"."""
    return [f"{note} ({', '.join(names)})" for note, names in said_once(items)]


def _model_notes(folders: Sequence[RunFolder], reports: dict[str, Any]) -> list[str]:
    """The models' notes, each said once: a note about a run folder ("<folder>: ...") is grouped
    with the same note about other folders."""
    items = []
    for name, rep in reports.items():
        prefixes = [f"{rf.folder}: " for rf in folders if rf.model == name]
        for note in rep.notes:
            prefix = next((p for p in prefixes if note.startswith(p)), None)
            items.append((prefix[:-2], note[len(prefix) :]) if prefix else (name, note))
    return _notes_once(items)


def model_dirname(model: str) -> str:
    """The folder of a model's per-run CSVs: its name, with path separators made safe (HF ids:
    ``org/name`` -> ``org__name``); any other character outside letters, digits, ``.``, ``_`` and ``-``
    (a control character, markup, a space) becomes ``_``, with a short hash of the name to keep it
    unique."""
    name = model.replace("/", "__").replace("\\", "__").strip(". ")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    if safe != name:
        safe += "-" + hashlib.sha1(model.encode("utf-8")).hexdigest()[:8]
    return safe or "model"


class _Clock:
    """Seconds spent per phase of the report."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.last
        self.last = now


def _write(path: FsPath, text: str) -> FsPath:
    return write_atomic(path, text)


def _files_html(out: FsPath, files: Sequence[FsPath]) -> str:
    import html as _html

    items = [
        f'<li><a href="{_html.escape(str(p.relative_to(out)))}">{_html.escape(str(p.relative_to(out)))}</a></li>'
        for p in files
        if p.suffix in (".csv", ".md", ".json")
    ]
    return "<ul>" + "".join(items) + "</ul>"
