"""Small format-valid bundles for tests and benchmarks of the consumers (loader, runner, scorer).

These bundles have the exact release format and prompt texts but arbitrary geometry: gold answers
are drawn at random, images are plain noise. They exist so that code reading bundles can be tested
in milliseconds. The phantom benchmark with geometry-consistent answers is ``chexpercept synth``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path as FsPath
from typing import Any

import numpy as np
from PIL import Image

from . import templates
from .templates import qa, yes_no_qa
from .vocab import CARDIOMEGALY, LESIONS, PATHS, POINT_COLORS, Path

_REGIONS = (
    "the right costophrenic angle",
    "the left costophrenic angle",
    "the intersection of the right medial lung and the right upper zone lung",
    "the intersection of the left lateral lung and the left mid zone lung",
    "the intersection of the right peripheral lung and the right lower zone lung",
    "the intersection of the left medial lung and the left lower zone lung",
)


def _noise_png(path: FsPath, rng: np.random.Generator, size: int) -> None:
    arr = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path, compress_level=1)


def _smooth_png(path: FsPath, rng: np.random.Generator, size: int) -> None:
    """A grey image that compresses like a radiograph (smooth shading plus mild noise)."""
    y, x = np.mgrid[0:size, 0:size] / size
    cx, cy = rng.uniform(0.3, 0.7, size=2)
    base = 150 - 110 * ((x - cx) ** 2 + (y - cy) ** 2) + 20 * np.sin(12 * y + rng.uniform(0, 6))
    grey = np.clip(base + rng.normal(0, 6, size=(size, size)), 0, 255).astype(np.uint8)
    Image.fromarray(np.repeat(grey[..., None], 3, axis=2)).save(path)


class _ImageWriter:
    """Writes each image, or hard-links one of a small pool of images (fast large bundles)."""

    def __init__(self, rng: np.random.Generator, size: int, style: str, pool: int | None, root: FsPath):
        self.rng, self.size, self.pool = rng, size, pool
        self.draw = {"noise": _noise_png, "smooth": _smooth_png}[style]
        self.pool_dir = root / ".pool"
        self.count = 0

    def __call__(self, path: FsPath) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not self.pool:
            self.draw(path, self.rng, self.size)
            return
        source = self.pool_dir / f"{self.count % self.pool}.png"
        self.count += 1
        if not source.exists():
            self.pool_dir.mkdir(parents=True, exist_ok=True)
            self.draw(source, self.rng, self.size)
        try:
            os.link(source, path)
        except OSError:
            shutil.copyfile(source, path)


def fixture_entry(key_id: str, path: Path, rnd: random.Random) -> dict[str, Any]:
    """One entry in the release format with random (but in-range) gold answers."""
    lesion, pair_id = key_id.split("_", 1)
    positive = path is not Path.LF
    entry: dict[str, Any] = {"detection_qa": yes_no_qa(templates.detection_question(lesion), positive)}
    if positive:
        n_points = rnd.randint(1, 8)
        colors = list(POINT_COLORS[:n_points])
        point_opts = [{"point": [rnd.randint(0, 1023), rnd.randint(0, 1023)], "color": c} for c in colors]
        point_opts.append({"point": None, "color": "None"})
        labels = templates.point_option_labels([o["color"] for o in point_opts])

        def pick() -> tuple[str, list[int]]:
            k = rnd.randint(0, min(2, n_points))
            idx = sorted(rnd.sample(range(1, n_points + 1), k))
            if not idx:
                return "None", [n_points + 1]
            return ", ".join(labels[i - 1] for i in idx), idx

        exp_answer, exp_idx = pick()
        con_answer, con_idx = pick()
        n_masks = rnd.randint(2, 4)
        true_pos = rnd.randint(1, n_masks)
        mask_opts = [
            {
                "type": "true" if i == true_pos else "fake",
                "masks": [f"m{i}"],
                "relative_path": f"option_{i}_mask_{'answer' if i == true_pos else 'fake'}.png",
            }
            for i in range(1, n_masks + 1)
        ]
        rr = path is Path.RR
        entry["contour_qa"] = {
            "no_deformation": not rr,
            "initial_context": templates.initial_context(lesion),
            "revision_before_masks": ["suboptimal_component_0_exp1"],
            "revision_after_masks": ["optimal_component_0"],
            "contour_eval_qa": yes_no_qa(
                templates.contour_eval_question(lesion),
                rr,
                relative_path="contour_eval_qa/xray_with_mask.png",
            ),
            "contour_revision_qa_expansion": qa(
                templates.expansion_question(lesion, labels), point_opts, exp_answer, exp_idx
            ),
            "contour_revision_qa_contraction": qa(
                templates.contraction_question(lesion, labels), point_opts, con_answer, con_idx
            ),
            "contour_revision_qa_revision_result": qa(
                templates.revision_result_question(n_masks),
                mask_opts,
                templates.mask_option_labels(n_masks)[true_pos - 1],
                true_pos,
            ),
        }
        entry["attribute_extraction_qa"] = None if lesion == CARDIOMEGALY else _attributes(lesion, rnd)
    entry["pair_id"] = pair_id
    entry["dicom_id"] = f"fixture-{pair_id}"
    entry["provenance"] = {"synthetic": True, "generator": "chexpercept.testing"}
    return entry


def _attributes(lesion: str, rnd: random.Random) -> dict[str, Any]:
    dist = rnd.randint(1, 4)
    loc_opts = [*rnd.sample(_REGIONS, 3), templates.LOCATION_NONE]
    loc_idx = sorted(rnd.sample([1, 2, 3], rnd.randint(0, 3))) or [4]
    lung = rnd.choice(["left lung", "right lung"])
    sev = rnd.randint(1, 3)
    comp = rnd.randint(1, 4)
    return {
        "distribution": qa(
            templates.distribution_question(lesion),
            list(templates.DISTRIBUTION_OPTIONS),
            templates.DISTRIBUTION_OPTIONS[dist - 1],
            dist,
        ),
        "location": qa(
            templates.location_question(lesion, loc_opts),
            loc_opts,
            ", ".join(loc_opts[i - 1] for i in loc_idx),
            loc_idx,
        ),
        "severity/measurement": qa(
            templates.severity_question(lesion, lung),
            templates.severity_options(lung),
            templates.severity_options(lung)[sev - 1],
            sev,
        ),
        "comparison": qa(
            templates.comparison_question(),
            list(templates.COMPARISON_OPTIONS),
            templates.COMPARISON_OPTIONS[comp - 1],
            comp,
        ),
    }


def write_fixture_bundle(
    root: str | os.PathLike[str],
    *,
    per_cell: int = 1,
    seed: int = 0,
    image_size: int = 32,
    lesions: tuple[str, ...] = LESIONS,
    image_style: str = "noise",
    image_pool: int | None = None,
) -> FsPath:
    """Write a format-valid bundle with ``per_cell`` cases for every (lesion, path) cell.

    image_style ``smooth`` draws radiograph-like grey images; image_pool=K hard-links K distinct
    images everywhere (for benchmark-sized bundles).
    """
    root = FsPath(root)
    rnd = random.Random(seed)
    rng = np.random.default_rng(seed)
    _png = _ImageWriter(rng, image_size, image_style, image_pool, root)
    entries: dict[str, Any] = {}
    for lesion in lesions:
        for path in PATHS:
            for i in range(per_cell):
                kind = "negative" if path is Path.LF else "positive"
                key_id = f"{lesion}_s{50000000 + len(entries):08d}_{kind}_{i}"
                entry = fixture_entry(key_id, path, rnd)
                entries[key_id] = entry
                case_dir = root / "chexpercept" / key_id
                _png(case_dir / "detection_qa" / "xray.png")
                if path is Path.LF:
                    continue
                _png(case_dir / "contour_qa" / "contour_eval_qa" / "xray_with_mask.png")
                if path is Path.RR:
                    rev = case_dir / "contour_qa" / "contour_revision_qa"
                    _png(rev / "xray_with_mask_and_points.png")
                    for opt in entry["contour_qa"]["contour_revision_qa_revision_result"]["answer_options"]:
                        _png(rev / opt["relative_path"])
    root.mkdir(parents=True, exist_ok=True)
    (root / "chexpercept.json").write_text(
        json.dumps(entries, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    return root
