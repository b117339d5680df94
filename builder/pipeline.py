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
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path as FsPath
from typing import Any

from tqdm.auto import tqdm

import chexpercept
from chexpercept.bundle import IMAGES_DIR, JSON_NAME
from chexpercept.vocab import LESIONS, PATHS, Path

from .case_builder import CaseBuilder, Outcome, Settings
from .deformer import DEFORMERS
from .export import WORK_DIR, read_record, remove_stale_case_folders, write_atomic, write_bundle_json
from .regions import PARTITION_MODES
from .selection import Queued, ils_candidates, plan_cells, selection_notes
from .sources import (
    ILS_MASK_DIR,
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

RUN_FILE = "run.json"
#: where ``chexpercept synth`` keeps its phantom sources inside the output's work folder
PHANTOM_SOURCES_DIR = "phantom-sources"
REPORT_FILE = "report.json"


@dataclass
class GenerateConfig:
    """Everything ``generate`` needs; the command line maps onto this one to one."""

    out: str
    per_cell: int
    seed: int = 0
    mimic_cxr_jpg: str | None = None
    cxr_png: str | None = None
    mimic_ils: str | None = None
    lesion_masks: str | None = None
    rosalia_pred: str | None = None
    anatomy: str | None = None
    cxas: str | None = None
    review: list[str] = field(default_factory=list)
    lesions: list[str] = field(default_factory=lambda: list(LESIONS))
    deformer: str = "morphology"
    sam3_checkpoint: str | None = None
    device: str | None = None
    num_proc: int = 1
    fail_fast: bool = False
    partition: str = "reference"
    neutral_option_names: bool = False
    overwrite: bool = False
    progress: bool = True


@dataclass
class Report:
    """What a run did: selected cases per cell, rejections, failures, shortfalls."""

    out: str
    cases: int = 0
    per_cell: dict[str, int] = field(default_factory=dict)
    rejected: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    shortfalls: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0
    built: int = 0
    seconds_built: float = 0.0
    aborted: str | None = None
    notes: list[str] = field(default_factory=list)
    synthetic: bool = False
    reviewed: bool = False

    @property
    def exit_code(self) -> int:
        return 1 if (self.failed or self.shortfalls or self.aborted) else 0

    def summary(self) -> str:
        if self.aborted:
            lines = [f"stopped before writing {self.out}/{JSON_NAME}; finished cases are kept for a rerun"]
        else:
            lines = [f"wrote {self.cases} cases to {self.out}/{JSON_NAME}"]
        lines.append(
            f"  built {self.built} case(s) in {self.seconds_built:.1f} worker-seconds; {self.resumed} taken from an earlier run"
        )
        if self.synthetic:
            lines.append("  phantom data: for testing software only, never for comparing models")
        if not self.reviewed:
            lines.append("  unreviewed: no expert review sheets were given (provenance.reviewed = false)")
        lines += [f"  {note}" for note in self.notes]
        if self.rejected:
            reasons = Counter(r["reason"] for r in self.rejected)
            lines.append(f"  {len(self.rejected)} candidate(s) rejected and replaced:")
            lines += [f"    {n} x {reason}" for reason, n in reasons.most_common()]
        if self.failed:
            lines.append(f"  {len(self.failed)} case(s) FAILED:")
            lines += [f"    {f['key_id']}: {f['error']}" for f in self.failed]
        for s in self.shortfalls:
            lines.append(
                f"  SHORT: {s['lesion']} {s['path']}: {s['have']} of {s['wanted']} cases (no candidates left)"
            )
        if self.aborted:
            lines.append(f"  ABORTED: {self.aborted}")
        return "\n".join(lines)


def _settings_fingerprint(config: GenerateConfig) -> dict[str, Any]:
    """The settings that decide the bundle's content; a rerun must match them to resume."""
    keys = (
        "per_cell",
        "seed",
        "mimic_cxr_jpg",
        "cxr_png",
        "mimic_ils",
        "lesion_masks",
        "rosalia_pred",
        "anatomy",
        "cxas",
        "lesions",
        "deformer",
        "sam3_checkpoint",
        "partition",
        "neutral_option_names",
    )
    d = {k: getattr(config, k) for k in keys}
    for k in ("mimic_cxr_jpg", "cxr_png", "mimic_ils", "lesion_masks", "rosalia_pred", "anatomy", "cxas"):
        if d[k]:
            d[k] = str(FsPath(d[k]).resolve())
    d["review"] = sorted(
        f"{FsPath(p).resolve()} sha256:{hashlib.sha256(FsPath(p).read_bytes()).hexdigest()}"
        for p in config.review
    )
    d["generator"] = f"chexpercept {chexpercept.__version__}"
    return d


def _prepare_out(config: GenerateConfig, fingerprint: dict[str, Any]) -> FsPath:
    root = FsPath(config.out)
    work = root / WORK_DIR
    run_file = work / RUN_FILE
    if run_file.is_file():
        previous = json.loads(run_file.read_text(encoding="utf-8"))
        if previous != fingerprint:
            if not config.overwrite:
                changed = sorted(
                    k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k)
                )
                raise SourceError(
                    f"{root} holds a run with different settings ({', '.join(changed)}); "
                    "use a new --out folder, or --overwrite to start over"
                )
            _clear(root)
    elif root.is_dir() and any(root.iterdir()):
        ours = {IMAGES_DIR, JSON_NAME, WORK_DIR}
        foreign = [p.name for p in root.iterdir() if p.name not in ours]
        if foreign and not config.overwrite:
            raise SourceError(
                f"--out {root} is not empty and was not written by generate ({', '.join(sorted(foreign)[:5])})"
            )
        if config.overwrite:
            _clear(root)
    work.mkdir(parents=True, exist_ok=True)
    write_atomic(run_file, json.dumps(fingerprint, indent=1, sort_keys=True).encode("utf-8"))
    return root


def _clear(root: FsPath) -> None:
    """Remove a previous run's output (the phantom sources that ``synth`` keeps in the work folder stay)."""
    import shutil

    if (root / IMAGES_DIR).exists():
        shutil.rmtree(root / IMAGES_DIR)
    if (root / JSON_NAME).exists():
        (root / JSON_NAME).unlink()
    work = root / WORK_DIR
    if work.is_dir():
        for child in work.iterdir():
            if child.name == PHANTOM_SOURCES_DIR:
                continue
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()


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
            cached = json.loads(index.read_text(encoding="utf-8"))
            if cached.get("stamp") == stamp:
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


def _check_checkpoint(checkpoint: str | None) -> None:
    """A local SAM 3 folder must exist; anything else must look like a Hub id (owner/name)."""
    if not checkpoint:
        raise SourceError("--deformer sam3 needs --sam3-checkpoint (a local folder or a Hub id)")
    path = FsPath(checkpoint).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise SourceError(f"--sam3-checkpoint: {path} has no config.json (a save_pretrained folder)")
        return
    if checkpoint.startswith((".", "/", "~")) or checkpoint.count("/") != 1:
        raise SourceError(f"--sam3-checkpoint: {checkpoint} is neither an existing folder nor a Hub id")


def _has_mask_folders(folder: FsPath) -> bool:
    return any((child / "right_lung.png").is_file() for child in folder.iterdir() if child.is_dir())


# ------------------------------------------------------------------------------------ worker plumbing
_BUILDER: CaseBuilder | None = None


def _init_worker(settings: Settings) -> None:
    global _BUILDER
    _BUILDER = CaseBuilder(settings)


def _work(queued: Queued) -> Outcome:
    assert _BUILDER is not None
    return _BUILDER.build(queued)


class _Runner:
    """Runs batches of cases in-process (num_proc 1) or on a spawn pool (num_proc > 1)."""

    def __init__(self, settings: Settings, num_proc: int):
        self.settings = settings
        self.num_proc = num_proc
        self.pool: ProcessPoolExecutor | None = None
        self.local: CaseBuilder | None = None

    def __enter__(self) -> _Runner:
        if self.num_proc > 1:
            self.pool = ProcessPoolExecutor(
                max_workers=self.num_proc,
                mp_context=get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.settings,),
            )
        else:
            try:
                self.local = CaseBuilder(self.settings)
            except (ImportError, OSError, ValueError) as e:
                raise SourceError(f"cannot build the {self.settings.deformer} deformer: {e}") from e
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def run(self, batch: list[Queued], on_done) -> bool:
        """Build every case of the batch, calling on_done(outcome) as each finishes; False to stop early."""
        if self.local is not None:
            return all(on_done(self.local.build(queued)) for queued in batch)
        assert self.pool is not None
        pending: set[Future] = {self.pool.submit(_work, q) for q in batch}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                if not on_done(fut.result()):
                    for p in pending:
                        p.cancel()
                    return False
        return True


def parse_lesions(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``--lesions`` in the vocabulary's order; unknown names raise SourceError."""
    lesions = tuple(name for name in LESIONS if name in {x.lower() for x in names})
    unknown = sorted({x.lower() for x in names} - set(LESIONS))
    if unknown or not lesions:
        raise SourceError(
            f"unknown lesion(s) {', '.join(unknown) or '(none given)'}; expected {', '.join(LESIONS)}"
        )
    return lesions


def plan_candidates(ils: dict, lesions: tuple[str, ...], *, seed: int, rosalia: bool, review=None):
    """generate's candidate selection (shared with ``chexpercept review``): (positives, negatives,
    seeded cell queues, has_mask). With ROSALIA predictions every positive has a mask."""
    positives, negatives = ils_candidates(ils, lesions)
    has_mask = (lambda c: True) if rosalia else (lambda c: c.seg_mask_path is not None)
    cells = plan_cells(positives, negatives, seed=seed, lesions=lesions, review=review, has_mask=has_mask)
    return positives, negatives, cells, has_mask


def generate(config: GenerateConfig) -> Report:
    """Run the whole pipeline; see the module docstring. Raises SourceError for bad global inputs."""
    if config.per_cell < 1:
        raise SourceError(f"--per-cell must be >= 1, got {config.per_cell}")
    if config.deformer not in DEFORMERS:
        raise SourceError(f"--deformer must be one of {', '.join(DEFORMERS)}")
    if config.partition not in PARTITION_MODES:
        raise SourceError(f"--partition must be one of {', '.join(PARTITION_MODES)}")
    lesions = parse_lesions(config.lesions)
    if bool(config.mimic_cxr_jpg) == bool(config.cxr_png):
        raise SourceError(
            "give exactly one of --mimic-cxr-jpg (the JPG tree) or --cxr-png (flat 1024x1024 PNGs)"
        )
    cxr = (
        CxrTree.jpg_tree(config.mimic_cxr_jpg) if config.mimic_cxr_jpg else CxrTree.png_folder(config.cxr_png)
    )  # type: ignore[arg-type]
    if not config.mimic_ils:
        raise SourceError("--mimic-ils is required")
    ils = load_ils(config.mimic_ils)
    ils_root = FsPath(config.mimic_ils)
    ils_root = ils_root if ils_root.is_dir() else ils_root.parent
    lesion_masks = config.lesion_masks or str(ils_root / ILS_MASK_DIR)
    if not config.rosalia_pred and not FsPath(lesion_masks).is_dir():
        raise SourceError(f"lesion masks folder {lesion_masks} does not exist (MIMIC-ILS lesion_mask/)")
    if config.rosalia_pred and not FsPath(config.rosalia_pred).is_dir():
        raise SourceError(f"--rosalia-pred: folder {config.rosalia_pred} does not exist")
    review = read_review_sheets(config.review) if config.review else None
    if not config.anatomy:
        raise SourceError("--anatomy is required: per-image mask folders or the CheXmask table")
    if config.deformer == "sam3":
        _check_checkpoint(config.sam3_checkpoint)

    positives, negatives, cells, has_mask = plan_candidates(
        ils, lesions, seed=config.seed, rosalia=bool(config.rosalia_pred), review=review
    )

    fingerprint = _settings_fingerprint(config)
    root = _prepare_out(config, fingerprint)
    work = root / WORK_DIR
    positive_ids = sorted(
        {q.candidate.dicom_id for (_, p), qs in cells.items() if p is not Path.LF for q in qs}
    )
    anatomy = _anatomy(config, positive_ids, work)

    synthetic = is_phantom(config.mimic_ils, config.mimic_cxr_jpg, config.cxr_png, config.anatomy)
    provenance = {
        "synthetic": synthetic,
        "generator": f"chexpercept {chexpercept.__version__}",
        "seed": config.seed,
        "deformer": config.deformer,
        "reviewed": review is not None,
    }
    deformer_options: dict[str, Any] = {}
    if config.deformer == "sam3":
        deformer_options = {"checkpoint": config.sam3_checkpoint, "device": config.device}
    settings = Settings(
        out=str(root),
        seed=config.seed,
        cxr=cxr,
        lesion_masks=lesion_masks,
        rosalia=config.rosalia_pred,
        anatomy=anatomy,
        deformer=config.deformer,
        deformer_options=deformer_options,
        partition=config.partition,
        neutral_names=config.neutral_option_names,
        provenance=provenance,
    )
    report = Report(out=str(root), synthetic=synthetic, reviewed=review is not None)
    report.notes = selection_notes(positives, negatives, cells, review=review, has_mask=has_mask)
    selected = _run_rounds(cells, config, settings, root, report)
    _finish(root, selected, config, report, lesions)
    write_atomic(work / REPORT_FILE, json.dumps(asdict(report), indent=1).encode("utf-8"))
    return report


def _run_rounds(
    cells: dict[tuple[str, Path], list[Queued]],
    config: GenerateConfig,
    settings: Settings,
    root: FsPath,
    report: Report,
) -> dict[tuple[str, Path], list[Outcome]]:
    """Process candidates round by round until every cell has N successes or no candidates left."""
    next_index = {cell: 0 for cell in cells}
    ok: dict[tuple[str, Path], list[Outcome]] = {cell: [] for cell in cells}
    bar = tqdm(
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
            report.rejected.append({"key_id": outcome.key_id, "reason": outcome.reason or ""})
        else:
            report.failed.append({"key_id": outcome.key_id, "error": outcome.reason or ""})
            bar.write(f"FAILED {outcome.key_id}: {outcome.reason}", file=sys.stderr)
            if config.fail_fast:
                stop["abort"] = f"--fail-fast after {outcome.key_id} failed"
                return False
        if outcome.resumed:
            report.resumed += 1
        else:
            report.built += 1
            report.seconds_built += outcome.seconds
        return True

    try:
        with _Runner(settings, config.num_proc) as runner:
            while stop["abort"] is None:
                batch: list[Queued] = []
                for cell, queue in cells.items():
                    need = config.per_cell - len(ok[cell])
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
    report.aborted = stop["abort"]
    for cell in ok:
        ok[cell].sort(key=lambda o: o.rank)
    return ok


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
    selected: dict[tuple[str, Path], list[Outcome]],
    config: GenerateConfig,
    report: Report,
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
        report.per_cell[f"{lesion}/{path.value}"] = min(len(outs), config.per_cell)
        if len(outs) < config.per_cell and report.aborted is None:
            report.shortfalls.append(
                {"lesion": lesion, "path": path.value, "have": len(outs), "wanted": config.per_cell}
            )
    if report.aborted is not None:  # leave the finished cases for a rerun; no partial chexpercept.json
        return
    report.cases = len(entries)
    remove_stale_case_folders(root, set(entries))
    write_bundle_json(root, entries)


__all__ = ["PATHS", "GenerateConfig", "Report", "generate"]
