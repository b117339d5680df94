"""run.json as a typed record: validation errors name the file and the field; writing keeps the JSON."""

import json

import pytest

from chexpercept.metrics import load_run
from chexpercept.metrics.discovery import discover_runs
from chexpercept.metrics.simulate import fixture_cases, simulate_records
from chexpercept.run_metadata import BundleInfo, RunMetadata, RunMetadataError, SamplingInfo, Selection

#: run.json as the runner writes it after a resumed, finished session (keys in the runner's order)
WRITTEN = {
    "model": "m",
    "display_name": "M",
    "model_id": "org/m",
    "backend": "openai",
    "oracle": "none",
    "parse_mode": "reference",
    "sampling": {"temperature": None, "top_p": 1.0, "max_tokens": 64, "greedy": False},
    "seed": 0,
    "chat_template_kwargs": {},
    "bundle": {"path": "/b", "fingerprint": "f" * 64, "synthetic": True, "n_cases": 42},
    "selection": {"lesions": ["nodule"], "paths": None, "per_cell": None, "limit": 3, "n_selected": 3},
    "batch_size": 8,
    "num_processes": 1,
    "versions": {"python": "3.11"},
    "git_commit": None,
    "command": ["chexpercept", "run"],
    "started": "2026-01-01T00:00:00+0000",
    "settings": {"model_id": "org/m", "seed": 0},
    "resumed": ["2026-01-02T00:00:00+0000"],
    "finished": None,
    "unfinished_cases": 1,
    "backend_settings": {"base_url": "http://x"},
    "n_results": 2,
    "last_session": {"cases": 1, "model_calls_main_process": 5},
}


def test_round_trip_keeps_keys_order_and_values():
    meta = RunMetadata.from_json(WRITTEN)
    assert meta.sampling == SamplingInfo(temperature=None, top_p=1.0, max_tokens=64, greedy=False)
    assert meta.selection == Selection(lesions=["nodule"], paths=None, per_cell=None, limit=3, n_selected=3)
    assert meta.bundle.fingerprint == "f" * 64 and meta.resumed == ["2026-01-02T00:00:00+0000"]
    assert json.dumps(meta.to_json()) == json.dumps(WRITTEN)


def test_unknown_keys_are_kept_and_missing_fields_are_none(tmp_path):
    meta = RunMetadata.from_json({"model": "m", "new_field": [1]})
    assert meta.oracle is None and meta.sampling is None and meta.bundle is None
    assert meta.to_json() == {"model": "m", "git_commit": None, "finished": None, "new_field": [1]}
    assert RunMetadata().provider is None


def test_a_file_is_read_and_named_in_errors(tmp_path):
    path = tmp_path / "runs" / "x" / "oracle_none" / "run.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**WRITTEN, "sampling": {"temperature": "hot"}}))
    with pytest.raises(RunMetadataError) as e:
        RunMetadata.from_json(path)
    assert str(e.value) == f"{path}: field 'sampling.temperature' must be a number, got 'hot'"
    path.write_text("{not json")
    with pytest.raises(RunMetadataError, match=r"run\.json: not valid JSON"):
        RunMetadata.from_json(path)
    path.write_text("[1, 2]")
    with pytest.raises(RunMetadataError, match="the top level must be a JSON object, got"):
        RunMetadata.from_json(path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model", 3, "field 'model' must be a string, got 3"),
        ("seed", 1.5, "field 'seed' must be a whole number from 0, got 1.5"),
        ("seed", True, "field 'seed' must be a whole number from 0, got True"),
        ("n_results", -3, "field 'n_results' must be a whole number from 0, got -3"),  # red team, stop 44
        ("bundle", "b", "field 'bundle' must be a JSON object, got 'b'"),
        ("bundle", {"synthetic": "yes"}, "field 'bundle.synthetic' must be true or false, got 'yes'"),
        ("selection", {"lesions": ["a", 1]}, "field 'selection.lesions' must be a list of strings"),
        ("sampling", {"greedy": 0}, "field 'sampling.greedy' must be true or false, got 0"),
        ("command", "run", "field 'command' must be a list of strings, got 'run'"),
        ("versions", [], "field 'versions' must be an object of package names and PEP 440 versions, got []"),
    ],
)
def test_wrong_types_name_the_source_and_the_field(field, value, message):
    with pytest.raises(RunMetadataError) as e:
        RunMetadata.from_json({**WRITTEN, field: value}, source="runs/x/oracle_none/run.json")
    assert str(e.value).startswith(f"runs/x/oracle_none/run.json: {message}")


def test_scorer_and_report_refuse_a_malformed_run_json(tmp_path):
    folder = tmp_path / "m" / "oracle_none"
    folder.mkdir(parents=True)
    records = simulate_records(fixture_cases(per_cell=1), lambda case, turn: True, oracle="none")
    (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    (folder / "run.json").write_text(json.dumps({"model": "m", "oracle": "none", "bundle": {"n_cases": "4"}}))
    expected = f"{folder / 'run.json'}: field 'bundle.n_cases' must be a whole number from 0, got '4'"
    with pytest.raises(ValueError, match="bundle.n_cases"):
        load_run(folder)
    with pytest.raises(ValueError) as e:
        discover_runs(tmp_path)
    assert str(e.value) == expected
    (folder / "run.json").write_text(json.dumps({"model": "m", "oracle": "none"}))
    run = load_run(folder)
    assert run.meta.bundle is None and run.fingerprint is None
    assert any("no 'bundle' field" in n for n in run.notes)


def test_a_record_built_in_code_writes_only_what_was_set():
    meta = RunMetadata(model="m", bundle=BundleInfo(fingerprint="a"))
    assert meta.to_json() == {
        "model": "m",
        "bundle": {"fingerprint": "a"},
        "git_commit": None,
        "finished": None,
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("git_commit", "0123abc\x1b[2J\nOK: published"),
        ("git_commit", "see https://evil.example/" + "a" * 40),
        ("versions", {"torch": "2.6.0 <img src=x onerror=alert(1)>"}),
        ("versions", {"torch\nOK": "2.6.0"}),
        ("started", "yesterday, by edema_s50000001_positive_0"),
        ("finished", "2026-01-01T00:00:00Z\x1b]0;title\x07"),
        ("resumed", ["2026-01-02", "free text"]),
        ("weights", {"model_id": "org/m", "commit": "main; rm -rf"}),
    ],
    ids=[
        "commit-escapes",
        "commit-url",
        "version-html",
        "package-newline",
        "started",
        "finished",
        "resumed",
        "weights",
    ],
)
def test_format_fields_are_read_by_their_shape(tmp_path, field, value):
    """Issue 27 red team #13: a tampered run.json's format fields (commit, versions, times) are a
    channel into reports and cards: they are refused on read, naming the file and the field, and the
    message shows the value escaped (one line, no control codes)."""
    path = tmp_path / "runs" / "x" / "oracle_none" / "run.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**WRITTEN, field: value}))
    with pytest.raises(RunMetadataError) as e:
        RunMetadata.from_json(path)
    message = str(e.value)
    assert message.startswith(f"{path}: field '{field}' must be ") and "\n" not in message
    assert "\x1b" not in message and "\x07" not in message
    # what the runner itself writes passes
    real = {"git_commit": "a" * 40 + "-dirty", "versions": {"python": "3.12.3", "torch": "2.6.0+cu124"}}
    assert RunMetadata.from_json({**WRITTEN, **real}).git_commit == "a" * 40 + "-dirty"
