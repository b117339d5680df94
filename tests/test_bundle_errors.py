"""Every bad-input case gets a clear error naming the case and the field or file."""

import json
import shutil

import pytest

from chexpercept.bundle import read_bundle, write_sha256sums
from chexpercept.errors import BundleValidationError, ReleaseNotFoundError


def _entries(root):
    return json.loads((root / "chexpercept.json").read_text())


def _save(root, entries):
    (root / "chexpercept.json").write_text(json.dumps(entries, indent=2))


def _first(entries, lesion="effusion", kind="positive", rr=True):
    for k, e in entries.items():
        if (
            k.startswith(lesion)
            and kind in k
            and (not rr or not e.get("contour_qa", {}).get("no_deformation", True))
        ):
            return k
    raise AssertionError("no such case")


def test_no_data_dir():
    with pytest.raises(ReleaseNotFoundError, match="No data_dir given") as e:
        read_bundle(None)
    assert "PhysioNet" in str(e.value) and "CITI" in str(e.value) and "MIMIC-ILS" in str(e.value)


def test_missing_dir(tmp_path):
    with pytest.raises(ReleaseNotFoundError, match="no such folder"):
        read_bundle(tmp_path / "nope")


def test_empty_dir(tmp_path):
    with pytest.raises(ReleaseNotFoundError, match="is empty") as e:
        read_bundle(tmp_path)
    assert "chexpercept.json" in str(e.value)


def test_not_a_release(tmp_path):
    (tmp_path / "readme.txt").write_text("hello")
    with pytest.raises(ReleaseNotFoundError, match="has no chexpercept.json"):
        read_bundle(tmp_path)


def test_json_not_an_object(tmp_path):
    (tmp_path / "chexpercept.json").write_text("[1, 2]")
    with pytest.raises(BundleValidationError, match="top level must be an object keyed by key_id, got list"):
        read_bundle(tmp_path)


def test_invalid_json(tmp_path):
    (tmp_path / "chexpercept.json").write_text("{nope")
    with pytest.raises(BundleValidationError, match="not valid JSON"):
        read_bundle(tmp_path)


def test_entry_without_detection_qa(fresh_bundle):
    entries = _entries(fresh_bundle)
    key = _first(entries)
    del entries[key]["detection_qa"]
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    assert f"{key}: detection_qa: missing" in str(e.value)


def test_missing_image(fresh_bundle):
    key = _first(_entries(fresh_bundle))
    img = (
        fresh_bundle
        / "chexpercept"
        / key
        / "contour_qa"
        / "contour_revision_qa"
        / "xray_with_mask_and_points.png"
    )
    img.unlink()
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    assert (
        f"{key}: chexpercept/{key}/contour_qa/contour_revision_qa/xray_with_mask_and_points.png: image file is missing"
        in str(e.value)
    )


def test_truncated_png(fresh_bundle):
    key = _first(_entries(fresh_bundle), lesion="edema")
    img = fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png"
    data = img.read_bytes()
    img.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    assert f"{key}: chexpercept/{key}/detection_qa/xray.png" in str(e.value)
    assert "truncated" in str(e.value) or "does not decode" in str(e.value)


def test_garbage_image(fresh_bundle):
    key = _first(_entries(fresh_bundle), lesion="pneumonia")
    (fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png").write_bytes(b"not a png at all")
    with pytest.raises(BundleValidationError, match="does not decode"):
        read_bundle(fresh_bundle)


def test_unknown_lesion_prefix(fresh_bundle):
    entries = _entries(fresh_bundle)
    key = _first(entries)
    entry = entries.pop(key)
    new_key = "nodule_" + key.split("_", 1)[1]
    entries[new_key] = entry
    _save(fresh_bundle, entries)
    shutil.copytree(fresh_bundle / "chexpercept" / key, fresh_bundle / "chexpercept" / new_key)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    assert f"{new_key}: key_id: unknown lesion prefix 'nodule'" in str(e.value)


def test_answer_index_out_of_range(fresh_bundle):
    entries = _entries(fresh_bundle)
    key = _first(entries)
    entries[key]["attribute_extraction_qa"]["comparison"]["answer_index"] = 7
    n = len(entries[key]["contour_qa"]["contour_revision_qa_expansion"]["answer_options"])
    entries[key]["contour_qa"]["contour_revision_qa_expansion"]["answer_index"] = [1, n + 1]
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    msg = str(e.value)
    assert f"{key}: attribute_extraction_qa.comparison.answer_index: 7 out of range 1..4" in msg
    assert (
        f"{key}: contour_qa.contour_revision_qa_expansion.answer_index[1]: {n + 1} out of range 1..{n}" in msg
    )


def test_wrong_types_and_all_problems_reported_together(fresh_bundle):
    entries = _entries(fresh_bundle)
    keys = [k for k in entries if "positive" in k and not k.startswith("cardiomegaly")][:2]
    entries[keys[0]]["contour_qa"]["no_deformation"] = "yes"
    entries[keys[1]]["detection_qa"]["answer_index"] = "1"
    entries[keys[1]]["attribute_extraction_qa"] = None
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    msg = str(e.value)
    assert f"{keys[0]}: contour_qa.no_deformation: expected a bool, got str" in msg
    assert f"{keys[1]}: detection_qa.answer_index: expected an int, got str" in msg
    assert f"{keys[1]}: attribute_extraction_qa: is null but only cardiomegaly has no Stage 4" in msg
    assert len(e.value.problems) == 3


def test_question_must_carry_its_options(fresh_bundle):
    entries = _entries(fresh_bundle)
    key = _first(entries)
    entries[key]["attribute_extraction_qa"]["distribution"]["question"] += " extra"
    _save(fresh_bundle, entries)
    with pytest.raises(
        BundleValidationError, match="distribution.question: does not end with its options block"
    ):
        read_bundle(fresh_bundle)


def test_unknown_extra_fields_tolerated(fresh_bundle):
    entries = _entries(fresh_bundle)
    for e in entries.values():
        e["something_new"] = {"a": 1}
        e["detection_qa"]["note"] = "x"
    _save(fresh_bundle, entries)
    assert len(read_bundle(fresh_bundle)) == len(entries)


def test_sha256sums_checked_only_when_asked(fresh_bundle):
    write_sha256sums(fresh_bundle)
    assert len(read_bundle(fresh_bundle, verify_checksums=True)) == 21
    key = _first(_entries(fresh_bundle))
    img = fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png"
    from PIL import Image

    Image.new("RGB", (32, 32), "white").save(img)
    assert len(read_bundle(fresh_bundle)) == 21  # basic checks do not hash
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, verify_checksums=True)
    assert f"{key}: chexpercept/{key}/detection_qa/xray.png: sha256 does not match SHA256SUMS.txt" in str(
        e.value
    )


def test_filters(fixture_bundle):
    b = read_bundle(fixture_bundle, lesions=["effusion", "edema"], paths=["revision_required", "LF"])
    assert sorted((c.lesion, c.path.value) for c in b) == [
        ("edema", "LF"),
        ("edema", "RR"),
        ("effusion", "LF"),
        ("effusion", "RR"),
    ]
    with pytest.raises(ValueError, match="unknown lesion"):
        read_bundle(fixture_bundle, lesions=["nodule"])


def test_bad_check_images_option(fixture_bundle):
    with pytest.raises(ValueError, match="check_images must be one of"):
        read_bundle(fixture_bundle, check_images="thorough")
