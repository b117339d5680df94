"""Case selection: MIMIC-ILS pairs -> candidates per (lesion, path) cell, in a seeded random order.

* Positives: per study, the ``global`` positive pairs of each lesion, else its first ``basic`` pair
  (spec 5.2); they need a lesion mask. Negatives: ``global`` negative pairs.
* With review sheets, only accepted key_ids are used; without them, every candidate (the bundle then
  records ``reviewed: false``).
* No image is used twice: a negative whose image carries any positive candidate is dropped, and the
  remaining ties are broken in a seeded order (the reference takes the first N in file order and checks
  overlap only when asked to, spec 7.3 item 26).
* Each lesion's positives are shuffled (globals before basics) and alternately assigned RR and RF, a
  seeded split rather than the reference's first round(n * ratio) in sheet order (item 27).

The generator then walks each cell's queue and keeps the first N cases that succeed, so the result does
not depend on how many workers run or in what order they finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from chexpercept.vocab import LESIONS, Path

from .rng import derive
from .sources import iter_studies


@dataclass(frozen=True)
class Candidate:
    """One MIMIC-ILS pair that may become a case."""

    key_id: str
    lesion: str
    pair_id: str
    study_id: str
    subject_id: str
    dicom_id: str
    image_path: str | None
    seg_mask_path: str | None
    positive: bool
    pair_type: str


def _candidate(lesion: str, study_id: str, study: dict, pair: dict, positive: bool) -> Candidate | None:
    pair_id = pair.get("pair_id")
    dicom = study.get("dicom_id")
    if not pair_id or not dicom:
        return None
    return Candidate(
        key_id=f"{lesion}_{pair_id}",
        lesion=lesion,
        pair_id=str(pair_id),
        study_id=str(study_id),
        subject_id=str(study.get("subject_id", "")),
        dicom_id=str(dicom),
        image_path=study.get("image_path"),
        seg_mask_path=pair.get("seg_mask_path"),
        positive=positive,
        pair_type=str(pair.get("type", "")),
    )


def ils_candidates(ils: dict, lesions: tuple[str, ...] = LESIONS) -> tuple[list[Candidate], list[Candidate]]:
    """(positives, negatives) in file order, following the reference's Stage 00 rules."""
    wanted = set(lesions)
    positives: list[Candidate] = []
    negatives: list[Candidate] = []
    for study_id, study in iter_studies(ils):
        pairs = study.get("instruction_answer_pairs") or {}
        global_targets: set[str] = set()
        basic: dict[str, dict] = {}
        for pair in pairs.get("positive_pairs") or []:
            target = str(pair.get("target", "")).lower()
            if target not in wanted:
                continue
            if pair.get("type") == "global":
                global_targets.add(target)
                cand = _candidate(target, study_id, study, pair, True)
                if cand:
                    positives.append(cand)
            elif pair.get("type") == "basic" and target not in basic:
                basic[target] = pair
        for target, pair in basic.items():
            if target not in global_targets:
                cand = _candidate(target, study_id, study, pair, True)
                if cand:
                    positives.append(cand)
        for pair in pairs.get("negative_pairs") or []:
            target = str(pair.get("target", "")).lower()
            if target in wanted and pair.get("type") == "global":
                cand = _candidate(target, study_id, study, pair, False)
                if cand:
                    negatives.append(cand)
    return positives, negatives


@dataclass(frozen=True)
class Queued:
    """A candidate placed in a cell, with its position in that cell's seeded order."""

    candidate: Candidate
    path: Path
    rank: int


def selection_notes(
    positives: list[Candidate],
    negatives: list[Candidate],
    cells: dict[tuple[str, Path], list[Queued]],
    *,
    review: dict[str, bool] | None,
    has_mask,
) -> list[str]:
    """What the candidate rules left out, so nothing is dropped silently."""
    notes = []
    if review is not None:
        out = sum(not review.get(c.key_id, False) for c in [*positives, *negatives])
        notes.append(
            f"{out} of {len(positives) + len(negatives)} candidate pairs not accepted by the review sheets"
        )
    no_mask = sum(not has_mask(c) for c in positives)
    if no_mask:
        notes.append(f"{no_mask} positive pair(s) without a lesion mask (seg_mask_path) not used")
    queued = sum(len(q) for q in cells.values())
    dropped = len(positives) + len(negatives) - queued
    if dropped:
        notes.append(
            f"{dropped} pair(s) left out in all (review, no mask, an image that holds a positive or is used once already)"
        )
    return notes


def plan_cells(
    positives: list[Candidate],
    negatives: list[Candidate],
    *,
    seed: int,
    lesions: tuple[str, ...] = LESIONS,
    review: dict[str, bool] | None = None,
    has_mask: callable = lambda c: c.seg_mask_path is not None,  # type: ignore[valid-type]
) -> dict[tuple[str, Path], list[Queued]]:
    """Seeded candidate queues for every (lesion, path) cell."""
    if review is not None:
        positives = [c for c in positives if review.get(c.key_id, False)]
        negatives = [c for c in negatives if review.get(c.key_id, False)]
    positives = [c for c in positives if has_mask(c)]
    positive_images = {c.dicom_id for c in positives}
    negatives = [c for c in negatives if c.dicom_id not in positive_images]
    # one case per image: seeded order decides which pair keeps a shared image (positives first)
    rng = derive(seed, "claim-images")
    claimed: set[str] = set()
    kept: list[Candidate] = []
    for group in (positives, negatives):
        for i in rng.permutation(len(group)):
            cand = group[int(i)]
            if cand.dicom_id in claimed:
                continue
            claimed.add(cand.dicom_id)
            kept.append(cand)
    kept_keys = {c.key_id for c in kept}
    cells: dict[tuple[str, Path], list[Queued]] = {}
    for lesion in lesions:
        pos = [c for c in positives if c.lesion == lesion and c.key_id in kept_keys]
        neg = [c for c in negatives if c.lesion == lesion and c.key_id in kept_keys]
        rng = derive(seed, "order", lesion)
        pos_order = [pos[int(i)] for i in rng.permutation(len(pos))]
        pos_order.sort(key=lambda c: c.pair_type != "global")  # stable: globals first
        neg_order = [neg[int(i)] for i in rng.permutation(len(neg))]
        rr = [c for i, c in enumerate(pos_order) if i % 2 == 0]
        rf = [c for i, c in enumerate(pos_order) if i % 2 == 1]
        cells[(lesion, Path.RR)] = [Queued(c, Path.RR, i) for i, c in enumerate(rr)]
        cells[(lesion, Path.RF)] = [Queued(c, Path.RF, i) for i, c in enumerate(rf)]
        cells[(lesion, Path.LF)] = [Queued(c, Path.LF, i) for i, c in enumerate(neg_order)]
    return cells
