"""Phantom sources in the reference implementation's own layout (spec 5.1 and its sample-test fixture):

* ``mimic_cxr/<dicom_id>.png``: flat folder of 1024 x 1024 8-bit RGB CXRs (``generate --cxr-png``);
* ``mimic_ils/mimic_ils_instruction_answer.json`` and ``mimic_ils/lesion_mask/<study>/<study>_<lesion>_0.png``;
* ``chexmasku_pred/<dicom_id>/{right_lung,left_lung,heart}.png``: CheXmask-U output, 1-bit (``--anatomy``);
* ``cxas_pred/<dicom_id>/<class name>.png``: CXAS output, 1-bit, names with spaces (``right lung.png``,
  ``left lung.png``, ``heart.png``, ``right upper zone lung.png``, ...) (``--cxas``);
* ``rosalia_pred/<lesion>/<pair_id>/{pred_img,pred_mask}.png``: ROSALIA output, the mask 1024 x 1024
  RGB 0/255 as torchvision's ``save_image`` writes it (``--rosalia-pred``).

Written by ``chexpercept synth-sources --layout reference``: it draws the usual phantom sources into a
scratch folder and lays them out as above. Testing only (``PHANTOM_DATA.txt`` in every folder).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path as FsPath

import numpy as np
from PIL import Image

from chexpercept.fileio import atomic_file, private_dir, write_atomic
from chexpercept.vocab import LESIONS

from .sources import ILS_JSON, ILS_MASK_DIR, PHANTOM_MARKER, load_cxr, load_mask
from .synth_sources import MARKER_TEXT, synthesize_sources

CXR_DIR = "mimic_cxr"
ILS_DIR = "mimic_ils"
CHEXMASKU_DIR = "chexmasku_pred"
CXAS_DIR = "cxas_pred"
ROSALIA_DIR = "rosalia_pred"


def _save(path: FsPath, im: Image.Image) -> None:
    with atomic_file(path, "wb") as f:
        im.save(f, format="PNG", compress_level=1)


def _one_bit(mask: np.ndarray) -> Image.Image:
    return Image.fromarray(mask.astype(np.uint8) * 255).convert("1")


def write_reference_layout(
    out_dir: str | os.PathLike[str],
    *,
    per_cell: int = 1,
    seed: int = 0,
    lesions: tuple[str, ...] = LESIONS,
    progress: bool = True,
) -> FsPath:
    """Write the five reference folders under ``out_dir`` (see the module docstring); returns it."""
    root = private_dir(out_dir)
    with tempfile.TemporaryDirectory(dir=root, prefix=".scratch-") as scratch_name:
        scratch = FsPath(scratch_name)
        synthesize_sources(
            scratch, per_cell=per_cell, seed=seed, lesions=lesions, with_cxas=True, progress=progress
        )
        ils = json.loads((scratch / "mimic-ils" / ILS_JSON).read_text(encoding="utf-8"))
        shutil.copytree(scratch / "mimic-ils", root / ILS_DIR, dirs_exist_ok=True)
        for study_id, study in ils["train"].items():
            dicom = study["dicom_id"]
            jpg = scratch / "mimic-cxr-jpg" / "files" / study["image_path"]
            cxr = load_cxr(jpg)
            assert cxr.rgb is not None
            cxr_image = Image.fromarray(cxr.rgb)
            _save(root / CXR_DIR / f"{dicom}.png", cxr_image)
            anatomy = {
                n: load_mask(scratch / "anatomy" / dicom / f"{n}.png")
                for n in ("right_lung", "left_lung", "heart")
            }
            for name, mask in anatomy.items():
                _save(root / CHEXMASKU_DIR / dicom / f"{name}.png", _one_bit(mask))
            cxas = {
                "right lung": load_mask(scratch / "cxas" / dicom / "right lung.png"),
                "left lung": load_mask(scratch / "cxas" / dicom / "left lung.png"),
                "heart": anatomy["heart"],
            }
            for side in ("right", "left"):  # a few of CXAS's zone classes, as vertical thirds of the lung
                rows = np.flatnonzero(cxas[f"{side} lung"].any(axis=1))
                top, bottom = (int(rows.min()), int(rows.max()) + 1) if rows.size else (0, 0)
                cuts = np.linspace(top, bottom, 4).astype(int)
                for name, (a, b) in zip(
                    ("upper zone lung", "mid zone lung", "lung base"), itertools.pairwise(cuts)
                ):
                    zone = np.zeros_like(cxas[f"{side} lung"])
                    zone[a:b] = cxas[f"{side} lung"][a:b]
                    cxas[f"{side} {name}"] = zone
            for name, mask in cxas.items():
                _save(root / CXAS_DIR / dicom / f"{name}.png", _one_bit(mask))
            for pair in study["instruction_answer_pairs"]["positive_pairs"]:
                folder = root / ROSALIA_DIR / pair["target"] / pair["pair_id"]
                lesion = load_mask(scratch / "mimic-ils" / ILS_MASK_DIR / pair["seg_mask_path"])
                _save(folder / "pred_img.png", cxr_image)
                _save(
                    folder / "pred_mask.png",
                    Image.fromarray(np.repeat(lesion[..., None], 3, axis=2).astype(np.uint8) * 255),
                )
            del study_id
    for folder in (root, *(root / d for d in (CXR_DIR, ILS_DIR, CHEXMASKU_DIR, CXAS_DIR, ROSALIA_DIR))):
        write_atomic(folder / PHANTOM_MARKER, MARKER_TEXT)
    return root
