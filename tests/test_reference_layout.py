"""Sources in the reference implementation's own layout (spec 5.1): a flat folder of <dicom_id>.png,
CheXmask-U <dicom_id>/{right_lung,left_lung,heart}.png, CXAS <dicom_id>/<name with spaces>.png and
ROSALIA <lesion>/<pair_id>/pred_mask.png (RGB 0/255), generated end to end and reviewed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from PIL import Image

from chexpercept.builder.review.prepare import ReviewSources, prepare
from chexpercept.cli import main as cli

LESIONS2 = ("cardiomegaly", "edema")


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference_layout") / "src"
    assert (
        cli(
            [
                "synth-sources",
                "--layout",
                "reference",
                "--output-dir",
                str(root),
                "--per-cell",
                "1",
                "--lesions",
                *LESIONS2,
                "--no-progress",
            ]
        )
        == 0
    )
    return root


def test_the_layout_is_the_reference_one(ref):
    assert sorted(p.name for p in ref.iterdir() if p.is_dir()) == [
        "chexmasku_pred",
        "cxas_pred",
        "mimic_cxr",
        "mimic_ils",
        "rosalia_pred",
    ]
    ils = json.loads((ref / "mimic_ils" / "mimic_ils_instruction_answer.json").read_text())
    study = next(iter(ils["train"].values()))
    dicom = study["dicom_id"]
    cxr = Image.open(ref / "mimic_cxr" / f"{dicom}.png")
    assert cxr.format == "PNG" and cxr.mode == "RGB" and cxr.size == (1024, 1024)
    assert sorted(p.name for p in (ref / "chexmasku_pred" / dicom).iterdir()) == [
        "heart.png",
        "left_lung.png",
        "right_lung.png",
    ]
    assert Image.open(ref / "chexmasku_pred" / dicom / "heart.png").mode == "1"
    cxas = {p.name for p in (ref / "cxas_pred" / dicom).iterdir()}
    assert {"right lung.png", "left lung.png", "heart.png", "right upper zone lung.png"} <= cxas
    pair = study["instruction_answer_pairs"]["positive_pairs"][0]
    mask = Image.open(ref / "rosalia_pred" / pair["target"] / pair["pair_id"] / "pred_mask.png")
    assert mask.mode == "RGB" and mask.size == (1024, 1024)
    assert set(np.unique(np.asarray(mask))) == {0, 255}
    assert (ref / "rosalia_pred" / pair["target"] / pair["pair_id"] / "pred_img.png").is_file()
    assert all((ref / d / "PHANTOM_DATA.txt").is_file() for d in ("mimic_cxr", "mimic_ils", "cxas_pred"))


def _generate(ref, out, *extra):
    return cli(
        [
            "generate",
            "--cxr-png",
            str(ref / "mimic_cxr"),
            "--mimic-ils",
            str(ref / "mimic_ils"),
            "--anatomy",
            str(ref / "chexmasku_pred"),
            "--cxas",
            str(ref / "cxas_pred"),
            "--lesions",
            *LESIONS2,
            "--per-cell",
            "1",
            "--output-dir",
            str(out),
            "--no-progress",
            *extra,
        ]
    )


@pytest.mark.parametrize("rosalia", [False, True], ids=["ils-masks", "rosalia-pred"])
def test_generate_on_the_reference_layout(ref, tmp_path, rosalia):
    extra = ["--rosalia-pred", str(ref / "rosalia_pred")] if rosalia else []
    assert _generate(ref, tmp_path / "bundle", *extra) == 0
    entries = json.loads((tmp_path / "bundle" / "chexpercept.json").read_text())
    assert len(entries) == 6
    assert all(e["provenance"]["synthetic"] for e in entries.values())
    assert cli(["validate", str(tmp_path / "bundle")]) == 0


def test_bad_reference_files_are_named(ref, tmp_path, capsys):
    copy = tmp_path / "src"
    shutil.copytree(ref, copy)
    for folder in (copy / "cxas_pred").iterdir():
        if folder.is_dir():
            (folder / "left lung.png").unlink()
    masks = sorted((copy / "rosalia_pred").rglob("pred_mask.png"))
    masks[0].write_bytes(masks[0].read_bytes()[:100])
    cmd = [
        "generate",
        "--cxr-png",
        str(copy / "mimic_cxr"),
        "--mimic-ils",
        str(copy / "mimic_ils"),
        "--anatomy",
        str(copy / "chexmasku_pred"),
        "--cxas",
        str(copy / "cxas_pred"),
        "--rosalia-pred",
        str(copy / "rosalia_pred"),
        "--lesions",
        *LESIONS2,
        "--per-cell",
        "1",
        "--output-dir",
        str(tmp_path / "bundle"),
        "--no-progress",
    ]
    assert cli(cmd) == 1
    out = capsys.readouterr().out
    assert "left lung.png" in out and "missing file" in out
    assert f"unreadable image {masks[0]}" in out


def test_review_on_the_reference_layout(ref, tmp_path):
    src = ReviewSources(
        cxr_png=str(ref / "mimic_cxr"),
        mimic_ils=str(ref / "mimic_ils"),
        rosalia_pred=str(ref / "rosalia_pred"),
        lesions=list(LESIONS2),
    )
    prepared = prepare(tmp_path / "rev", src, annotators=2, progress=False)
    items = prepared.manifest["items"]
    assert len(items) == 12 and not prepared.errors
    pos = next(i for i in items if i["positive"])
    assert pos["cxr"].endswith(f"{pos['dicom_id']}.png")
    overlay = np.asarray(Image.open(tmp_path / "rev" / pos["overlay"]))
    rosalia = np.asarray(Image.open(ref / "rosalia_pred" / pos["lesion"] / pos["pair_id"] / "pred_mask.png"))
    assert np.array_equal(overlay > 0, rosalia[..., 0] > 0)  # the ROSALIA mask is what annotators see
