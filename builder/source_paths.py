"""Where a candidate's files lie in the source folders, each resolved inside its folder with links
followed (chexpercept.containment), and the check of every queued candidate before ``generate`` or
``review`` does any work (shared by both).

A candidate's ids and paths come from MIMIC-ILS (``pair_id``, ``dicom_id``, ``image_path``,
``seg_mask_path``, the subject and study ids); a tampered table could name ``../..`` or an absolute
path, or a link inside a source tree could lead out of it. ``check_candidates`` names every such
candidate, its study and the field, and raises SourceError; the same functions run again when a
worker reads the file (``OutsideSourceError``, that case only fails).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path as FsPath

from .case_selection import Candidate
from .sources import (
    CHEX_FILES,
    CXAS_FILES,
    CaseInputError,
    CxrTree,
    OutsideSourceError,
    SourceError,
    source_file,
    source_name,
)

#: at most this many refused candidates are listed in the error (the count is always given)
MAX_LISTED = 20


def cxr_path(c: Candidate, cxr: CxrTree) -> FsPath:
    """The candidate's CXR image in the CXR tree (OutsideSourceError when it would leave it)."""
    return cxr.path(c.dicom_id, c.subject_id, c.study_id, c.image_path)


def lesion_mask_path(c: Candidate, rosalia: str | None, lesion_masks: str) -> FsPath:
    """Where generate reads a positive's lesion mask: the ROSALIA prediction
    ``<lesion>/<pair_id>/pred_mask.png``, else the MIMIC-ILS mask ``seg_mask_path``; inside its folder.

    Raises CaseInputError when the pair has no mask, OutsideSourceError when the path would leave
    the folder."""
    if rosalia:
        pair = source_name(c.pair_id, "MIMIC-ILS pair_id")
        return source_file(rosalia, f"{c.lesion}/{pair}/pred_mask.png", "--rosalia-pred mask")
    if not c.seg_mask_path:
        raise CaseInputError(f"pair {c.pair_id} has no seg_mask_path")
    return source_file(lesion_masks, c.seg_mask_path, "MIMIC-ILS seg_mask_path")


def candidate_problems(
    c: Candidate,
    cxr: CxrTree,
    lesion_masks: str,
    rosalia: str | None,
    anatomy_folder: str | None = None,
    cxas: str | None = None,
) -> list[str]:
    """Every containment problem of one candidate's ids and files (empty: all inside)."""
    checks = [
        lambda: source_name(c.pair_id, "MIMIC-ILS pair_id"),  # the bundle's key_id and folder
        lambda: source_name(c.dicom_id, "MIMIC-ILS dicom_id"),
        lambda: cxr_path(c, cxr),
    ]
    if c.positive:
        checks.append(lambda: lesion_mask_path(c, rosalia, lesion_masks))
        for folder, files, what in ((anatomy_folder, CHEX_FILES, "--anatomy"), (cxas, CXAS_FILES, "--cxas")):
            for file in files.values() if folder else ():
                checks.append(
                    lambda f=folder, n=file, w=what: source_file(f, f"{c.dicom_id}/{n}", f"{w} mask")
                )
    problems = []
    for check in checks:
        try:
            check()
        except OutsideSourceError as e:
            problems.append(str(e))
        except CaseInputError:
            pass  # a missing mask is reported when the case is built
    return problems


def check_candidates(
    candidates: Iterable[Candidate],
    cxr: CxrTree,
    lesion_masks: str,
    rosalia: str | None,
    anatomy_folder: str | None = None,
    cxas: str | None = None,
) -> None:
    """SourceError naming every candidate (key_id, study, field) whose ids or files would leave
    their source folders; nothing is read or written before this passes."""
    refused: list[str] = []
    for c in candidates:
        for problem in candidate_problems(c, cxr, lesion_masks, rosalia, anatomy_folder, cxas):
            refused.append(f"{c.key_id} (study {c.study_id}): {problem}")
    if refused:
        shown = "\n".join(f"  - {p}" for p in refused[:MAX_LISTED])
        more = f"\n  ... and {len(refused) - MAX_LISTED} more" if len(refused) > MAX_LISTED else ""
        raise SourceError(
            f"{len(refused)} path(s) of the sources leave their source folder and are refused "
            f"(chexpercept.containment):\n{shown}{more}"
        )
