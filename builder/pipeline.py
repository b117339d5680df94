"""``chexpercept generate``: PhysioNet sources (or phantom ones) -> a release bundle.

The run: read MIMIC-ILS and build seeded candidate queues per (lesion, path) cell; then, round by
round, submit to the workers exactly as many candidates of each cell as it still lacks, and keep, per
cell, the first N cases (in queue order) that succeed. Rejected candidates (a documented reason, e.g.
no plausible deformation) are replaced by the next ones; failing candidates (an unreadable file, a bug)
are reported with their key_id and replaced too, and make the run exit non-zero. Every finished case
is saved atomically, so a rerun with the same settings skips it; the bundle is byte-identical for a
seed whatever the number of workers.
"""

from __future__ import annotations

import hashlib
import json
import sys
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path as FsPath
from typing import Any

import chexpercept
from chexpercept.fileio import write_atomic
from chexpercept.input_json import read_json
from chexpercept.progress import progress_bar
from chexpercept.vocab import Path

from .case_builder import Outcome, Settings
from .case_selection import Queued, ils_candidates, plan_cells, selection_notes
from .config import GenerateConfig, check_cxr_choice, check_ils_given, lesion_mask_root
from .export import read_record, remove_stale_case_folders, write_bundle_json
from .source_paths import check_candidates
from .sources import (
    Anatomy,
    CxrTree,
    SourceError,
    check_anatomy_folder,
    extract_chexmask_rows,
    find_chexmask_csv,
    is_phantom,
    load_ils,
    read_review_sheets,
)
from .summary import GenerationSummary
from .workers import CaseRunner
from .workspace import PHANTOM_SOURCES_DIR, Workspace

Cell = tuple[str, Path]


def plan_candidates(ils: dict, lesions: tuple[str, ...], *, seed: int, rosalia: bool, review=None):
    """generate's candidate selection (shared with ``chexpercept review``): (positives, negatives,
    seeded cell queues, has_mask). With ROSALIA predictions every positive has a mask."""
    positives, negatives = ils_candidates(ils, lesions)
    has_mask = (lambda c: True) if rosalia else (lambda c: c.seg_mask_path is not None)
    cells = plan_cells(positives, negatives, seed=seed, lesions=lesions, review=review, has_mask=has_mask)
    return positives, negatives, cells, has_mask


def generate(config: GenerateConfig) -> GenerationSummary:
    """Run the whole pipeline; see the module docstring. Raises SourceError for bad global inputs."""
    config.check()
    lesions = config.selected_lesions()
    sources = Sources.of(config)
    review = sources.review
    positives, negatives, cells, has_mask = plan_candidates(
        sources.ils, lesions, seed=config.seed, rosalia=bool(sources.rosalia_pred), review=review
    )
    anatomy_folder = config.anatomy if config.anatomy and FsPath(config.anatomy).is_dir() else None
    check_candidates(  # every id and path of the sources stays inside its folder, before any work
        (q.candidate for qs in cells.values() for q in qs),
        sources.cxr,
        sources.lesion_masks,
        sources.rosalia_pred,
        anatomy_folder=anatomy_folder,
        cxas=config.cxas,
    )

    workspace = Workspace(config.out)
    workspace.prepare(config.fingerprint(), config.overwrite)
    root = workspace.root
    positive_ids = sorted(
        {q.candidate.dicom_id for (_, p), qs in cells.items() if p is not Path.LF for q in qs}
    )
    anatomy = _anatomy(config, positive_ids, workspace.work)

    synthetic = is_phantom(config.mimic_ils, config.mimic_cxr_jpg, config.cxr_png, config.anatomy)
    provenance = {
        "synthetic": synthetic,
        "generator": f"chexpercept {chexpercept.__version__}",
        "seed": config.seed,
        "deformer": config.deformer,
        **({"sam3_impl": config.sam3_impl} if config.deformer == "sam3" else {}),
        "reviewed": review is not None,
    }
    settings = Settings(
        out=str(root),
        seed=config.seed,
        cxr=sources.cxr,
        lesion_masks=sources.lesion_masks,
        rosalia=sources.rosalia_pred,
        anatomy=anatomy,
        deformer=config.deformer,
        deformer_options=config.deformer_options(),
        partition=config.partition,
        neutral_names=config.neutral_option_names,
        provenance=provenance,
    )
    summary = GenerationSummary(out=str(root), synthetic=synthetic, reviewed=review is not None)
    summary.notes = selection_notes(positives, negatives, cells, review=review, has_mask=has_mask)
    selected = _run_rounds(cells, config, settings, root, summary)
    _finish(root, selected, config, summary, lesions)
    workspace.write_summary(asdict(summary))
    return summary


@dataclass(frozen=True)
class Sources:
    """The generator's inputs, each resolved and checked once as it is read (``generate`` and
    ``review prepare`` both start here): the CXR tree, the MIMIC-ILS table, where the lesion masks
    are (MIMIC-ILS's folder, or the reference's ``rosalia_pred`` predictions), and the review
    sheets (or None)."""

    cxr: CxrTree
    ils: dict
    lesion_masks: str
    rosalia_pred: str | None = None
    review: dict[str, bool] | None = None

    @classmethod
    def read(
        cls,
        *,
        mimic_cxr_jpg: str | None,
        cxr_png: str | None,
        mimic_ils: str | None,
        lesion_masks: str | None,
        rosalia_pred: str | None,
        review: str | None = None,
    ) -> Sources:
        """Read and check every source; SourceError names the first one missing or malformed."""
        check_cxr_choice(mimic_cxr_jpg, cxr_png)
        cxr = CxrTree.jpg_tree(mimic_cxr_jpg) if mimic_cxr_jpg else CxrTree.png_folder(cxr_png)  # type: ignore[arg-type]
        check_ils_given(mimic_ils)
        assert mimic_ils
        ils = load_ils(mimic_ils)
        masks = lesion_mask_root(mimic_ils, lesion_masks)
        if not rosalia_pred and not FsPath(masks).is_dir():
            raise SourceError(f"lesion masks folder {masks} does not exist (MIMIC-ILS lesion_mask/)")
        if rosalia_pred and not FsPath(rosalia_pred).is_dir():
            raise SourceError(f"--rosalia-pred: folder {rosalia_pred} does not exist")
        sheets = read_review_sheets(review) if review else None
        return cls(cxr, ils, masks, rosalia_pred, sheets)

    @classmethod
    def of(cls, config: GenerateConfig) -> Sources:
        return cls.read(
            mimic_cxr_jpg=config.mimic_cxr_jpg,
            cxr_png=config.cxr_png,
            mimic_ils=config.mimic_ils,
            lesion_masks=config.lesion_masks,
            rosalia_pred=config.rosalia_pred,
            review=config.review,
        )


def _anatomy(config: GenerateConfig, dicom_ids: list[str], work: FsPath) -> Anatomy:
    """Where the lung masks come from (generate has checked that --anatomy is given)."""
    assert config.anatomy
    cxas = config.cxas
    if cxas:
        check_anatomy_folder(cxas, "--cxas")
    source = FsPath(config.anatomy)
    table = find_chexmask_csv(source)
    if table is not None and (source.is_file() or not _has_mask_folders(source)):
        rows = work / "chexmask_rows.jsonl"
        index = work / "chexmask_rows.index.json"
        stamp = {
            "table": str(table.resolve()),
            "size": table.stat().st_size,
            "ids": hashlib.sha256("\n".join(sorted(dicom_ids)).encode()).hexdigest(),
        }
        offsets = None
        if rows.is_file() and index.is_file():
            try:
                cached = read_json(index, what="CheXmask row index")
            except (OSError, ValueError):  # unreadable: the rows are extracted again
                cached = None
            if isinstance(cached, dict) and cached.get("stamp") == stamp:
                offsets = cached["offsets"]
        if offsets is None:
            print(f"reading the CheXmask table {table} (once per output folder) ...", file=sys.stderr)
            offsets = extract_chexmask_rows(table, dicom_ids, rows)
            write_atomic(index, json.dumps({"stamp": stamp, "offsets": offsets}).encode("utf-8"))
        return Anatomy(chexmask_rows=str(rows), chexmask_offsets=offsets, cxas=cxas)
    if not source.exists():
        raise SourceError(f"--anatomy: {source} does not exist")
    if source.is_file():
        raise SourceError(f"--anatomy: {source} is neither a mask folder nor a CheXmask CSV table")
    return Anatomy(folder=str(source), cxas=cxas)


def _has_mask_folders(folder: FsPath) -> bool:
    return any((child / "right_lung.png").is_file() for child in folder.iterdir() if child.is_dir())


def _run_rounds(
    cells: dict[Cell, list[Queued]],
    config: GenerateConfig,
    settings: Settings,
    root: FsPath,
    summary: GenerationSummary,
) -> dict[Cell, list[Outcome]]:
    """Process candidates round by round until every cell has N successes or no candidates left."""
    next_index = {cell: 0 for cell in cells}
    ok: dict[Cell, list[Outcome]] = {cell: [] for cell in cells}
    bar = progress_bar(
        total=sum(min(config.per_cell, len(q)) for q in cells.values()),
        desc="generate",
        unit="case",
        disable=not config.progress,
        file=sys.stderr,
    )
    stop = {"abort": None}

    def on_done(outcome: Outcome) -> bool:
        cell = (outcome.lesion, outcome.path)
        if outcome.status == "ok":
            ok[cell].append(outcome)
            bar.update()
        elif outcome.status == "rejected":
            summary.rejected.append({"key_id": outcome.key_id, "reason": outcome.reason or ""})
        else:
            summary.failed.append({"key_id": outcome.key_id, "error": outcome.reason or ""})
            bar.write(f"FAILED {outcome.key_id}: {outcome.reason}", file=sys.stderr)
            if config.fail_fast:
                stop["abort"] = f"--fail-fast after {outcome.key_id} failed"
                return False
        if outcome.resumed:
            summary.resumed += 1
        else:
            summary.built += 1
            summary.seconds_built += outcome.seconds
        return True

    try:
        with CaseRunner(settings, config.num_proc) as runner:
            while stop["abort"] is None:
                batch = _next_batch(cells, ok, next_index, config.per_cell, root, on_done)
                if not batch:  # every cell is full or out of candidates
                    break
                if not runner.run(batch, on_done):
                    break
    except BrokenProcessPool as e:
        stop["abort"] = (
            f"a worker process died ({e}); finished cases are saved, rerun to resume "
            "(with --deformer sam3, also check that the checkpoint loads with --num-proc 1)"
        )
    finally:
        bar.close()
    summary.aborted = stop["abort"]
    for cell in ok:
        ok[cell].sort(key=lambda o: o.rank)
    return ok


def _next_batch(
    cells: dict[Cell, list[Queued]],
    ok: dict[Cell, list[Outcome]],
    next_index: dict[Cell, int],
    per_cell: int,
    root: FsPath,
    on_done,
) -> list[Queued]:
    """The candidates to build next: as many of each cell as it still lacks, taking finished ones from
    an earlier run (reported through on_done) instead of building them again."""
    batch: list[Queued] = []
    for cell, queue in cells.items():
        need = per_cell - len(ok[cell])
        while need > 0 and next_index[cell] < len(queue):
            queued = queue[next_index[cell]]
            next_index[cell] += 1
            record = read_record(root, queued.candidate.key_id)
            if record is not None and record.get("path") == queued.path.value:
                on_done(_resumed(queued, record))
                if record.get("status") == "ok":
                    need -= 1
                continue
            batch.append(queued)
            need -= 1
    return batch


def _resumed(queued: Queued, record: dict[str, Any]) -> Outcome:
    c = queued.candidate
    return Outcome(
        c.key_id,
        c.lesion,
        queued.path,
        queued.rank,
        record["status"],
        entry=record.get("entry"),
        reason=record.get("reason"),
        resumed=True,
    )


def _finish(
    root: FsPath,
    selected: dict[Cell, list[Outcome]],
    config: GenerateConfig,
    summary: GenerationSummary,
    lesions: tuple[str, ...],
) -> None:
    """Write chexpercept.json: negatives first, then positives (as the reference), lesions in order."""
    entries: dict[str, dict[str, Any]] = {}
    order = [Path.LF, Path.RR, Path.RF]
    for group in (order[:1], order[1:]):
        for lesion in lesions:
            outcomes = [o for path in group for o in selected[(lesion, path)][: config.per_cell]]
            outcomes.sort(key=lambda o: (o.path is not Path.RR, o.rank))
            for o in outcomes:
                assert o.entry is not None
                entries[o.key_id] = o.entry
    for (lesion, path), outs in selected.items():
        summary.per_cell[f"{lesion}/{path.value}"] = min(len(outs), config.per_cell)
        if len(outs) < config.per_cell and summary.aborted is None:
            summary.shortfalls.append(
                {"lesion": lesion, "path": path.value, "have": len(outs), "wanted": config.per_cell}
            )
    if summary.aborted is not None:  # leave the finished cases for a rerun; no partial chexpercept.json
        return
    summary.cases = len(entries)
    remove_stale_case_folders(root, set(entries))
    write_bundle_json(root, entries)


__all__ = ["PHANTOM_SOURCES_DIR", "GenerateConfig", "GenerationSummary", "generate"]
