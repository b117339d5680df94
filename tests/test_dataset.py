"""load_dataset("chexpercept", ...) end to end on a fixture bundle."""

import json
import os
import subprocess
import sys
import textwrap

import datasets
import pytest
from PIL import Image

import chexpercept  # noqa: F401  (registers the builder)
from chexpercept.bundle import read_bundle, write_sha256sums
from chexpercept.errors import BundleValidationError, ReleaseNotFoundError


def _load(*args, **kwargs):
    return datasets.load_dataset("chexpercept", *args, **kwargs)["train"]


def test_fresh_process_after_import(fixture_bundle, tmp_path):
    code = textwrap.dedent(f"""
        import chexpercept
        from datasets import load_dataset
        ds = load_dataset("chexpercept", data_dir={str(fixture_bundle)!r})["train"]
        items = load_dataset("chexpercept", "items", data_dir={str(fixture_bundle)!r})["train"]
        print(ds.num_rows, items.num_rows)
    """)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[-2:] == ["21", "104"]


def test_sequences_rows_match_cases(fixture_bundle):
    ds = _load(data_dir=str(fixture_bundle))
    bundle = read_bundle(fixture_bundle)
    assert ds.num_rows == len(bundle) == 21
    assert ds["key_id"] == [c.key_id for c in bundle]
    row = ds[0]
    case = bundle.cases[0]
    assert ds.features["lesion"].int2str(row["lesion"]) == case.lesion
    assert ds.features["path"].int2str(row["path"]) == case.path.value
    assert isinstance(row["image"], Image.Image)
    assert [t["task"] for t in row["turns"]] == [t.task for t in case.turns]
    for t_row, t in zip(row["turns"], case.turns):
        assert t_row["text"] == t.text and t_row["options"] == list(t.options)
        assert t_row["answer_index"] == list(t.answer_index) and t_row["multi_select"] == t.multi_select
        assert len(t_row["images"]) == len(t.images)


def test_images_reference_files_not_copies(fixture_bundle):
    ds = _load(data_dir=str(fixture_bundle)).cast_column("image", datasets.Image(decode=False))
    row = ds[0]
    assert row["image"]["bytes"] is None
    assert row["image"]["path"] == str(
        fixture_bundle / "chexpercept" / row["key_id"] / "detection_qa" / "xray.png"
    )


def test_embed_images_stores_bytes(fixture_bundle):
    ds = _load(data_dir=str(fixture_bundle), embed_images=True).cast_column(
        "image", datasets.Image(decode=False)
    )
    row = ds[0]
    path = fixture_bundle / "chexpercept" / row["key_id"] / "detection_qa" / "xray.png"
    assert row["image"]["bytes"] == path.read_bytes()


def test_items_one_row_per_question(fixture_bundle):
    items = _load("items", data_dir=str(fixture_bundle))
    bundle = read_bundle(fixture_bundle)
    assert items.num_rows == sum(len(c.turns) for c in bundle) == 104
    first = items[0]
    assert first["turn_index"] == 0 and first["task"] == "detection" and len(first["images"]) == 1


def test_filters_as_config_options(fixture_bundle):
    ds = _load(data_dir=str(fixture_bundle), lesions=["cardiomegaly"], paths=["RR", "RF"])
    assert ds.num_rows == 2
    assert sorted(len(t) for t in ds["turns"]) == [2, 5]
    items = _load("items", data_dir=str(fixture_bundle), paths=["LF"])
    assert items.num_rows == 7


def test_num_proc_and_streaming(fixture_bundle):
    ds = _load(data_dir=str(fixture_bundle), num_proc=2)
    assert ds.num_rows == 21
    assert ds["key_id"] == [c.key_id for c in read_bundle(fixture_bundle)]
    stream = datasets.load_dataset("chexpercept", data_dir=str(fixture_bundle), streaming=True)["train"]
    keys = [r["key_id"] for r in stream]
    assert keys == ds["key_id"]


def test_load_errors_are_ours(tmp_path):
    with pytest.raises(ReleaseNotFoundError, match="no such folder"):
        _load(data_dir=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReleaseNotFoundError, match="is empty"):
        _load(data_dir=str(tmp_path / "empty"))
    with pytest.raises(ReleaseNotFoundError, match="No data_dir given"):
        _load()


def test_validation_error_through_load_dataset(fresh_bundle):
    entries = json.loads((fresh_bundle / "chexpercept.json").read_text())
    key = next(iter(entries))
    entries[key]["detection_qa"]["answer_index"] = 3
    (fresh_bundle / "chexpercept.json").write_text(json.dumps(entries))
    with pytest.raises(BundleValidationError, match=f"{key}: detection_qa.answer_index: 3 out of range"):
        _load(data_dir=str(fresh_bundle))


def test_all_checks_verifies_sha256sums(fresh_bundle):
    write_sha256sums(fresh_bundle)
    assert _load(data_dir=str(fresh_bundle), verification_mode="all_checks").num_rows == 21
    key = next(iter(json.loads((fresh_bundle / "chexpercept.json").read_text())))
    Image.new("RGB", (32, 32)).save(fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png")
    with pytest.raises(BundleValidationError, match="sha256 does not match"):
        _load(data_dir=str(fresh_bundle), verification_mode="all_checks", download_mode="force_redownload")


def test_inspect_counts_what_load_dataset_gives_without_decoding_or_importing_datasets(fixture_bundle):
    """`chexpercept inspect` reads the bundle the way the builder does, so its counts are
    load_dataset's rows, per lesion and path; it builds no dataset (issue 23: it decoded every
    image to count rows)."""
    from collections import Counter

    code = (
        "import json, sys\nfrom chexpercept.cli import main\nmain(['inspect', sys.argv[1]])\n"
        "print(json.dumps(sorted(m for m in ('datasets', 'pyarrow', 'PIL.PngImagePlugin') if m in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(fixture_bundle)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == []  # neither datasets nor an image decoder was imported
    ds = _load(data_dir=str(fixture_bundle))
    items = _load("items", data_dir=str(fixture_bundle))
    assert (
        f"gives {ds.num_rows} cases (config sequences), {items.num_rows} questions (config items)" in lines[0]
    )
    lesions, paths = ds.features["lesion"].names, ds.features["path"].names
    cases = Counter((lesions[a], paths[b]) for a, b in zip(ds["lesion"], ds["path"]))
    questions = Counter(
        (lesions[r["lesion"]], paths[r["path"]]) for r in items.select_columns(["lesion", "path"])
    )
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in lesions:
            counts = [int(c) for c in cells[1:]]
            assert counts[:3] == [cases[(cells[0], p)] for p in ("RR", "RF", "LF")]
            assert counts[4:7] == [questions[(cells[0], p)] for p in ("RR", "RF", "LF")]
