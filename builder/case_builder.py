"""Building one case end to end: read its inputs, compute geometry and questions, render, export.

This is what a worker runs for each queued candidate. All randomness comes from generators derived
from (seed, key_id, purpose), so a case comes out the same whichever worker builds it and whenever.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

import numpy as np

from chexpercept import templates
from chexpercept.case import DETECTION_IMAGE, POINTS_IMAGE
from chexpercept.vocab import CARDIOMEGALY, Path

from . import render
from .attributes import NoLungOverlap, attribute_qa
from .case_selection import Queued
from .contour import CONTOUR_EVAL_PATH, ContourError, MaskResolver, contour_qa
from .deformation_plan import Anatomies, CaseDeformation, Rejected, deform_case
from .deformers import make_deformer
from .export import write_case_folder, write_record
from .morph import MIN_COMPONENT, components, square_dilation, square_erosion_constant
from .overlap import component_overlap
from .regions import partition, zones
from .rng import derive
from .source_paths import cxr_path, lesion_mask_path
from .sources import Anatomy, CaseInputError, CxrTree, load_cxr, load_mask

DEFAULT_KERNEL, DEFAULT_ITERATIONS = 5, 3  # default_dilated / default_eroded (OpenCV 5x5, 3 times)


@dataclass(frozen=True)
class Settings:
    """Everything a worker needs; small and picklable."""

    out: str
    seed: int
    cxr: CxrTree
    lesion_masks: str
    rosalia: str | None
    anatomy: Anatomy
    deformer: str
    deformer_options: dict[str, Any] = field(default_factory=dict)
    partition: str = "reference"
    neutral_names: bool = False
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    key_id: str
    lesion: str
    path: Path
    rank: int
    status: str  # ok | rejected | error
    entry: dict[str, Any] | None = None
    reason: str | None = None
    seconds: float = 0.0
    resumed: bool = False


def detection_qa(lesion: str, positive: bool) -> dict[str, Any]:
    return templates.yes_no_qa(templates.detection_question(lesion), positive)


def _case_lungs(
    chex: dict[str, np.ndarray], cxas: dict[str, np.ndarray] | None, comps: list[np.ndarray]
) -> dict[str, np.ndarray]:
    """The case's right and left lungs: CheXmask (intersected with CXAS when given) plus every lesion
    component touching them (as the reference); a component touching neither is Rejected."""
    lungs = {side: chex[side] & cxas[side] if cxas else chex[side].copy() for side in ("right", "left")}
    for k, comp in enumerate(comps):
        touched = [side for side in ("right", "left") if (comp & lungs[side]).any()]
        if not touched:
            raise Rejected(f"lesion component {k} lies outside both lung masks")
        for side in touched:  # lesion components become part of the lungs they touch (reference)
            lungs[side] |= comp
    return lungs


class CaseBuilder:
    """Builds cases for one run; holds the deformer (a SAM3 model is loaded once per worker)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = FsPath(settings.out)
        self.deformer = make_deformer(settings.deformer, **settings.deformer_options)

    def build(self, queued: Queued) -> Outcome:
        cand = queued.candidate
        outcome = Outcome(cand.key_id, cand.lesion, queued.path, queued.rank, "ok")
        start = time.perf_counter()
        try:
            if queued.path is Path.LF:
                entry, files = self._negative(queued)
            else:
                entry, files = self._positive(queued)
            write_case_folder(self.root, cand.key_id, files)
            outcome.entry = entry
            write_record(
                self.root,
                cand.key_id,
                {"status": "ok", "key_id": cand.key_id, "path": queued.path.value, "entry": entry},
            )
        except (Rejected, NoLungOverlap, ContourError) as e:
            outcome.status, outcome.reason = "rejected", str(e)
            write_record(
                self.root, cand.key_id, {"status": "rejected", "key_id": cand.key_id, "reason": str(e)}
            )
        except CaseInputError as e:
            outcome.status, outcome.reason = "error", str(e)
        except Exception as e:  # a bug or a bad file we did not foresee: report, keep going
            tb = traceback.extract_tb(e.__traceback__)[-1]
            outcome.status = "error"
            outcome.reason = f"{type(e).__name__}: {e} (at {FsPath(tb.filename).name}:{tb.lineno})"
        outcome.seconds = time.perf_counter() - start
        return outcome

    # ------------------------------------------------------------------------------------- inputs
    def _cxr_path(self, queued: Queued) -> FsPath:
        return cxr_path(queued.candidate, self.settings.cxr)

    def _lesion_mask_path(self, queued: Queued) -> FsPath:
        return lesion_mask_path(queued.candidate, self.settings.rosalia, self.settings.lesion_masks)

    def _entry_tail(self, queued: Queued) -> dict[str, Any]:
        c = queued.candidate
        return {"pair_id": c.pair_id, "dicom_id": c.dicom_id, "provenance": dict(self.settings.provenance)}

    # ----------------------------------------------------------------------------------- negatives
    def _negative(self, queued: Queued) -> tuple[dict[str, Any], dict[str, bytes]]:
        cxr = load_cxr(self._cxr_path(queued), decode=False)
        entry = {"detection_qa": detection_qa(queued.candidate.lesion, False), **self._entry_tail(queued)}
        return entry, {DETECTION_IMAGE: cxr.png()}

    # ----------------------------------------------------------------------------------- positives
    def _positive(self, queued: Queued) -> tuple[dict[str, Any], dict[str, bytes]]:
        c = queued.candidate
        seed = self.settings.seed
        cardio = c.lesion == CARDIOMEGALY
        cxr = load_cxr(self._cxr_path(queued))
        lesion = load_mask(self._lesion_mask_path(queued))
        comps = components(lesion, MIN_COMPONENT)
        if not comps:
            raise Rejected(f"lesion mask has no component of at least {MIN_COMPONENT} px")
        chex = self.settings.anatomy.chex_lungs(c.dicom_id, cxr.original_size)
        cxas = self.settings.anatomy.cxas_lungs(c.dicom_id)
        lungs = _case_lungs(chex, cxas, comps)
        zone_masks = zones(lungs["right"], lungs["left"])
        region_masks = (
            None if cardio else partition(lungs["right"], lungs["left"], mode=self.settings.partition)
        )
        lung_masks = {"right lung": lungs["right"], "left lung": lungs["left"]}
        areas: dict[str, int] = {}
        overlaps = [
            component_overlap(str(k), comp, lung_masks, zone_masks, region_masks, areas)
            for k, comp in enumerate(comps)
        ]
        attributes = (
            None if cardio else attribute_qa(c.lesion, overlaps, derive(seed, c.key_id, "attributes"))
        )
        anatomy_masks = zone_masks if cardio else region_masks
        assert anatomy_masks is not None
        union = lungs["right"] | lungs["left"]
        self.deformer.begin_case(cxr.rgb)
        deformation = deform_case(
            comps,
            overlaps,
            Anatomies(anatomy_masks, union, cardio),
            self.deformer,
            derive(seed, c.key_id, "deform"),
        )
        resolver = MaskResolver(deformation.masks, self._defaults(deformation, chex, cxas, cardio))
        revision_required = queued.path is Path.RR
        contour = contour_qa(
            deformation,
            c.lesion,
            revision_required,
            resolver,
            derive(seed, c.key_id, "contour"),
            neutral_names=self.settings.neutral_names,
        )
        entry = {
            "detection_qa": detection_qa(c.lesion, True),
            "contour_qa": contour,
            "attribute_extraction_qa": attributes,
            **self._entry_tail(queued),
        }
        files = self._render(cxr, contour, resolver, revision_required)
        return entry, files

    def _defaults(
        self,
        deformation: CaseDeformation,
        chex: dict[str, np.ndarray],
        cxas: dict[str, np.ndarray] | None,
        cardio: bool,
    ) -> dict[str, np.ndarray]:
        """Pixels of the ``default_*`` distractor tokens (spec 1.1)."""
        before = np.zeros_like(deformation.components[0].optimal)
        for plan in deformation.components:
            before |= plan.before_mask
        out = {"default_keep": before}
        if cardio:
            out["default_dilated"] = square_dilation(before, DEFAULT_KERNEL, DEFAULT_ITERATIONS)
            out["default_eroded"] = square_erosion_constant(before, DEFAULT_KERNEL, DEFAULT_ITERATIONS)
        out["default_right_lung_chex"] = chex["right"]
        out["default_left_lung_chex"] = chex["left"]
        if cxas is not None:
            out["default_right_lung_cxas"] = cxas["right"]
            out["default_left_lung_cxas"] = cxas["left"]
        return {k: v for k, v in out.items() if v.any()}

    def _render(
        self, cxr: Any, contour: dict[str, Any], resolver: MaskResolver, revision_required: bool
    ) -> dict[str, bytes]:
        image = cxr.rgb
        files = {DETECTION_IMAGE: cxr.png()}
        overlayer = render.Overlayer(image)
        shown = contour["revision_before_masks"] if revision_required else contour["revision_after_masks"]
        shown_image = overlayer.apply(resolver.union(shown))
        files[f"contour_qa/{CONTOUR_EVAL_PATH}"] = render.encode_png(shown_image)
        if not revision_required:
            return files
        options = contour["contour_revision_qa_expansion"]["answer_options"]
        points = [((o["point"][0], o["point"][1]), o["color"]) for o in options if o["point"] is not None]
        files[f"contour_qa/{POINTS_IMAGE}"] = render.encode_png(render.draw_points(shown_image, points))
        for option in contour["contour_revision_qa_revision_result"]["answer_options"]:
            mask = resolver.union(option["masks"])
            rel = f"contour_qa/contour_revision_qa/{option['relative_path']}"
            files[rel] = render.encode_png(overlayer.apply(mask))
        return files
