"""Preparing a review: generate's candidates (same seed, same rules), overlays, the annotator split.

The review folder holds ``review.json`` (the settings, the annotators and one item per candidate:
lesion, source sentence, where its CXR is, which annotators review it), ``overlays/<key_id>.png`` (the
candidate lesion mask in the 1024 x 1024 frame as a two-colour PNG with a transparent background) and,
once annotators work, ``decisions/<annotator>.jsonl`` (see ``store``). CXR images are not copied; the
server reads them from the source folder.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import string
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path as FsPath

import numpy as np
from PIL import Image

from chexpercept.containment import output_path
from chexpercept.domains import COUNT
from chexpercept.escape import csv_cell
from chexpercept.fileio import private_dir, write_atomic
from chexpercept.progress import progress_bar
from chexpercept.vocab import LESIONS
from chexpercept.vocab import Path as CasePath

from ..case_selection import Candidate, Queued
from ..config import parse_lesions
from ..pipeline import Sources, plan_candidates
from ..source_paths import check_candidates, cxr_path, lesion_mask_path
from ..sources import (
    CaseInputError,
    CxrTree,
    SourceError,
    is_phantom,
    iter_studies,
    load_mask,
)
from .manifest import MANIFEST, MANIFEST_VERSION, load_manifest

OVERLAY_DIR = "overlays"
PREPARE_ERRORS = "prepare_errors.csv"


@dataclass
class ReviewSources:
    """The source options, spelled as ``generate``'s."""

    mimic_cxr_jpg: str | None = None
    cxr_png: str | None = None
    mimic_ils: str | None = None
    lesion_masks: str | None = None
    rosalia_pred: str | None = None
    seed: int = 0
    lesions: list[str] = field(default_factory=lambda: list(LESIONS))
    per_cell: int | None = None  # review the first N candidates of each (lesion, path) cell; None: all


@dataclass
class ReviewItem:
    key_id: str
    lesion: str
    positive: bool
    path: str  # the (lesion, path) cell generate queued it in: RR, RF or LF
    rank: int
    pair_id: str
    pair_type: str
    study_id: str
    dicom_id: str
    sentence: str
    section: str
    instruction: str
    location: list[str]
    cxr: str
    overlay: str | None
    annotators: list[str] = field(default_factory=list)


def annotator_names(n: int) -> list[str]:
    """A, B, C, ... (the reference's annotator_<A..>); R01, R02, ... beyond 26."""
    if n < 1:
        raise SourceError(f"--annotators must be >= 1, got {n}")
    if n <= 26:
        return list(string.ascii_uppercase[:n])
    return [f"R{i + 1:02d}" for i in range(n)]


def split(n_items: int, annotators: list[str], reviews_per_case: int) -> list[list[str]]:
    """Deterministic round robin over review slots: item t takes slots tK, ..., tK+K-1, slot s goes to
    annotator s mod N; so every item gets K different annotators (K <= N) and any two annotators' loads
    differ by at most one (the reference deals rows round robin too, K = 1)."""
    n = len(annotators)
    if not 1 <= reviews_per_case <= n:
        raise SourceError(
            f"--reviews-per-case must be between 1 and --annotators ({n}), got {reviews_per_case}"
        )
    k = reviews_per_case
    return [[annotators[(t * k + j) % n] for j in range(k)] for t in range(n_items)]


_NUMBERED = re.compile(r"(?:^|\s)(\d+)\.\s+")


def sentences(section: str) -> dict[str, str]:
    """'1. A. 2. B.' -> {'1': 'A.', '2': 'B.'} (MIMIC-ILS numbers the sentences of a report section)."""
    marks = list(_NUMBERED.finditer(section or ""))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(section)
        out[m.group(1)] = section[m.end() : end].strip()
    return out


def source_sentence(study: dict, pair: dict) -> str:
    """The report sentence(s) a positive pair came from (``sent_idx``), else the pair's answer text."""
    idx = pair.get("sent_idx")
    section = str(study.get("section_content") or "")
    if idx not in (None, ""):
        wanted = [str(x).strip() for x in (idx if isinstance(idx, list) else str(idx).split(","))]
        found = sentences(section)
        picked = [found[i] for i in wanted if i in found]
        if picked:
            return " ".join(picked)
    answer = str(pair.get("answer") or "").replace("[SEG]", "").strip()
    return answer


def _pairs_by_id(ils: dict) -> dict[str, tuple[dict, dict]]:
    out = {}
    for _, study in iter_studies(ils):
        pairs = study.get("instruction_answer_pairs") or {}
        for pair in [*(pairs.get("positive_pairs") or []), *(pairs.get("negative_pairs") or [])]:
            if pair.get("pair_id"):
                out[str(pair["pair_id"])] = (study, pair)
    return out


def overlay_png(mask: np.ndarray) -> bytes:
    """A two-colour palette PNG: transparent background, the mask in opaque red."""
    im = Image.fromarray(mask.astype(np.uint8), mode="L").convert("P")
    im.putpalette([0, 0, 0, 255, 40, 40] + [0, 0, 0] * 254)
    buf = io.BytesIO()
    im.save(buf, format="PNG", transparency=0, optimize=False, compress_level=6)
    return buf.getvalue()


def _settings(src: ReviewSources, lesions: tuple[str, ...], annotators: list[str], k: int) -> dict:
    d = asdict(src)
    for key in ("mimic_cxr_jpg", "cxr_png", "mimic_ils", "lesion_masks", "rosalia_pred"):
        if d[key]:
            d[key] = str(FsPath(d[key]).resolve())
    d["lesions"] = list(lesions)
    d["annotators"] = annotators
    d["reviews_per_case"] = k
    return d


@dataclass
class Prepared:
    manifest: dict
    seconds: float
    reused: bool
    errors: list[tuple[str, str]]


def prepare(
    review_dir: str | os.PathLike[str],
    src: ReviewSources,
    *,
    annotators: int = 6,
    reviews_per_case: int = 1,
    progress: bool = True,
) -> Prepared:
    """Choose the candidates as ``generate`` does, write overlays and ``review.json`` (reused when a
    review with the same settings is already there)."""
    start = time.perf_counter()
    root = FsPath(review_dir)
    lesions = parse_lesions(src.lesions)
    names = annotator_names(annotators)
    settings = _settings(src, lesions, names, reviews_per_case)
    split(0, names, reviews_per_case)  # checks K <= N before any work
    if (root / MANIFEST).is_file():
        return Prepared(_reuse(root, settings), time.perf_counter() - start, True, [])
    sources = Sources.read(
        mimic_cxr_jpg=src.mimic_cxr_jpg,
        cxr_png=src.cxr_png,
        mimic_ils=src.mimic_ils,
        lesion_masks=src.lesion_masks,
        rosalia_pred=src.rosalia_pred,
    )
    cxr, ils, lesion_masks = sources.cxr, sources.ils, sources.lesion_masks
    problem = None if src.per_cell is None else COUNT.problem(src.per_cell)
    if problem:
        raise SourceError(f"--per-cell {problem}, got {src.per_cell!r}")

    queued = _queue(ils, lesions, src)
    # every id and path of the sources stays inside its folder, before anything is written
    check_candidates((q.candidate for q in queued), cxr, lesion_masks, src.rosalia_pred)
    private_dir(root / OVERLAY_DIR)  # credentialed: overlays, report sentences
    items, errors = _items(root, queued, _pairs_by_id(ils), cxr, src.rosalia_pred, lesion_masks, progress)
    for item, who in zip(items, split(len(items), names, reviews_per_case)):
        item.annotators = who
    if errors:
        _write_errors(root, errors)
    manifest = {
        "version": MANIFEST_VERSION,
        "settings": settings,
        "synthetic": is_phantom(src.mimic_ils, src.mimic_cxr_jpg, src.cxr_png),
        "annotators": names,
        "reviews_per_case": reviews_per_case,
        "items": [asdict(i) for i in items],
        "left_out": [{"key_id": k, "error": e} for k, e in errors],
    }
    write_atomic(root / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False).encode("utf-8"))
    return Prepared(manifest, time.perf_counter() - start, False, errors)


def _reuse(root: FsPath, settings: dict) -> dict:
    """The review.json already in ``root``; SourceError when it was prepared with other settings."""
    manifest = load_manifest(root)
    if manifest["settings"] != settings:
        old = manifest["settings"]
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        raise SourceError(
            f"{root} holds a review prepared with different settings ({', '.join(changed)}); "
            "use a new --output-dir (decisions already made there are kept)"
        )
    return manifest


def _queue(ils: dict, lesions: tuple[str, ...], src: ReviewSources) -> list[Queued]:
    """generate's seeded cell queues, lesion by lesion in RR, RF, LF order (the first --per-cell of each)."""
    _, _, cells, _ = plan_candidates(ils, lesions, seed=src.seed, rosalia=bool(src.rosalia_pred))
    queued: list[Queued] = []
    for lesion in lesions:
        for path in (CasePath.RR, CasePath.RF, CasePath.LF):
            queue = cells[(lesion, path)]
            queued += queue if src.per_cell is None else queue[: src.per_cell]
    return queued


def _items(
    root: FsPath,
    queued: list[Queued],
    pairs: dict[str, tuple[dict, dict]],
    cxr: CxrTree,
    rosalia: str | None,
    lesion_masks: str,
    progress: bool,
) -> tuple[list[ReviewItem], list[tuple[str, str]]]:
    """One ReviewItem per queued candidate (writing its overlay), and (key_id, error) for those whose
    CXR image or lesion mask cannot be read."""
    items: list[ReviewItem] = []
    errors: list[tuple[str, str]] = []
    bar = progress_bar(
        total=len(queued), desc="review: preparing", unit="case", disable=not progress, file=sys.stderr
    )
    for q in queued:
        c = q.candidate
        study, pair = pairs[c.pair_id]
        try:
            cxr_path, overlay = _case_files(root, c, cxr, rosalia, lesion_masks)
        except CaseInputError as e:
            errors.append((c.key_id, str(e)))
            bar.update()
            continue
        items.append(_review_item(q, study, pair, cxr_path, overlay))
        bar.update()
    bar.close()
    return items, errors


def _case_files(
    root: FsPath, c: Candidate, cxr: CxrTree, rosalia: str | None, lesion_masks: str
) -> tuple[FsPath, str | None]:
    """The candidate's CXR image (which must exist) and, for a positive, its overlay written under
    ``root`` (the path relative to it); CaseInputError when either cannot be read."""
    path = cxr_path(c, cxr)
    if not path.exists():
        raise CaseInputError(f"missing CXR image {path}")
    overlay = None
    if c.positive:
        mask = load_mask(lesion_mask_path(c, rosalia, lesion_masks))
        overlay = f"{OVERLAY_DIR}/{c.key_id}.png"
        write_atomic(output_path(root, overlay, what="overlay"), overlay_png(mask))
    return path, overlay


def _review_item(q: Queued, study: dict, pair: dict, cxr_path: FsPath, overlay: str | None) -> ReviewItem:
    """The review.json item of a queued candidate (annotators are dealt afterwards)."""
    c = q.candidate
    location = pair.get("location") or []
    return ReviewItem(
        key_id=c.key_id,
        lesion=c.lesion,
        positive=c.positive,
        path=q.path.value,
        rank=q.rank,
        pair_id=c.pair_id,
        pair_type=c.pair_type,
        study_id=c.study_id,
        dicom_id=c.dicom_id,
        sentence=source_sentence(study, pair),
        section=str(study.get("section_content") or ""),
        instruction=str(pair.get("instruction") or ""),
        location=[str(x) for x in (location if isinstance(location, list) else [location])],
        cxr=str(cxr_path.resolve()),
        overlay=overlay,
    )


def _write_errors(root: FsPath, errors: list[tuple[str, str]]) -> None:
    """prepare_errors.csv: the candidates left out and why."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["key_id", "error"])
    writer.writerows((csv_cell(key), csv_cell(error)) for key, error in errors)
    write_atomic(root / PREPARE_ERRORS, buf.getvalue().encode("utf-8"))
