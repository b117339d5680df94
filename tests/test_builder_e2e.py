"""End to end: phantom sources -> generate -> a release bundle that loads, validates, and whose every gold
answer can be re-derived from the saved source masks with code independent of the generator."""

from __future__ import annotations

import json
from pathlib import Path as FsPath

import datasets
import numpy as np
import pytest
from PIL import Image
from scipy import ndimage as ndi

import chexpercept
from chexpercept.builder.pipeline import GenerateConfig, generate
from chexpercept.builder.regions import partition, region_display
from chexpercept.builder.synth_sources import synthesize_sources
from chexpercept.bundle import read_bundle
from chexpercept.case import Case
from chexpercept.validate import validate_entry
from chexpercept.vocab import CARDIOMEGALY, COLOR_RGB, LESIONS


def _gen(sources: FsPath, out: FsPath, **kw) -> GenerateConfig:
    return GenerateConfig(
        out=str(out),
        per_cell=kw.pop("per_cell", 1),
        seed=kw.pop("seed", 0),
        mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"),
        mimic_ils=str(sources / "mimic-ils"),
        anatomy=str(sources / "anatomy"),
        progress=False,
        **kw,
    )


def _grey(path: FsPath) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def _expected_xray(sources: FsPath, record: dict) -> np.ndarray:
    jpg = sources / "mimic-cxr-jpg" / "files" / record["image_path"]
    with Image.open(jpg) as im:
        return np.asarray(im.convert("L").resize((1024, 1024), Image.Resampling.LANCZOS).convert("RGB"))


def _mask(path: FsPath) -> np.ndarray:
    with Image.open(path) as im:
        m = np.asarray(im.convert("L")) > 0
    if m.shape == (512, 512):
        m = np.repeat(np.repeat(m, 2, axis=0), 2, axis=1)
    assert m.shape == (1024, 1024)
    return m


def _components(mask: np.ndarray) -> list[np.ndarray]:
    labels, n = ndi.label(mask)
    sizes = np.bincount(labels.ravel())
    keep = sorted((i for i in range(1, n + 1) if sizes[i] >= 1000), key=lambda i: -sizes[i])
    return [labels == i for i in keep]


def _thirds(lung: np.ndarray) -> list[np.ndarray]:
    ys = np.nonzero(lung.any(axis=1))[0]
    h = ys[-1] - ys[0] + 1
    b1, b2 = ys[0] + h // 3, ys[0] + 2 * h // 3
    y = np.arange(lung.shape[0])[:, None]
    return [lung & (y <= b1), lung & (y > b1) & (y <= b2), lung & (y > b2)]


def _positive_regions(comps, regions) -> set[str]:
    pos = set()
    for c in comps:
        fr = {n: (int((c & m).sum()), int(m.sum())) for n, m in regions.items()}
        hits = {n for n, (k, a) in fr.items() if a and 5 * k >= a}
        if not hits:
            best = max(fr, key=lambda n: fr[n][0] / fr[n][1] if fr[n][1] else 0)
            if fr[best][0] > 0:
                hits = {best}
        pos |= hits
    return pos


def rederive(bundle: FsPath, sources: FsPath) -> dict[str, int]:
    """Check every gold answer of every entry against the source masks; returns what was checked."""
    entries = json.loads((bundle / "chexpercept.json").read_text())
    ils = json.loads((sources / "mimic-ils" / "mimic_ils_instruction_answer.json").read_text())["train"]
    checked = {"cases": 0, "rr": 0, "stage4": 0}
    for key, e in entries.items():
        lesion, pair_id = key.split("_", 1)
        record = ils[pair_id.split("_")[0]]
        assert e["dicom_id"] == record["dicom_id"]
        case_dir = bundle / "chexpercept" / key
        xray = _grey(case_dir / "detection_qa" / "xray.png")
        np.testing.assert_array_equal(xray, _expected_xray(sources, record))
        checked["cases"] += 1
        pairs = record["instruction_answer_pairs"]
        if e["detection_qa"]["answer"] == "No":
            assert [p["pair_id"] for p in pairs["negative_pairs"]] == [pair_id] and not pairs[
                "positive_pairs"
            ]
            assert sorted(p.name for p in case_dir.iterdir()) == ["detection_qa"]
            continue
        (pair,) = [p for p in pairs["positive_pairs"] if p["pair_id"] == pair_id]
        assert e["detection_qa"]["answer_index"] == 1
        comps = _components(_mask(sources / "mimic-ils" / "lesion_mask" / pair["seg_mask_path"]))
        optimal = np.logical_or.reduce(comps)
        right = _mask(sources / "anatomy" / e["dicom_id"] / "right_lung.png")
        left = _mask(sources / "anatomy" / e["dicom_id"] / "left_lung.png")
        for c in comps:
            touches_r, touches_l = (c & right).any(), (c & left).any()
            right |= c if touches_r else False
            left |= c if touches_l else False
        cq = e["contour_qa"]
        shown_img = _grey(case_dir / "contour_qa" / "contour_eval_qa" / "xray_with_mask.png")
        shown = (shown_img != xray).any(axis=2)
        v = xray[..., 0].astype(int)
        np.testing.assert_array_equal(shown_img[shown][:, 0], v[shown] // 2)
        np.testing.assert_array_equal(shown_img[shown][:, 1], (v[shown] + 255) // 2)
        if cq["no_deformation"]:
            assert cq["contour_eval_qa"]["answer_index"] == 2
            np.testing.assert_array_equal(shown, optimal)
            assert not (case_dir / "contour_qa" / "contour_revision_qa").exists()
        else:
            checked["rr"] += 1
            assert cq["contour_eval_qa"]["answer_index"] == 1
            before = shown
            assert not np.array_equal(before, optimal)
            exp, con = cq["contour_revision_qa_expansion"], cq["contour_revision_qa_contraction"]
            options = exp["answer_options"]
            assert options == con["answer_options"] and options[-1]["point"] is None and len(options) <= 9
            points_img = _grey(
                case_dir / "contour_qa" / "contour_revision_qa" / "xray_with_mask_and_points.png"
            )
            exp_gold, con_gold = [], []
            for i, opt in enumerate(options[:-1], start=1):
                x, y = opt["point"]
                assert tuple(points_img[y, x]) == tuple(round(c * 255) for c in COLOR_RGB[opt["color"]])
                if optimal[y, x] and not before[y, x]:
                    exp_gold.append(i)
                if before[y, x] and not optimal[y, x]:
                    con_gold.append(i)
            n = len(options)
            assert sorted(exp["answer_index"]) == (exp_gold or [n])
            assert sorted(con["answer_index"]) == (con_gold or [n])
            rev = cq["contour_revision_qa_revision_result"]
            renders = []
            for opt in rev["answer_options"]:
                img = _grey(case_dir / "contour_qa" / "contour_revision_qa" / opt["relative_path"])
                renders.append((img != xray).any(axis=2))
            true_i = rev["answer_index"]
            np.testing.assert_array_equal(renders[true_i - 1], optimal)
            for i, r in enumerate(renders, start=1):
                if i != true_i:
                    assert not np.array_equal(r, optimal) and not np.array_equal(r, before)
            assert len({r.tobytes() for r in renders}) == len(renders)
        attrs = e["attribute_extraction_qa"]
        if lesion == CARDIOMEGALY:
            assert attrs is None
            continue
        checked["stage4"] += 1
        regions = partition(right, left)
        pos = _positive_regions(comps, regions)
        zones_ = {region_display(n)[1] for n in pos}
        assert attrs["distribution"]["answer_index"] == min(len(zones_), 4) and zones_
        loc = attrs["location"]
        display_pos = {region_display(n)[0] for n in pos}
        gold = [i for i, o in enumerate(loc["answer_options"][:3], start=1) if o in display_pos]
        assert loc["answer_index"] == (gold or [4])
        lungs = {"right lung": right, "left lung": left}
        has = {k: any(100 * (c & m).sum() >= m.sum() for c in comps) for k, m in lungs.items()}
        sev = attrs["severity/measurement"]
        lung = sev["selected_lung"]
        if any(has.values()):
            assert has[lung]
            covered, area = int((optimal & lungs[lung]).sum()), int(lungs[lung].sum())
            assert sev["answer_index"] == (1 if 3 * covered < area else 2 if 3 * covered < 2 * area else 3)
        size = {
            k: sum(int((c & m).sum()) for c in comps if 100 * (c & m).sum() >= m.sum())
            for k, m in lungs.items()
        }
        comp = attrs["comparison"]
        assert (comp["left_size"], comp["right_size"]) == (size["left lung"], size["right lung"])
        if not (has["left lung"] and has["right lung"]):
            expected = 4
        elif 2 * size["left lung"] >= 3 * size["right lung"]:
            expected = 2
        elif 2 * size["right lung"] >= 3 * size["left lung"]:
            expected = 3
        else:
            expected = 1
        assert comp["answer_index"] == expected
    return checked


@pytest.fixture
def full_synth(phantom_bundle):
    return phantom_bundle


def test_synth_bundle_is_valid_loads_and_every_answer_rederives(full_synth):
    entries = json.loads((full_synth / "chexpercept.json").read_text())
    assert len(entries) == 21
    for key, entry in entries.items():
        assert validate_entry(key, entry) == []
        assert Case.from_entry(key, entry).to_entry() == entry
        assert entry["provenance"] == {
            "synthetic": True,
            "generator": f"chexpercept {chexpercept.__version__}",
            "seed": 0,
            "deformer": "morphology",
            "reviewed": False,
        }
    bundle = read_bundle(full_synth, check_images="full")
    assert bundle.synthetic
    assert {(c.lesion, c.path.value) for c in bundle} == {
        (les, p) for les in LESIONS for p in ("RR", "RF", "LF")
    }
    ds = datasets.load_dataset("chexpercept", data_dir=str(full_synth))["train"]
    assert ds.num_rows == 21
    items = datasets.load_dataset("chexpercept", "items", data_dir=str(full_synth))["train"]
    assert items.num_rows == 6 * 16 + 8  # LF 1, RF 6 (cardiomegaly 2), RR 9 (cardiomegaly 5)
    sources = full_synth / ".chexpercept-work" / "phantom-sources"
    checked = rederive(full_synth, sources)
    assert checked == {"cases": 21, "rr": 7, "stage4": 12}


@pytest.fixture(scope="module")
def small_sources(tmp_path_factory):
    return synthesize_sources(
        tmp_path_factory.mktemp("sources"),
        per_cell=1,
        seed=3,
        lesions=("effusion", "cardiomegaly"),
        progress=False,
    )


def _files(root: FsPath) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".chexpercept-work" not in p.parts
    }


def test_one_and_two_workers_give_identical_bundles_and_reruns_resume(small_sources, tmp_path):
    lesions = ["effusion", "cardiomegaly"]
    one = generate(_gen(small_sources, tmp_path / "one", lesions=lesions, num_proc=1))
    two = generate(_gen(small_sources, tmp_path / "two", lesions=lesions, num_proc=2))
    assert one.exit_code == two.exit_code == 0 and one.cases == two.cases == 6
    files_one, files_two = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert files_one["chexpercept.json"] == files_two["chexpercept.json"]
    assert files_one == files_two
    rederive(tmp_path / "one", small_sources)
    # crash simulation: lose two finished cases and the bundle file; the rerun rebuilds only those
    work = tmp_path / "one" / ".chexpercept-work" / "cases"
    lost = sorted(work.iterdir())[:2]
    for record in lost:
        record.unlink()
    (tmp_path / "one" / "chexpercept.json").unlink()
    again = generate(_gen(small_sources, tmp_path / "one", lesions=lesions))
    assert again.exit_code == 0 and again.built == 2 and again.resumed == 4
    assert _files(tmp_path / "one") == files_one
    # different settings in the same folder are refused, not mixed
    with pytest.raises(Exception, match="different settings"):
        generate(_gen(small_sources, tmp_path / "one", lesions=lesions, seed=5))


def test_failing_case_is_reported_replaced_and_exits_non_zero(small_sources, tmp_path):
    import shutil

    sources = tmp_path / "src"
    shutil.copytree(small_sources, sources)
    first = generate(_gen(sources, tmp_path / "probe", lesions=["effusion"]))
    entries = json.loads((tmp_path / "probe" / "chexpercept.json").read_text())
    # an RR case: its cell has a spare candidate (2N + spare positives alternate RR, RF, RR)
    victim = next(
        k for k, e in entries.items() if "contour_qa" in e and not e["contour_qa"]["no_deformation"]
    )
    ils = json.loads((sources / "mimic-ils" / "mimic_ils_instruction_answer.json").read_text())["train"]
    record = ils[victim.split("_")[1]]
    jpg = sources / "mimic-cxr-jpg" / "files" / record["image_path"]
    jpg.unlink()
    report = generate(_gen(sources, tmp_path / "out", lesions=["effusion"]))
    assert report.exit_code == 1
    assert [f["key_id"] for f in report.failed] == [victim]
    assert str(jpg) in report.failed[0]["error"]
    assert report.cases == first.cases == 3  # a spare candidate took its place
    assert victim not in json.loads((tmp_path / "out" / "chexpercept.json").read_text())
    assert victim in report.text()
    fast = generate(_gen(sources, tmp_path / "fast", lesions=["effusion"], fail_fast=True))
    assert fast.exit_code == 1 and fast.aborted and not (tmp_path / "fast" / "chexpercept.json").exists()


def test_chexmask_table_cxas_rosalia_review_sheets_and_flat_pngs(tmp_path):
    import shutil

    sources = synthesize_sources(
        tmp_path / "src",
        per_cell=1,
        seed=7,
        lesions=("opacity",),
        anatomy_format="chexmask-csv",
        with_cxas=True,
        progress=False,
    )
    ils = json.loads((sources / "mimic-ils" / "mimic_ils_instruction_answer.json").read_text())["train"]
    keys = [
        f"opacity_{p['pair_id']}"
        for s in ils.values()
        for p in s["instruction_answer_pairs"]["positive_pairs"]
        + s["instruction_answer_pairs"]["negative_pairs"]
    ]
    rejected = keys[-1]  # a negative: the LF cell has a spare
    sheet = tmp_path / "labeling_sheet.csv"
    sheet.write_text("key_id,optimal?\n" + "".join(f"{k},{'' if k == rejected else 'y'}\n" for k in keys))
    # the reference's ROSALIA predictions as lesion masks: 1024 x 1024 RGB 0/255 (torchvision save_image)
    rosalia = tmp_path / "rosalia_pred"
    for s in ils.values():
        for p in s["instruction_answer_pairs"]["positive_pairs"]:
            m = _mask(sources / "mimic-ils" / "lesion_mask" / p["seg_mask_path"])
            (rosalia / "opacity" / p["pair_id"]).mkdir(parents=True)
            rgb = np.repeat((m.astype(np.uint8) * 255)[:, :, None], 3, axis=2)
            Image.fromarray(rgb).save(rosalia / "opacity" / p["pair_id"] / "pred_mask.png")
    shutil.rmtree(sources / "mimic-ils" / "lesion_mask")  # only the predictions can be used now
    flat = tmp_path / "png"
    flat.mkdir()
    for s in ils.values():
        jpg = sources / "mimic-cxr-jpg" / "files" / s["image_path"]
        Image.open(jpg).convert("RGB").resize((1024, 1024), Image.Resampling.LANCZOS).save(
            flat / f"{s['dicom_id']}.png"
        )
    config = GenerateConfig(
        out=str(tmp_path / "out"),
        per_cell=1,
        cxr_png=str(flat),
        mimic_ils=str(sources / "mimic-ils"),
        anatomy=str(sources / "anatomy" / "MIMIC-CXR-JPG.csv"),
        cxas=str(sources / "cxas"),
        rosalia_pred=str(rosalia),
        review=[str(sheet)],
        lesions=["opacity"],
        partition="corrected",
        neutral_option_names=True,
        progress=False,
    )
    report = generate(config)
    assert report.exit_code == 0, report.text()
    entries = json.loads((tmp_path / "out" / "chexpercept.json").read_text())
    assert len(entries) == 3 and rejected not in entries
    assert f"1 of {len(keys)} candidate pairs not accepted by the review sheets" in report.text()
    assert all(e["provenance"]["reviewed"] is True for e in entries.values())
    for key, e in entries.items():
        # the flat 1024 PNG passes through byte for byte
        assert (tmp_path / "out" / "chexpercept" / key / "detection_qa" / "xray.png").read_bytes() == (
            flat / f"{e['dicom_id']}.png"
        ).read_bytes()
        rr = e.get("contour_qa", {}).get("contour_revision_qa_revision_result")
        if rr and not e["contour_qa"]["no_deformation"]:
            assert all(
                o["relative_path"] == f"option_{i}_mask.png" for i, o in enumerate(rr["answer_options"], 1)
            )
    read_bundle(tmp_path / "out", check_images="full")


def test_cli_synth_sources_then_generate_and_clear_errors(tmp_path, capsys):
    from chexpercept.cli import main

    src = tmp_path / "src"
    assert (
        main(
            [
                "synth-sources",
                "--output-dir",
                str(src),
                "--per-cell",
                "1",
                "--seed",
                "2",
                "--lesions",
                "cardiomegaly",
            ]
        )
        == 0
    )
    assert (src / "mimic-ils" / "PHANTOM_DATA.txt").is_file()
    args = [
        "generate",
        "--mimic-cxr-jpg", str(src / "mimic-cxr-jpg"),
        "--mimic-ils", str(src / "mimic-ils"),
        "--anatomy", str(src / "anatomy"),
        "--output-dir", str(tmp_path / "bundle"),
        "--per-cell", "1",
        "--lesions", "cardiomegaly",
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "wrote 3 cases" in out and "phantom data" in out and "unreviewed" in out
    assert len(read_bundle(tmp_path / "bundle")) == 3
    bad = ["generate", "--mimic-cxr-jpg", str(src / "mimic-cxr-jpg"), "--mimic-ils", str(tmp_path / "nope")]
    assert (
        main(
            [*bad, "--anatomy", str(src / "anatomy"), "--output-dir", str(tmp_path / "b2"), "--per-cell", "1"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert str(tmp_path / "nope") in err and "mimic_ils_instruction_answer.json" in err
    assert (
        main([*args[:7], "--output-dir", str(tmp_path / "b4"), "--per-cell", "1", "--deformer", "sam3"]) == 2
    )
    assert "--sam3-checkpoint" in capsys.readouterr().err
    sam3_args = ["--deformer", "sam3", "--sam3-checkpoint", str(tmp_path / "no-model")]
    assert main([*args[:7], "--output-dir", str(tmp_path / "b5"), "--per-cell", "1", *sam3_args]) == 2
    assert "no-model" in capsys.readouterr().err
    missing_anatomy = [
        *args[:5],
        "--anatomy",
        str(tmp_path / "no-anatomy"),
        "--output-dir",
        str(tmp_path / "b3"),
        "--per-cell",
        "1",
    ]
    assert main(missing_anatomy) == 2
    assert "no-anatomy" in capsys.readouterr().err


def test_generate_options_from_a_yaml_config(tmp_path):
    import argparse

    from chexpercept.builder.cmd_generate import build_config, configure

    config_file = tmp_path / "regen.yaml"
    config_file.write_text(
        "mimic-cxr-jpg: /data/mimic-cxr-jpg\nmimic_ils: /data/mimic-ils\nanatomy: /data/chexmask\n"
        "per-cell: 100\ndeformer: sam3\nsam3-checkpoint: /models/sam3\nreview: /data/sheet.csv\n"
    )
    parser = argparse.ArgumentParser()
    configure(parser)
    config = build_config(
        parser.parse_args(["--config", str(config_file), "--output-dir", "/tmp/x", "--num-proc", "4"])
    )
    assert (config.mimic_cxr_jpg, config.mimic_ils, config.anatomy) == (
        "/data/mimic-cxr-jpg",
        "/data/mimic-ils",
        "/data/chexmask",
    )
    assert (config.per_cell, config.deformer, config.sam3_checkpoint, config.num_proc) == (
        100,
        "sam3",
        "/models/sam3",
        4,
    )
    assert config.review == ["/data/sheet.csv"] and config.seed == 0 and config.partition == "reference"
    config_file.write_text("per-cell: 1\nout: /tmp/x\nbogus: 1\n")
    with pytest.raises(Exception, match="bogus"):
        build_config(parser.parse_args(["--config", str(config_file)]))
    # a value of another type is named with the option, never a TypeError later (final red team)
    from chexpercept.builder.sources import SourceError

    for text, said in (
        ('seed: "7"', "--seed in --config"),
        ("seed: [1]", "--seed in --config"),
        ("per-cell: true", "per-cell"),
    ):
        config_file.write_text(f"out: /tmp/x\nper-cell: 1\n{text}\n")
        with pytest.raises(SourceError, match=said):
            build_config(parser.parse_args(["--config", str(config_file)]))
