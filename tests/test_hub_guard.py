"""The upload guard is an allow-list: patient-derived shapes a deny-list let through are refused, each
naming the file and the reason, and nothing reaches the (loopback) Hub.

The bundle here has MIMIC-shaped identifiers: dicom ids of five 8-hex groups (one group all digits),
study ids inside the pair ids, subject ids in each entry's provenance.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import urllib.parse
from pathlib import Path

import numpy
import pytest
from fake_hub import FakeHub
from huggingface_hub import constants

from chexpercept.eval.run import main as run_main
from chexpercept.metrics.hub.guard import Manifest, PushRefused, check_file
from chexpercept.metrics.hub.identifiers import Identifiers
from chexpercept.metrics.hub.push_results import Staged, stage, upload
from chexpercept.testing import write_fixture_bundle

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(64))


def _dicom(i: int) -> str:
    """A MIMIC-shaped dicom id: five groups of 8 hex digits, each with a letter and a digit (case 0's
    third group is made of digits only)."""
    groups = []
    for k in range(5):
        g = f"{(0x9E3779B1 * (i + 1) * (k + 3)) & 0xFFFFFFFF:08x}"
        g = g if any(c.isalpha() for c in g) else "a" + g[1:]
        g = g if any(c.isdigit() for c in g) else g[:-1] + "7"
        groups.append(g)
    if i == 0:
        groups[2] = "34567890"
    return "-".join(groups)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    root = write_fixture_bundle(tmp_path_factory.mktemp("guard") / "bundle", per_cell=1, seed=3)
    data = json.loads((root / "chexpercept.json").read_text())
    for i, entry in enumerate(data.values()):
        entry["dicom_id"] = _dicom(i)
        entry["provenance"]["subject_id"] = f"p{10000032 + i}"
    (root / "chexpercept.json").write_text(json.dumps(data, indent=2))
    return root


@pytest.fixture(scope="module")
def entries(bundle) -> dict:
    return json.loads((bundle / "chexpercept.json").read_text())


@pytest.fixture(scope="module")
def case(entries) -> dict:
    """The identifiers of one positive case: key_id, pair id, study id, dicom id, subject id."""
    key = next(k for k in entries if "_positive_" in k and not k.startswith("cardiomegaly"))
    e = entries[key]
    return {
        "key_id": key,
        "pair_id": e["pair_id"],
        "study": e["pair_id"].split("_")[0],
        "dicom_id": e["dicom_id"],
        "subject": e["provenance"]["subject_id"],
        "digit_dicom_part": entries[next(iter(entries))]["dicom_id"].split("-")[2],
    }


@pytest.fixture(scope="module")
def runs(bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("guard-runs") / "runs"
    for model in ("baseline:oracle", "baseline:random"):  # the random one's scores are real fractions
        for oracle in ("none", "implicit"):
            args = ["--data-dir", str(bundle), "--model", model, "--oracle", oracle]
            assert run_main([*args, "--output-dir", str(out), "--no-progress", "--no-score"]) == 0
    return out


@pytest.fixture(scope="module")
def staged(runs, tmp_path_factory) -> Staged:
    return stage(runs, tmp_path_factory.mktemp("guard-staged") / "staging", bootstrap=5, repo="org/scores")


@pytest.fixture(scope="module")
def hub_server():
    server = FakeHub().start()
    yield server
    server.stop()


@pytest.fixture
def hub(hub_server, monkeypatch):
    """The loopback Hub, online, with no request seen yet."""
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub_server.requests.clear()
    return hub_server


def restage(staged: Staged, folder: Path, rel: str, change) -> Staged:
    """The same files written through a new manifest, ``rel`` changed by ``change(text)``: what a
    stager that leaked the shape would have written (so the schema and identifier checks decide)."""
    manifest = Manifest(folder, staged.manifest.context)
    for f in staged.files:
        text = (staged.folder / f).read_text()
        manifest.write(f, change(text) if f == rel else text, staged.manifest.staged[f].schema)
    return Staged(manifest.root, staged.models, manifest.files, manifest)


def refused(hub: FakeHub, leaky: Staged) -> str:
    with pytest.raises(PushRefused) as e:
        upload(leaky, "org/scores")
    assert hub.requests == [], "the Hub was contacted before the guard refused"
    assert "PhysioNet" in str(e.value)
    return str(e.value)


def _json_edit(path: str, value):
    """A change of a JSON file: set the dotted ``path`` to ``value`` (keys created as needed)."""

    def change(text: str) -> str:
        data = json.loads(text)
        *parents, last = path.split(".")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    return change


def _append(line: str):
    return lambda text: text + line + "\n"


def _shapes(c: dict) -> list[tuple[str, str, object, str]]:
    key, study_digits = c["key_id"], c["study"][1:]
    b64 = base64.b64encode(key.encode()).decode()
    b64url = base64.urlsafe_b64encode(("  " + key + "?>").encode()).decode().rstrip("=")
    jpeg_url = base64.urlsafe_b64encode(JPEG).decode()
    row = "| baseline-oracle | {} | 1.0 |"
    return [
        # (name, file, change, what the refusal must say)
        (
            "dicom id as a string field",
            "models/baseline-oracle/metrics.json",
            _json_edit("model", c["dicom_id"]),
            "a dicom_id of the bundle",
        ),
        (
            "study id in a markdown line",
            "tables/table2.md",
            _append(f"Study {c['study']} was hard."),
            "study id",
        ),
        (
            "study id as a JSON number",
            "models/baseline-oracle/metrics.json",
            _json_edit("flat.e2e/stage1/all", int(study_digits)),
            "the number is a study id",
        ),
        (
            "dicom id part as a JSON number",
            "models/baseline-oracle/intervals.json",
            _json_edit("values.sub/location", [0.5, int(c["digit_dicom_part"])]),
            "the number is a part of a dicom_id",
        ),
        (
            "pair id in a CSV cell",
            "leaderboard.csv",
            lambda t: t.replace("baseline-oracle", c["pair_id"], 1),
            "pair_id",
        ),
        (
            "key_id upper case in the card",
            "README.md",
            _append(f"Hardest case: {key.upper()}"),
            "a key_id of the bundle",
        ),
        (
            "key_id with other separators as a row label",
            "tables/table8.md",
            _append(row.format(key.replace("_", " - "))),
            "a key_id of the bundle",
        ),
        (
            "key_id hex-encoded",
            "models/baseline-oracle/metrics.json",
            _json_edit("model", key.encode().hex()),
            "hex-encoded",
        ),
        ("key_id base64", "models/baseline-oracle/metrics.json", _json_edit("model", b64), "base64-encoded"),
        ("key_id base64url, off alignment", "leaderboard.md", _append(f"ref x{b64url}"), "base64-encoded"),
        (
            "key_id percent-encoded",
            "README.md",
            _append("".join(f"%{b:02X}" for b in key.encode())),
            "percent-encoded",
        ),
        (
            "key_id split across two CSV cells",
            "tables/table2.csv",
            _append(f"{key[:9]},{key[9:]},1.0"),
            "a key_id of the bundle",
        ),
        (
            "base64url JPEG in a JSON string",
            "models/baseline-oracle/metrics.json",
            _json_edit("model", jpeg_url),
            "JPEG bytes in base64",
        ),
        (
            "raw replies under another key",
            "models/baseline-oracle/metrics.json",
            _json_edit("answers", ["Yes", "(2) No", "red point"]),
            "answers: a key the stager does not write",
        ),
        (
            "raw reply as a paragraph",
            "README.md",
            _append("The model answered: there is a small effusion on the left."),
            "a line the stager does not write",
        ),
        ("subject id in the card", "README.md", _append(f"Patient {c['subject']}."), "subject_id"),
        (
            "key_id as HTML entities",
            "tables/table3.md",
            _append("".join(f"&#{ord(ch)};" for ch in key)),
            "as HTML entities",
        ),
        (
            "key_id hex with separators",
            "tables/table9.md",
            _append(":".join(f"{b:02x}" for b in key.encode())),
            "hex-encoded",
        ),
        (
            "key_id in full-width letters with a zero-width space",
            "tables/table10.md",
            _append("\u200b".join(key.upper().translate({i: i + 0xFEE0 for i in range(0x21, 0x7F)}))),
            "a key_id of the bundle",
        ),
        (
            "base64 of a percent-encoded key_id",
            "tables/table11.md",
            _append(base64.b64encode(urllib.parse.quote(key, safe="").replace("_", "%5F").encode()).decode()),
            "base64-encoded",
        ),
        (
            "a duplicated JSON key hiding a reply",
            "models/baseline-oracle/metrics.json",
            lambda t: t.replace(
                '{\n  "bundle_fingerprint"', '{\n  "model": "the model said yes",\n  "bundle_fingerprint"', 1
            ),
            "appears twice",
        ),
        (
            "a CSV cell with a line break",
            "leaderboard.csv",
            lambda t: t.replace("baseline-oracle", '"baseline-oracle\nthe reply"', 1),
            "row 2",
        ),
        (
            "a dicom id split across two table cells",
            "tables/table2.md",
            _append(row.format(c["dicom_id"][:17]).replace(" 1.0 ", " " + c["dicom_id"][18:] + " ")),
            "dicom_id",
        ),
    ]


_EXAMPLE = {
    "key_id": "edema_s50000001_positive_0",
    "pair_id": "s50000001_positive_0",
    "study": "s50000001",
    "dicom_id": "a1b2c3d4-a1b2c3d4-34567890-a1b2c3d4-a1b2c3d4",
    "subject": "p10000032",
    "digit_dicom_part": "34567890",
}
SHAPE_NAMES = [s[0] for s in _shapes(_EXAMPLE)]


def test_clean_staging_passes_the_guard(staged):
    files = staged.verify()
    assert list(files) == staged.files and len(files) == 47
    assert all(data for data in files.values())


@pytest.mark.parametrize("name", SHAPE_NAMES)
def test_each_patient_derived_shape_is_refused(name, staged, case, hub, tmp_path):
    shape = next(s for s in _shapes(case) if s[0] == name)
    _, rel, change, reason = shape
    leaky = restage(staged, tmp_path / "staging", rel, change)
    msg = refused(hub, leaky)
    print(msg)
    lines = [line for line in msg.splitlines() if line.strip().startswith(rel + ":")]
    assert lines, f"{rel} not named:\n{msg}"
    assert any(reason in line for line in lines), f"expected {reason!r} for {rel}:\n{msg}"


def _copy(staged: Staged, tmp_path: Path) -> Staged:
    return restage(staged, tmp_path / "staging", "", lambda t: t)


def test_a_file_added_after_staging_is_refused(staged, hub, tmp_path):
    s = _copy(staged, tmp_path)
    (s.folder / "notes.md").write_text("| 50.0 | 12.3 |\n")  # harmless text, but not the stager's
    (s.folder / "models" / "extra.json").write_text("{}\n")
    msg = refused(hub, s)
    assert (
        "notes.md: not written by the stager" in msg and "models/extra.json: not written by the stager" in msg
    )


def test_png_bytes_renamed_csv_are_refused(staged, hub, tmp_path):
    s = _copy(staged, tmp_path)
    (s.folder / "tables" / "table12.csv").write_bytes(PNG)
    (s.folder / "leaderboard.csv").write_bytes(PNG)
    msg = refused(hub, s)
    assert "tables/table12.csv: not written by the stager" in msg
    assert "leaderboard.csv: changed after staging" in msg
    assert check_file(PNG, staged.manifest.staged["leaderboard.csv"].schema, staged.manifest.context) == [
        "PNG bytes, not a .csv file the stager writes"
    ]


def test_links_in_the_staging_folder_are_refused(staged, runs, hub, tmp_path):
    s = _copy(staged, tmp_path)
    results = runs / "baseline-oracle" / "oracle_none" / "results.jsonl"
    os.symlink(results, s.folder / "results.csv")
    os.symlink(runs / "baseline-oracle", s.folder / "runs")
    (s.folder / "tables" / "table2.md").unlink()
    os.symlink(results, s.folder / "tables" / "table2.md")
    msg = refused(hub, s)
    assert "results.csv: a link" in msg and "runs: a link to a folder" in msg
    assert "tables/table2.md: a link" in msg


def test_a_staged_file_changed_or_removed_after_staging_is_refused(staged, case, hub, tmp_path):
    s = _copy(staged, tmp_path)
    metrics = s.folder / "models" / "baseline-oracle" / "metrics.json"
    metrics.write_text(metrics.read_text().replace('"model"', f'"note": "{case["key_id"]}",\n  "model"'))
    (s.folder / "tables" / "table3.csv").unlink()
    msg = refused(hub, s)
    assert "models/baseline-oracle/metrics.json: changed after staging" in msg
    assert "tables/table3.csv: staged but missing" in msg


@pytest.mark.parametrize(
    "field, value",
    [
        ("display_name", "{key_id}"),
        ("model", "{key_id}"),
        ("model_id", "org/finetuned-on-{dicom_id}"),
        ("backend", "{study}"),
    ],
)
def test_a_run_setting_holding_an_identifier_is_never_published(runs, case, field, value, hub, tmp_path):
    """A model's names come from the registry, the baselines or the user's --name, never from its run
    folder: a display name holding a key_id is not published at all; a model id that is neither is
    refused before staging, saying how to name the model; any other setting is refused by its schema."""
    from chexpercept.metrics.hub.names import NameRefused

    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    for run_json in copy.glob("*/oracle_*/run.json"):
        meta = json.loads(run_json.read_text())
        meta[field] = value.format(**case)
        run_json.write_text(json.dumps(meta))
    if field == "model_id":
        with pytest.raises(NameRefused, match="--name baseline-oracle=LABEL"):
            stage(copy, tmp_path / "staging", bootstrap=0, repo="org/scores")
        return
    s = stage(copy, tmp_path / "staging", bootstrap=0, repo="org/scores")
    if field in ("display_name", "model"):
        files = s.verify()
        assert not any(case["key_id"].encode() in data for data in files.values())
        return
    msg = refused(hub, s)
    assert "of the bundle" in msg and "run_oracle_none.json" in msg


def test_the_stager_needs_the_bundle_to_check_identifiers(runs, tmp_path):
    copy = tmp_path / "runs"
    shutil.copytree(runs, copy)
    for run_json in copy.glob("*/oracle_*/run.json"):
        meta = json.loads(run_json.read_text())
        meta["bundle"]["path"] = str(tmp_path / "gone")
        run_json.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="not on this disk.*--data-dir"):
        stage(copy, tmp_path / "staging", bootstrap=0)
    other = write_fixture_bundle(tmp_path / "other", per_cell=1, seed=9)
    with pytest.raises(ValueError, match="not the one the runs were made on"):
        stage(copy, tmp_path / "staging2", bootstrap=0, bundle=other)


def test_identifiers_are_found_in_every_form_and_scores_are_not(entries, case):
    ids = Identifiers.from_entries(entries)
    key = case["key_id"]
    for text in (
        key,
        key.upper().replace("_", "."),
        base64.b64encode(key.encode()).decode(),
        base64.urlsafe_b64encode(key.encode()).decode(),
        key.encode().hex().upper(),
        urllib.parse.quote(key.replace("_", " ")),
        case["study"].upper(),
        f"study {case['study'][1:]}",
        case["subject"],
        case["dicom_id"].replace("-", ""),
        case["dicom_id"].split("-")[1],
        # a study or subject id as a number in another base (a --name label can carry one)
        f"model-{int(case['study'][1:]):x}",
        "v-" + numpy.base_repr(int(case["subject"].lstrip("p")), 36).lower(),
        numpy.base_repr(int(case["study"][1:]), 32).lower() + "-vlm",
    ):
        assert ids.find(text) is not None, text
    for text in (
        "| baseline-oracle | 50.0 [45.2, 55.1] | 0.0 (+0.5) | 72.0 | 4.00 |",
        "e2e,1,baseline-oracle,0.619048,0.5,0.500007,1.0,3.25,2.0,1.0",
        "eb4aca1c0c41f7b30df480d1f00210aeedf04e0f28d71206aeacbfaa2cd8db32",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "oracle_passed",
    ):
        assert ids.find(text) is None, text
