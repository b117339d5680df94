"""Paths from the generation sources stay inside their folders (chexpercept.containment), issue 21
item 1 for ``generate`` and ``review``: MIMIC-ILS ``image_path`` / ``seg_mask_path`` with ``..`` or
absolute, ``pair_id`` / ``dicom_id`` / subject and study ids used as path parts, file and folder links
out of the CXR, lesion-mask, anatomy and ROSALIA trees. Each is refused before any work, naming the
case, its study and the field, and again when a worker would read the file.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from chexpercept.builder.case_selection import Candidate
from chexpercept.builder.review.prepare import ReviewSources, prepare
from chexpercept.builder.source_paths import check_candidates, lesion_mask_path
from chexpercept.builder.sources import ILS_JSON, CxrTree, OutsideSourceError, SourceError
from chexpercept.cli import main as cli

LESION = "effusion"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    from chexpercept.builder.synth_sources import synthesize_sources

    return synthesize_sources(
        tmp_path_factory.mktemp("src_containment") / "src", per_cell=1, lesions=(LESION,), progress=False
    )


@pytest.fixture
def sources(pristine, tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(pristine, copy, symlinks=True)
    (tmp_path / "outside").mkdir()
    return copy


def _ils(src):
    return json.loads((src / "mimic-ils" / ILS_JSON).read_text())


def _save(src, ils):
    (src / "mimic-ils" / ILS_JSON).write_text(json.dumps(ils))


def _positive(ils):
    for study_id, study in ils["train"].items():
        for pair in study["instruction_answer_pairs"]["positive_pairs"]:
            return study_id, study, pair
    raise AssertionError("no positive pair")


def _generate(src, out, *extra):
    return cli(
        [
            *(
                "generate",
                "--mimic-cxr-jpg",
                str(src / "mimic-cxr-jpg"),
                "--mimic-ils",
                str(src / "mimic-ils"),
            ),
            *("--anatomy", str(src / "anatomy"), "--lesions", LESION, "--per-cell", "1"),
            *("--output-dir", str(out), "--no-progress", *extra),
        ]
    )


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        (
            "image_path",
            "../../../outside/x.jpg",
            "MIMIC-ILS image_path '../../../outside/x.jpg' has a '..' part",
        ),
        ("image_path", "/etc/passwd", "MIMIC-ILS image_path '/etc/passwd' is an absolute path"),
        ("image_path", "p10\\..\\..\\x.jpg", "backslash"),
        (
            "seg_mask_path",
            "../../outside/x.png",
            "MIMIC-ILS seg_mask_path '../../outside/x.png' has a '..' part",
        ),
        ("seg_mask_path", "/etc/passwd", "MIMIC-ILS seg_mask_path '/etc/passwd' is an absolute path"),
        ("seg_mask_path", "s1/%2e%2e/x.png", "percent-encoded"),
        ("pair_id", "../../x", "MIMIC-ILS pair_id '../../x' contains '/'"),
        ("pair_id", ".", "MIMIC-ILS pair_id '.' is '.'"),
        ("dicom_id", "../x", "MIMIC-ILS dicom_id '../x' contains '/'"),
        ("dicom_id", "a\x00b", "NUL"),
    ],
)
def test_generate_refuses_source_paths_that_leave_their_folder(sources, tmp_path, capsys, field, value, said):
    ils = _ils(sources)
    study_id, study, pair = _positive(ils)
    (study if field in ("image_path", "dicom_id") else pair)[field] = value
    _save(sources, ils)
    out = tmp_path / "bundle"
    assert _generate(sources, out) == 2
    err = capsys.readouterr().err
    key = f"{LESION}_{pair['pair_id']}"
    assert f"{key} (study {study_id}): " in err and said in err and "refused" in err
    assert not out.exists()  # before any work


def test_the_flat_png_folder_refuses_a_dicom_id_path(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    with pytest.raises(OutsideSourceError, match=r"--cxr-png: dicom_id '\.\./\.\./x' contains '/'"):
        CxrTree.png_folder(flat).path("../../x", "", "", None)
    with pytest.raises(OutsideSourceError, match=r"subject_id 'p\.\./p1' contains '/'"):
        CxrTree(str(flat), flat=False).path("d1", "../p1", "s1", None)
    with pytest.raises(OutsideSourceError, match=r"study id 's/x' contains '/'"):
        CxrTree(str(flat), flat=False).path("d1", "p1", "/x", None)
    with pytest.raises(OutsideSourceError, match=r"MIMIC-ILS dicom_id '\.\.' is '\.\.'"):
        CxrTree(str(flat), flat=False).path("..", "p1", "s1", None)


def _first_cxr(src):
    return next((src / "mimic-cxr-jpg" / "files").rglob("*.jpg"))


def test_a_file_link_out_of_the_cxr_tree_is_refused(sources, tmp_path, capsys):
    jpg = _first_cxr(sources)
    outside = tmp_path / "outside" / jpg.name
    shutil.move(jpg, outside)  # another tree's image, linked into this one
    os.symlink(outside, jpg)
    assert _generate(sources, tmp_path / "bundle") == 2
    err = capsys.readouterr().err
    assert (
        f"resolves to {outside.resolve()}, outside {(sources / 'mimic-cxr-jpg' / 'files').resolve()}" in err
    )
    assert not (tmp_path / "bundle").exists()


def test_folder_links_out_of_the_mask_and_anatomy_trees_are_refused(sources, tmp_path, capsys):
    ils = _ils(sources)
    study_id, study, pair = _positive(ils)
    masks = sources / "mimic-ils" / "lesion_mask" / pair["seg_mask_path"].split("/")[0]
    shutil.move(masks, tmp_path / "outside" / "masks")
    os.symlink(tmp_path / "outside" / "masks", masks)
    anatomy = sources / "anatomy" / study["dicom_id"]
    shutil.move(anatomy, tmp_path / "outside" / "anatomy")
    os.symlink(tmp_path / "outside" / "anatomy", anatomy)
    assert _generate(sources, tmp_path / "bundle") == 2
    err = capsys.readouterr().err
    assert "MIMIC-ILS seg_mask_path" in err and "--anatomy mask" in err and "right_lung.png" in err
    assert f"{LESION}_{pair['pair_id']} (study {study_id})" in err


def test_links_inside_a_tree_and_a_linked_tree_are_fine(sources, tmp_path):
    jpgs = sorted((sources / "mimic-cxr-jpg" / "files").rglob("*.jpg"))
    moved = sources / "mimic-cxr-jpg" / "files" / "store.jpg"
    shutil.move(jpgs[0], moved)
    os.symlink(os.path.relpath(moved, jpgs[0].parent), jpgs[0])  # deduplicated inside the tree
    os.symlink(sources / "mimic-cxr-jpg", tmp_path / "cxr-link")  # the tree itself on another disk
    ils = _ils(sources)
    cxr = CxrTree.jpg_tree(tmp_path / "cxr-link")
    masks = str(sources / "mimic-ils" / "lesion_mask")
    from chexpercept.builder.case_selection import ils_candidates

    positives, negatives = ils_candidates(ils, (LESION,))
    check_candidates([*positives, *negatives], cxr, masks, None, anatomy_folder=str(sources / "anatomy"))


def test_rosalia_pair_ids_stay_in_their_tree(tmp_path):
    rosalia = tmp_path / "rosalia"
    rosalia.mkdir()
    c = Candidate("effusion_../../x", LESION, "../../x", "s1", "p1", "d1", None, None, True, "global")
    with pytest.raises(OutsideSourceError, match="MIMIC-ILS pair_id"):
        lesion_mask_path(c, str(rosalia), "")
    ok = Candidate("effusion_s1_positive_0", LESION, "s1_positive_0", "s1", "p1", "d1", None, None, True, "x")
    (rosalia / LESION).mkdir()
    os.symlink(tmp_path, rosalia / LESION / "s1_positive_0")  # a pair folder linked out
    with pytest.raises(OutsideSourceError, match="--rosalia-pred mask .* resolves to"):
        lesion_mask_path(ok, str(rosalia), "")


def test_review_prepare_refuses_before_writing(sources, tmp_path):
    ils = _ils(sources)
    _, study, _ = _positive(ils)
    study["image_path"] = "../../../outside/x.jpg"
    _save(sources, ils)
    src = ReviewSources(
        mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"), mimic_ils=str(sources / "mimic-ils"), lesions=[LESION]
    )
    with pytest.raises(SourceError, match="image_path .* has a '..' part"):
        prepare(tmp_path / "rev", src, annotators=1, progress=False)
    assert not (tmp_path / "rev").exists()


def test_generate_writes_only_safe_key_ids(tmp_path):
    from chexpercept.builder.export import record_path, write_case_folder
    from chexpercept.containment import ContainmentError

    with pytest.raises(ContainmentError, match="key_id"):
        write_case_folder(tmp_path, "effusion_../../x", {"detection_qa/xray.png": b""})
    with pytest.raises(ContainmentError, match="'..' part"):
        write_case_folder(tmp_path, "effusion_ok", {"../../x.png": b""})
    with pytest.raises(ContainmentError, match="key_id"):
        record_path(tmp_path, "/abs")
    assert not any(tmp_path.iterdir())
