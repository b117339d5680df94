"""Issue 27 item 7a: JSON nested 200,000 levels deep, wherever the toolkit reads JSON it did not write
(chexpercept.json, results.jsonl, failures.jsonl, run.json, the reference's all_results.json, review
decisions and request bodies, the MIMIC-ILS JSON, a server's replies, a JSON option), ends in an error
naming the file or the source and the depth limit (chexpercept.input_json.MAX_DEPTH), never in a
RecursionError traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from chexpercept.cli import main as cli
from chexpercept.eval.run import main as run_main
from chexpercept.testing import write_fixture_bundle

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeServer

DEEP = "[" * 200_000 + "]" * 200_000
SAID = "nested more than 100 levels deep"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("deep")
    bundle = write_fixture_bundle(root / "bundle", per_cell=1, seed=6)
    args = ["--data-dir", str(bundle), "--model", "baseline:oracle", "--oracle", "none"]
    assert run_main([*args, "--output-dir", str(root / "runs"), "--no-progress", "--no-score"]) == 0
    return root


@pytest.fixture
def work(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "w")
    return tmp_path / "w"


def clean_error(err: str) -> None:
    assert "Traceback" not in err and "RecursionError" not in err, err[-2000:]
    assert SAID in err, err[-2000:]


def deep_bundle(bundle: Path) -> str:
    """chexpercept.json with one entry's value nested 200,000 levels deep (the issue's shape)."""
    text = (bundle / "chexpercept.json").read_text()
    key = next(iter(json.loads(text)))
    entries = json.loads(text)
    entries[key]["provenance"] = "DEEP"
    (bundle / "chexpercept.json").write_text(json.dumps(entries).replace('"DEEP"', DEEP))
    return key


@pytest.mark.parametrize("command", ["validate", "inspect", "run"])
def test_a_bundle_nested_200000_levels_deep_is_a_bundle_error(work, command, capsys):
    bundle = str(work / "bundle")
    deep_bundle(work / "bundle")
    args = {
        "validate": ["validate", bundle],
        "inspect": ["inspect", bundle],
        "run": ["run", "--data-dir", bundle, "--model", "baseline:random", "--output-dir", str(work / "r")],
    }[command]
    rc = cli(args + (["--no-progress"] if command == "run" else []))
    err = capsys.readouterr().err
    assert rc in (1, 2)
    clean_error(err)
    assert "chexpercept.json: JSON nested more than 100 levels deep" in err


def test_load_dataset_names_the_file(work):
    import datasets

    from chexpercept.errors import BundleValidationError

    deep_bundle(work / "bundle")
    with pytest.raises(BundleValidationError, match=f"chexpercept.json: JSON {SAID}"):
        datasets.load_dataset("chexpercept", data_dir=str(work / "bundle"), cache_dir=str(work / "cache"))


def _run_folder(work: Path) -> Path:
    return work / "runs" / "baseline-oracle" / "oracle_none"


@pytest.mark.parametrize("name", ["results.jsonl", "failures.jsonl", "run.json"])
def test_score_and_report_name_a_deep_run_file(work, name, capsys):
    path = _run_folder(work) / name
    if name == "run.json":
        meta = json.loads(path.read_text())
        meta["backend_settings"] = "DEEP"
        path.write_text(json.dumps(meta).replace('"DEEP"', DEEP))
    else:
        with open(path, "a") as f:
            f.write(DEEP + "\n")
    for args in (
        ["score", str(work / "runs"), "--data-dir", str(work / "bundle")],
        ["report", str(work / "runs"), "--data-dir", str(work / "bundle"), "--output-dir", str(work / "rep")],
    ):
        rc = cli(args + (["--bootstrap", "0", "--no-plots"] if args[0] == "report" else []))
        err = capsys.readouterr().err
        assert rc == 2, err
        clean_error(err)
        assert str(path) in err


def test_resume_names_a_deep_results_line(work, capsys):
    with open(_run_folder(work) / "results.jsonl", "a") as f:
        f.write(DEEP + "\n")
    args = ["--data-dir", str(work / "bundle"), "--model", "baseline:oracle", "--oracle", "none"]
    rc = cli(["run", *args, "--output-dir", str(work / "runs"), "--no-progress", "--no-score"])
    err = capsys.readouterr().err
    assert rc == 2
    clean_error(err)


def test_a_deep_reference_all_results_is_named(work, capsys):
    folder = work / "reference" / "opensource_x" / "oracle_implicit"
    folder.mkdir(parents=True)
    (folder / "all_results.json").write_text(DEEP)
    rc = cli(["score", str(folder / "all_results.json"), "--data-dir", str(work / "bundle")])
    err = capsys.readouterr().err
    assert rc == 2
    clean_error(err)
    assert "all_results.json" in err


def test_push_results_names_a_deep_bundle(work, capsys):
    """The guard reads the bundle's identifiers (the runs' run.json record no fingerprint here)."""
    deep_bundle(work / "bundle")
    for run_json in (work / "runs").glob("*/oracle_*/run.json"):
        meta = json.loads(run_json.read_text())
        meta["bundle"]["fingerprint"] = None
        run_json.write_text(json.dumps(meta))
    rc = cli(
        [
            "push-results",
            str(work / "runs"),
            "--repo",
            "org/scores",
            "--dry-run",
            "--data-dir",
            str(work / "bundle"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    clean_error(err)


def test_review_decisions_and_request_bodies_nested_deeply(tmp_path):
    from chexpercept.builder.review.server import RequestError, parse_decision
    from chexpercept.builder.review.store import StoreError, read_decisions

    path = tmp_path / "ann1.jsonl"
    path.write_text(json.dumps({"key_id": "k", "decision": "accept"}) + "\n" + DEEP + "\n")
    with pytest.raises(StoreError, match=f"line 2: not a JSON decision .*{SAID}"):
        read_decisions(path)
    with pytest.raises(RequestError, match=SAID) as e:
        parse_decision(("[" * 60_000 + "]" * 60_000).encode())
    assert e.value.status == 400


def test_generate_names_a_deep_mimic_ils_json(tmp_path, capsys):
    from chexpercept.builder.sources import ILS_JSON
    from chexpercept.builder.synth_sources import synthesize_sources

    src = synthesize_sources(tmp_path / "src", per_cell=1, lesions=("effusion",), progress=False)
    (src / "mimic-ils" / ILS_JSON).write_text('{"train": ' + DEEP + "}")
    rc = cli(
        [
            *(
                "generate",
                "--mimic-cxr-jpg",
                str(src / "mimic-cxr-jpg"),
                "--mimic-ils",
                str(src / "mimic-ils"),
            ),
            *("--anatomy", str(src / "anatomy"), "--lesions", "effusion", "--per-cell", "1"),
            *("--output-dir", str(tmp_path / "out"), "--no-progress"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    clean_error(err)
    assert ILS_JSON in err


def test_a_deep_server_reply_fails_that_case_named(fixture_bundle, tmp_path, capsys):
    """A loopback API answering with JSON nested 200,000 levels deep: the case is recorded as
    unfinished with the reason; the run goes on and ends cleanly."""
    with FakeServer(failures=[{"raw": DEEP.encode()}] * 2) as server:
        args = ["--data-dir", str(fixture_bundle), "--model", "gpt-5.4", "--backend", "openai"]
        args += ["--base-url", server.url, "--oracle", "none", "--limit", "2", "--on-error", "record"]
        rc = run_main([*args, "--output-dir", str(tmp_path / "runs"), "--no-progress", "--no-score"])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "Traceback" not in err and "RecursionError" not in err, err
    assert f"the reply of {server.url}/chat/completions: JSON {SAID}" in err


def test_a_deep_json_option_is_a_usage_error(fixture_bundle, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_main(
            [
                *("--data-dir", str(fixture_bundle), "--model", "baseline:random"),
                *("--chat-template-kwargs", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
            ]
        )
    err = capsys.readouterr().err
    assert e.value.code == 2
    clean_error(err)


def test_a_deep_error_body_is_read_as_no_hint():
    """An error body nested deeply (a 429 with a hostile body) gives no retry hint, and no traceback."""
    from chexpercept.eval.backends.openai.retries import retry_hint

    assert retry_hint({}, '{"error": ' + DEEP + "}") is None


def test_a_deep_hub_reply_is_a_leaderboard_error(monkeypatch, capsys):
    """huggingface_hub decodes the Hub's reply itself; JSON nested too deeply for it is named, not a
    traceback (the decoder's RecursionError is what such a reply raises inside it)."""
    from huggingface_hub import HfApi, constants

    def deep_reply(*args, **kwargs):
        return json.loads(DEEP)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "get_dataset_leaderboard", deep_reply)
    assert cli(["leaderboard", "org/bench"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "org/bench: the Hub's reply is JSON nested too deeply" in err


@pytest.mark.parametrize(
    "value,rank,said",
    [(float("inf"), 1, "the value inf, not a finite number"), (float("nan"), 1, "the value nan"),
     ("0.5", 1, "the value '0.5'"), (True, 1, "the value True"), (0.5, 0, "the rank 0, not a whole number")],
)  # fmt: skip
def test_a_hub_leaderboard_row_that_is_not_a_number_is_named(monkeypatch, capsys, value, rank, said):
    """A Hub row whose value was 1e400 (read as infinity) ended ``leaderboard`` in an OverflowError
    traceback, and ``--format json`` wrote ``Infinity`` (red team, stop 43): each row's value must be a
    finite number and its rank a whole number from 1, named otherwise."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi, constants

    row = SimpleNamespace(rank=rank, model_id="org/m", value=value, verified=False, filename="x.yaml",
                          notes=None, source=None, pull_request=None)  # fmt: skip
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(HfApi, "get_dataset_leaderboard", lambda *a, **k: [row])
    assert cli(["leaderboard", "org/bench"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"org/bench: entry 1 of the Hub's leaderboard has {said}" in err, err


def test_no_module_parses_json_itself():
    """Every JSON read from outside goes through chexpercept/input_json.py (bounded in size and depth):
    a new ``json.load``/``json.loads`` elsewhere fails here with its file and line."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    allowed = {
        "chexpercept/input_json.py": "the one bounded decoder",
        "metrics/hub/guard.py": "re-reads the bytes it staged itself, to check them",
        "eval/backends/options.py": "copies a default value it declared",
        "builder/reference_layout.py": "reads the phantom table it just wrote",
        "eval/tiny_model.py": "edits the processor file it just saved",
    }
    found = []
    for package in ("chexpercept", "builder", "metrics", "eval"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                f = getattr(node, "func", None)
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr in ("load", "loads")
                    and isinstance(f.value, ast.Name)
                    and f.value.id == "json"
                ):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, "parse JSON through chexpercept.input_json instead:\n" + "\n".join(found)
