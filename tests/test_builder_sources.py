"""Input readers (CXR, CheXmask table, review sheets, MIMIC-ILS) and case selection, on tiny hand-made files."""

import csv
import gzip
import io
import json

import numpy as np
import pytest
from PIL import Image

from chexpercept.builder.case_selection import ils_candidates, plan_cells
from chexpercept.builder.sources import (
    Anatomy,
    CaseInputError,
    CxrTree,
    SourceError,
    extract_chexmask_rows,
    find_chexmask_csv,
    load_cxr,
    load_ils,
    load_mask,
    read_review_sheets,
    rle_decode,
    rle_encode,
)
from chexpercept.vocab import Path


def test_rle_round_trip_and_format():
    mask = np.zeros((3, 4), dtype=bool)
    mask[0, 1:3] = True
    mask[1, 3] = True
    mask[2, 0] = True
    assert rle_encode(mask) == "2 2 8 2"  # 1-based starts, row-major, runs may cross rows
    np.testing.assert_array_equal(rle_decode("2 2 8 2", 3, 4), mask)
    rng = np.random.default_rng(0)
    m = rng.random((37, 23)) < 0.4
    np.testing.assert_array_equal(rle_decode(rle_encode(m), 37, 23), m)
    assert not rle_decode("", 5, 5).any()
    with pytest.raises(ValueError):
        rle_decode("1 100", 5, 5)


def _write_chexmask(path, rows, gz=False):
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "dicom_id",
            "Dice RCA (Mean)",
            "Dice RCA (Max)",
            "Landmarks",
            "Left Lung",
            "Right Lung",
            "Heart",
            "Height",
            "Width",
        ]
    )
    for row in rows:
        writer.writerow(row)
    data = buf.getvalue().encode()
    path.write_bytes(gzip.compress(data) if gz else data)


@pytest.mark.parametrize("gz", [False, True])
def test_chexmask_table_rows_are_extracted_and_decoded(tmp_path, gz):
    h, w = 40, 30
    right = np.zeros((h, w), dtype=bool)
    right[5:30, 2:12] = True
    left = np.zeros((h, w), dtype=bool)
    left[5:30, 18:28] = True
    table = tmp_path / ("MIMIC-CXR-JPG.csv.gz" if gz else "MIMIC-CXR-JPG.csv")
    landmarks = "[[ 1  2]\n [ 3  4]]"  # pandas writes numpy arrays with newlines inside the quoted field
    _write_chexmask(
        table,
        [
            ["other", 0.9, 0.9, landmarks, "1 3", "1 3", "1 3", h, w],
            ["img1", 0.9, 0.9, landmarks, rle_encode(left), rle_encode(right), "", h, w],
        ],
        gz=gz,
    )
    assert find_chexmask_csv(tmp_path) == table
    offsets = extract_chexmask_rows(table, ["img1", "missing"], tmp_path / "rows.jsonl")
    assert set(offsets) == {"img1"}
    anatomy = Anatomy(chexmask_rows=str(tmp_path / "rows.jsonl"), chexmask_offsets=offsets)
    lungs = anatomy.chex_lungs("img1", (w, h))
    assert lungs["right"].shape == (1024, 1024)
    # scaled by nearest neighbour: the right lung (image left) stays left of the left lung
    assert lungs["right"][:, :400].any() and not lungs["right"][:, 600:].any()
    assert lungs["left"][:, 600:].any() and not lungs["left"][:, :400].any()
    with pytest.raises(CaseInputError, match="OriginalResolution"):
        anatomy.chex_lungs("img1", (300, 400))
    with pytest.raises(CaseInputError, match="no row"):
        anatomy.chex_lungs("missing", (w, h))


def test_chexmask_table_without_lung_columns_is_refused(tmp_path):
    table = tmp_path / "bad.csv"
    table.write_text("dicom_id,Height,Width\nx,1,1\n")
    with pytest.raises(SourceError, match="Right Lung"):
        extract_chexmask_rows(table, ["x"], tmp_path / "rows.jsonl")


def test_review_sheets(tmp_path):
    pos = tmp_path / "labeling_sheet.csv"
    pos.write_text(
        "key_id,dicom_id,target,pair_id,optimal?\nedema_s1_positive_0,d1,edema,s1_positive_0,y\nedema_s2_positive_0,d2,edema,s2_positive_0,\n"
    )
    neg = tmp_path / "negative.csv"
    neg.write_text("lesion,key_id,dicom_id,optimal\nedema,edema_s3_negative_0,d3,ok\n")
    verdicts = read_review_sheets([pos, neg])
    assert verdicts == {
        "edema_s1_positive_0": True,
        "edema_s2_positive_0": False,
        "edema_s3_negative_0": True,
    }
    bad = tmp_path / "bad.csv"
    bad.write_text("key_id,comment\nx,y\n")
    with pytest.raises(SourceError, match="optimal"):
        read_review_sheets([bad])
    with pytest.raises(SourceError, match="does not exist"):
        read_review_sheets([tmp_path / "nope.csv"])


def test_cxr_png_passes_through_byte_for_byte_and_jpg_is_converted(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8)
    png = tmp_path / "a.png"
    Image.fromarray(arr).save(png)
    cxr = load_cxr(png)
    assert cxr.png_bytes == png.read_bytes()
    np.testing.assert_array_equal(cxr.rgb, arr)
    lazy = load_cxr(png, decode=False)
    assert lazy.rgb is None and lazy.png_bytes == png.read_bytes()
    jpg = tmp_path / "b.jpg"
    Image.fromarray(arr[:700, :600, 0]).save(jpg, quality=95)
    cxr = load_cxr(jpg)
    assert cxr.png_bytes is None and cxr.rgb.shape == (1024, 1024, 3) and cxr.original_size == (600, 700)
    expected = np.asarray(Image.open(jpg).resize((1024, 1024), Image.Resampling.LANCZOS).convert("RGB"))
    np.testing.assert_array_equal(cxr.rgb, expected)
    truncated = tmp_path / "t.png"
    truncated.write_bytes(png.read_bytes()[:-200])
    with pytest.raises(CaseInputError, match="t.png"):
        load_cxr(truncated, decode=False)
    with pytest.raises(CaseInputError, match="missing CXR image"):
        load_cxr(tmp_path / "nope.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    with pytest.raises(CaseInputError, match="junk.png"):
        load_cxr(tmp_path / "junk.png")


def test_masks_are_scaled_to_1024_by_nearest_neighbour(tmp_path):
    small = np.zeros((512, 512), dtype=np.uint8)
    small[10:20, 30:40] = 255
    Image.fromarray(small).save(tmp_path / "m.png")
    mask = load_mask(tmp_path / "m.png")
    assert mask.shape == (1024, 1024) and mask.sum() == 4 * 100
    assert mask[20:40, 60:80].all()
    with pytest.raises(CaseInputError, match="missing file"):
        load_mask(tmp_path / "nope.png")


def test_cxr_paths():
    tree = CxrTree("/data/mimic", flat=False)
    assert (
        str(tree.path("d1", "p10000032", "s50414267", None))
        == "/data/mimic/files/p10/p10000032/s50414267/d1.jpg"
    )
    assert (
        str(tree.path("d1", "p1", "s2", "p10/p10000032/s5/d1.jpg"))
        == "/data/mimic/files/p10/p10000032/s5/d1.jpg"
    )
    assert str(CxrTree("/flat", flat=True).path("d1", "", "", None)) == "/flat/d1.png"


def _study(dicom, pos=(), neg=(), basic=()):
    def pair(kind, lesion, i, t):
        return {
            "pair_id": f"{dicom}_{kind}_{i}",
            "type": t,
            "target": lesion,
            "seg_mask_path": f"{dicom}/{dicom}_{lesion}_0.png" if kind == "positive" else None,
        }

    return {
        "subject_id": "p10000001",
        "dicom_id": f"dicom-{dicom}",
        "image_path": None,
        "instruction_answer_pairs": {
            "positive_pairs": [pair("positive", les, i, "global") for i, les in enumerate(pos)]
            + [pair("positive", les, 10 + i, "basic") for i, les in enumerate(basic)],
            "negative_pairs": [pair("negative", les, i, "global") for i, les in enumerate(neg)],
        },
    }


def test_candidates_follow_the_reference_rules_and_selection_is_seeded(tmp_path):
    ils = {
        "train": {
            "s1": _study("s1", pos=["edema"], basic=["edema", "effusion"]),  # basic only where no global
            "s2": _study("s2", neg=["edema"]),
            "s3": _study("s3", pos=["effusion"], neg=["edema"]),  # image has a positive: not a negative
            "s4": _study("s4", neg=["edema", "effusion"]),  # one image, one case
            **{f"s{i}": _study(f"s{i}", pos=["edema"]) for i in range(5, 12)},
        },
        "val": {"s99": _study("s99", pos=["edema"])},
        "test": {},
    }
    (tmp_path / "mimic_ils_instruction_answer.json").write_text(json.dumps(ils))
    pos, neg = ils_candidates(load_ils(tmp_path), ("edema", "effusion"))
    assert {c.key_id for c in pos if c.lesion == "effusion"} == {
        "effusion_s1_positive_11",
        "effusion_s3_positive_0",
    }
    assert "edema_s1_positive_10" not in {c.key_id for c in pos}
    assert all(c.study_id != "s99" for c in pos)  # train only
    cells = plan_cells(pos, neg, seed=0, lesions=("edema", "effusion"))
    lf = [q.candidate.key_id for q in cells[("edema", Path.LF)] + cells[("effusion", Path.LF)]]
    assert "edema_s3_negative_0" not in lf
    assert sum(k.startswith(("edema_s4", "effusion_s4")) for k in lf) == 1
    rr = [q.candidate.key_id for q in cells[("edema", Path.RR)]]
    rf = [q.candidate.key_id for q in cells[("edema", Path.RF)]]
    assert len(rr) + len(rf) == 8 and abs(len(rr) - len(rf)) <= 1 and not set(rr) & set(rf)
    again = plan_cells(pos, neg, seed=0, lesions=("edema", "effusion"))
    assert [q.candidate.key_id for q in again[("edema", Path.RR)]] == rr
    other = plan_cells(pos, neg, seed=1, lesions=("edema", "effusion"))
    assert [q.candidate.key_id for q in other[("edema", Path.RR)]] != rr or [
        q.candidate.key_id for q in other[("edema", Path.RF)]
    ] != rf
    reviewed = plan_cells(
        pos,
        neg,
        seed=0,
        lesions=("edema",),
        review={"edema_s5_positive_0": True, "edema_s2_negative_0": True},
    )
    assert [q.candidate.key_id for q in reviewed[("edema", Path.RR)]] == ["edema_s5_positive_0"]
    assert [q.candidate.key_id for q in reviewed[("edema", Path.LF)]] == ["edema_s2_negative_0"]


def test_missing_global_inputs(tmp_path):
    with pytest.raises(SourceError, match="mimic_ils_instruction_answer.json"):
        load_ils(tmp_path)
    (tmp_path / "mimic_ils_instruction_answer.json").write_text("{not json")
    with pytest.raises(SourceError, match="not valid JSON"):
        load_ils(tmp_path)
    with pytest.raises(SourceError, match="files/"):
        CxrTree.jpg_tree(tmp_path)
    with pytest.raises(SourceError, match="does not exist"):
        CxrTree.png_folder(tmp_path / "nope")
