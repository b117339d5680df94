"""Phantom PhysioNet-shaped sources: ``chexpercept synth-sources --output-dir DIR --per-cell N --seed S``.

Writes, under DIR:

* ``mimic-cxr-jpg/``: ``files/pXX/pXXXXXXXX/sXXXXXXXX/<dicom_id>.jpg`` (grey JPEGs of 960 x 1024, so the
  generator exercises its conversion to 1024 x 1024) and ``mimic-cxr-2.0.0-metadata.csv.gz``;
* ``mimic-ils/``: ``mimic_ils_instruction_answer.json`` and ``lesion_mask/<study>/<study>_<lesion>_0.png``
  (512 x 512, 0/255);
* ``anatomy/``: ``<dicom_id>/{right_lung,left_lung,heart}.png`` (1024 x 1024, 1 bit), or with
  ``anatomy_format="chexmask-csv"`` a CheXmask-style ``MIMIC-CXR-JPG.csv`` (run-length encoded masks at
  the JPEG's size);
* optionally ``cxas/<dicom_id>/{right lung,left lung}.png`` (a second lung source, shifted by 2 px);
* ``PHANTOM_DATA.txt`` in every folder: the generator marks bundles made from these as synthetic.

Per lesion there are 2(N + spare) positive studies (positives are dealt alternately to RR and RF, so
each of those cells gets N + spare) and N + spare negative ones (spare = N // 2 + 1), one image and
one MIMIC-ILS pair each, so ``generate --per-cell N`` fills every cell even when candidates of any
cell are rejected. Everything is determined by the seed.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path as FsPath

import numpy as np
from PIL import Image

from chexpercept.domains import COUNT, PROCESSES
from chexpercept.eval.runner.interrupts import shielded_children
from chexpercept.fileio import atomic_file, private_dir, write_atomic
from chexpercept.progress import progress_bar
from chexpercept.stdio import guard_standard_streams
from chexpercept.vocab import LESIONS

from .phantom import PhantomAnatomy, draw_study
from .rng import derive
from .sources import ILS_JSON, ILS_MASK_DIR, PHANTOM_MARKER, rle_encode

JPG_SIZE = (960, 1024)  # (width, height) of the phantom MIMIC-CXR-JPG files
JPG_QUALITY = 95
ANATOMY_FORMATS = ("folders", "chexmask-csv")
METADATA_NAME = "mimic-cxr-2.0.0-metadata.csv.gz"
CHEXMASK_NAME = "MIMIC-CXR-JPG.csv"
MARKER_TEXT = (
    "PHANTOM DATA. Everything in this folder was drawn procedurally by `chexpercept synth-sources` for\n"
    "testing software. It is not derived from any patient or PhysioNet file and must never be used to\n"
    "compare or evaluate models.\n"
)


@dataclass(frozen=True)
class PhantomSpec:
    index: int
    lesion: str
    positive: bool
    subject_id: str
    study_id: str
    dicom_id: str


def spare(per_cell: int) -> int:
    return per_cell // 2 + 1


def study_specs(per_cell: int, seed: int, lesions: tuple[str, ...] = LESIONS) -> list[PhantomSpec]:
    """The studies to draw, with MIMIC-shaped ids derived from the seed."""
    COUNT.require(per_cell, "per_cell")
    specs = []
    rng = derive(seed, "phantom-ids")
    for lesion in lesions:
        extra = spare(per_cell)
        for positive, count in ((True, 2 * (per_cell + extra)), (False, per_cell + extra)):
            for _ in range(count):
                i = len(specs)
                words = rng.integers(0, 1 << 32, size=5, dtype=np.uint64)
                specs.append(
                    PhantomSpec(
                        index=i,
                        lesion=lesion,
                        positive=positive,
                        subject_id=f"p{10000000 + i:08d}",
                        study_id=f"s{50000000 + i:08d}",
                        dicom_id="-".join(f"{int(w):08x}" for w in words),
                    )
                )
    return specs


def _png(array: np.ndarray, mode: str | None = None) -> bytes:
    buf = io.BytesIO()
    im = Image.fromarray(array)
    if mode:
        im = im.convert(mode)
    im.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _write(path: FsPath, data: bytes) -> None:
    write_atomic(path, data)


def _draw_one(args: tuple[PhantomSpec, str, int, str, bool]) -> dict:
    """Draw and write one study; returns its MIMIC-ILS record, metadata row and CheXmask row."""
    spec, out, seed, anatomy_format, with_cxas = args
    root = FsPath(out)
    study = draw_study(spec.lesion, spec.positive, derive(seed, "phantom", spec.study_id))
    rel_dir = f"{spec.subject_id[:3]}/{spec.subject_id}/{spec.study_id}"
    jpg = Image.fromarray(study.image).resize(JPG_SIZE, Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    jpg.save(buf, format="JPEG", quality=JPG_QUALITY)
    _write(root / "mimic-cxr-jpg" / "files" / rel_dir / f"{spec.dicom_id}.jpg", buf.getvalue())
    chexmask_row = _write_anatomy(root, spec, study.anatomy, anatomy_format)
    if with_cxas:
        for side, mask in (("right", study.anatomy.right_lung), ("left", study.anatomy.left_lung)):
            shifted = np.zeros_like(mask)
            shifted[2:] = mask[:-2]
            _write(
                root / "cxas" / spec.dicom_id / f"{side} lung.png", _png(shifted.astype(np.uint8) * 255, "1")
            )
    seg_path = None
    if spec.positive:
        assert study.lesion512 is not None
        seg_path = f"{spec.study_id}/{spec.study_id}_{spec.lesion}_0.png"
        _write(root / "mimic-ils" / ILS_MASK_DIR / seg_path, _png(study.lesion512.astype(np.uint8) * 255))
    return {
        "study_id": spec.study_id,
        "record": _ils_record(spec, rel_dir, seg_path),
        "meta": _metadata_row(spec),
        "chexmask": chexmask_row,
    }


def _write_anatomy(
    root: FsPath, spec: PhantomSpec, masks: PhantomAnatomy, anatomy_format: str
) -> dict | None:
    """Write the lung and heart masks as per-image folders, or return them as a CheXmask table row."""
    anatomy = {"right_lung": masks.right_lung, "left_lung": masks.left_lung, "heart": masks.heart}
    if anatomy_format == "folders":
        for name, mask in anatomy.items():
            _write(root / "anatomy" / spec.dicom_id / f"{name}.png", _png(mask.astype(np.uint8) * 255, "1"))
        return None
    w, h = JPG_SIZE
    scaled = {
        name: np.asarray(Image.fromarray(m.astype(np.uint8) * 255).resize((w, h), Image.Resampling.NEAREST))
        > 0
        for name, m in anatomy.items()
    }
    return {
        "dicom_id": spec.dicom_id,
        "Dice RCA (Mean)": "0.9",
        "Dice RCA (Max)": "0.95",
        "Landmarks": "[]",
        "Left Lung": rle_encode(scaled["left_lung"]),
        "Right Lung": rle_encode(scaled["right_lung"]),
        "Heart": rle_encode(scaled["heart"]),
        "Height": str(h),
        "Width": str(w),
    }


def _ils_record(spec: PhantomSpec, rel_dir: str, seg_path: str | None) -> dict:
    """The study's MIMIC-ILS record: one global positive or negative pair."""
    kind = "positive" if spec.positive else "negative"
    pair = {
        "pair_id": f"{spec.study_id}_{kind}_0",
        "instruction": f"Segment the {spec.lesion}.",
        "answer": "[SEG]" if spec.positive else f"[SEG] There is no {spec.lesion}.",
        "type": "global",
        "target": spec.lesion,
        "location": ["heart"] if spec.lesion == "cardiomegaly" else ["right lung", "left lung"],
        "seg": spec.positive,
        "seg_mask_path": seg_path,
    }
    if spec.positive:
        pair["sent_idx"] = "1"
    return {
        "subject_id": spec.subject_id,
        "dicom_id": spec.dicom_id,
        "image_path": f"{rel_dir}/{spec.dicom_id}.jpg",
        "section_name": "findings",
        "section_content": f"1. Phantom study ({'with' if spec.positive else 'without'} {spec.lesion}).",
        "instruction_answer_pairs": {
            "positive_pairs": [pair] if spec.positive else [],
            "negative_pairs": [] if spec.positive else [pair],
        },
    }


def _metadata_row(spec: PhantomSpec) -> dict[str, str]:
    """The study's row of the MIMIC-CXR-JPG metadata table."""
    w, h = JPG_SIZE
    return {
        "dicom_id": spec.dicom_id,
        "subject_id": spec.subject_id[1:],
        "study_id": spec.study_id[1:],
        "PerformedProcedureStepDescription": "CHEST (PA AND LAT)",
        "ViewPosition": "PA",
        "Rows": str(h),
        "Columns": str(w),
        "StudyDate": "21800101",
        "StudyTime": "120000.000",
        "ProcedureCodeSequence_CodeMeaning": "CHEST (PA AND LAT)",
        "ViewCodeSequence_CodeMeaning": "postero-anterior",
        "PatientOrientationCodeSequence_CodeMeaning": "Erect",
    }


def synthesize_sources(
    out_dir: str | os.PathLike[str],
    *,
    per_cell: int = 1,
    seed: int = 0,
    num_proc: int = 1,
    lesions: tuple[str, ...] = LESIONS,
    anatomy_format: str = "folders",
    with_cxas: bool = False,
    progress: bool = True,
) -> FsPath:
    """Write phantom MIMIC-CXR-JPG, MIMIC-ILS and anatomy folders under ``out_dir``; returns it."""
    if anatomy_format not in ANATOMY_FORMATS:
        raise ValueError(
            f"unknown anatomy format {anatomy_format!r}; expected one of {', '.join(ANATOMY_FORMATS)}"
        )
    PROCESSES.require(num_proc, "num_proc")
    root = private_dir(out_dir)
    specs = study_specs(per_cell, seed, lesions)
    jobs = [(s, str(root), seed, anatomy_format, with_cxas) for s in specs]
    bar = progress_bar(total=len(jobs), desc="synth-sources", unit="image", disable=not progress)
    results = []
    if num_proc <= 1:
        for job in jobs:
            results.append(_draw_one(job))
            bar.update()
    else:
        pool = ProcessPoolExecutor(
            max_workers=num_proc, mp_context=get_context("spawn"), initializer=guard_standard_streams
        )
        try:
            with shielded_children():  # workers start as jobs are submitted: Ctrl-C is the main process's
                drawn = pool.map(_draw_one, jobs, chunksize=4)
            for res in drawn:
                results.append(res)
                bar.update()
        finally:  # after a stop, the jobs not started are dropped; those under way end (as CaseRunner)
            pool.shutdown(wait=True, cancel_futures=True)
    bar.close()
    ils = {"train": {r["study_id"]: r["record"] for r in results}, "val": {}, "test": {}}
    write_atomic(root / "mimic-ils" / ILS_JSON, json.dumps(ils, indent=1))
    meta_rows = [r["meta"] for r in results]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(meta_rows[0]))
    writer.writeheader()
    writer.writerows(meta_rows)
    write_atomic(
        root / "mimic-cxr-jpg" / METADATA_NAME, gzip.compress(buf.getvalue().encode("utf-8"), mtime=0)
    )
    if anatomy_format == "chexmask-csv":
        rows = [r["chexmask"] for r in results]
        with atomic_file(root / "anatomy" / CHEXMASK_NAME, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    for folder in (root, root / "mimic-cxr-jpg", root / "mimic-ils", root / "anatomy", root / "cxas"):
        if folder.is_dir():
            write_atomic(folder / PHANTOM_MARKER, MARKER_TEXT)
    return root
