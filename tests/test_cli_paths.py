"""Paths a user types: a typo says "no such folder" (and the nearest name) before anything else; a
runs folder is accepted where model folders are; one model folder however spelled; output folders
are named. Found by a new user's first hour (issue 23, item 6)."""

import json
import os

import pytest

from chexpercept.bundle import check_release_dir
from chexpercept.cli import main as cli
from chexpercept.errors import ReleaseNotFoundError, no_such_path
from chexpercept.metrics.simulate import fixture_cases, simulate_records


def test_a_typo_in_data_dir_names_the_nearest_folder_without_the_credentialing_text(tmp_path):
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "chexpercept.json").write_text("{}")
    with pytest.raises(ReleaseNotFoundError) as e:
        check_release_dir(tmp_path / "relase")
    message = str(e.value)
    assert "relase: no such folder (did you mean" in message and str(tmp_path / "release") in message
    assert "PhysioNet" not in message and len(message.splitlines()) == 1
    with pytest.raises(ReleaseNotFoundError, match="does not exist either") as e:
        check_release_dir(tmp_path / "gone" / "deeper" / "release")
    # no near name: one line, with where a release comes from (not the credentialing text)
    assert str(tmp_path / "gone") in str(e.value) and len(str(e.value).splitlines()) == 1
    assert "CITI" not in str(e.value)


def test_a_file_for_data_dir_names_its_folder(tmp_path):
    (tmp_path / "chexpercept.json").write_text("{}")
    with pytest.raises(ReleaseNotFoundError, match=f"pass its folder {tmp_path}") as e:
        check_release_dir(tmp_path / "chexpercept.json")
    assert "PhysioNet" not in str(e.value)


def test_a_folder_that_exists_but_is_no_release_gets_the_access_steps(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ReleaseNotFoundError, match="has no chexpercept.json") as e:
        check_release_dir(tmp_path)
    assert "PhysioNet" in str(e.value) and "CITI" in str(e.value)


def test_validate_and_load_dataset_say_no_such_folder(fixture_bundle, capsys):
    typo = str(fixture_bundle) + "x"
    assert cli(["validate", typo]) != 0
    err = capsys.readouterr().err
    assert "no such folder (did you mean" in err and "PhysioNet" not in err
    import datasets

    with pytest.raises(ReleaseNotFoundError, match="no such folder"):
        datasets.load_dataset("chexpercept", data_dir=typo)


def test_no_such_path_keeps_the_spelling_the_user_typed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-vlm").mkdir()
    assert no_such_path("./tiny-vlmm") == "./tiny-vlmm: no such folder (did you mean ./tiny-vlm?)"
    assert no_such_path("tiny-vlmm") == "tiny-vlmm: no such folder (did you mean tiny-vlm?)"
    assert no_such_path("zzz") == "zzz: no such folder"


def test_run_and_estimate_name_a_mistyped_model_folder(fixture_bundle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo" / "tiny-vlm").mkdir(parents=True)
    for command in ("run", "estimate"):
        args = [command, "--data-dir", str(fixture_bundle), "--model", "demo/tiny-vlmm", "--backend", "vllm"]
        assert cli(args) == 2
        err = capsys.readouterr().err
        assert "--model demo/tiny-vlmm: no such folder (did you mean demo/tiny-vlm?)" in err
        assert cli([command, "--data-dir", str(fixture_bundle), "--model", "./nothing-here"]) == 2
        assert "--model ./nothing-here: no such folder" in capsys.readouterr().err


def _runs_folder(root, models=("good", "poor")):
    cases = fixture_cases(per_cell=1, seed=0)
    for i, model in enumerate(models):
        folder = root / model / "oracle_none"
        folder.mkdir(parents=True)
        records = simulate_records(cases, lambda c, t, i=i: i == 0 or t.stage == 1, oracle="none")
        (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
        meta = {"model": model, "oracle": "none", "sampling": {"temperature": 0.0, "greedy": True}}
        (folder / "run.json").write_text(json.dumps(meta))
    return root


def test_score_takes_the_runs_folder_the_demo_writes(tmp_path, capsys):
    runs = _runs_folder(tmp_path / "runs")
    assert cli(["score", str(runs)]) == 0
    out, err = capsys.readouterr()
    assert f"{runs}: scoring each of its 2 model folders: good, poor" in err
    flat = json.loads(out)
    assert set(flat) == {"good", "poor"} and flat["good"]["e2e/stage1/all"] == 1.0
    assert cli(["score", str(runs), "--table", "2"]) == 0
    table = capsys.readouterr().out
    assert "| good | 100.0" in table and "| poor | 100.0" in table
    assert cli(["score", str(runs), "--compare"]) == 0  # two models: the pair to compare
    assert capsys.readouterr().out.startswith("**Paired comparison: good - poor**")
    assert cli(["score", str(runs), "--name", "x"]) == 2
    assert "holds 2 models" in capsys.readouterr().err


def test_score_and_report_name_a_mistyped_runs_folder(tmp_path, capsys):
    runs = _runs_folder(tmp_path / "runs")
    assert cli(["score", str(runs) + "s"]) == 2
    assert "no such file or folder (did you mean" in capsys.readouterr().err
    assert cli(["report", "--results", str(tmp_path / "rnus"), "--output-dir", str(tmp_path / "r")]) == 2
    assert "no such folder (did you mean" in capsys.readouterr().err
    # the runs folder as score takes it, without --results
    assert cli(["report", str(tmp_path / "rnus"), "--output-dir", str(tmp_path / "r")]) == 2
    assert "error:" in (err := capsys.readouterr().err) and "no such folder (did you mean" in err
    assert cli(["report", "--output-dir", str(tmp_path / "r")]) == 2
    assert "which runs?" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli(["score", str(tmp_path / "empty")]) == 2
    assert "found no results" in capsys.readouterr().err


def test_report_without_output_dir_says_where_it_writes(tmp_path, monkeypatch, capsys):
    runs = _runs_folder(tmp_path / "runs")
    monkeypatch.chdir(tmp_path)
    assert cli(["report", "--results", str(runs), "--no-plots", "--bootstrap", "0"]) == 0
    out, err = capsys.readouterr()
    assert f"no --output-dir given: writing to {tmp_path / 'report'}" in err
    assert f"to {tmp_path / 'report'}/" in out and (tmp_path / "report" / "index.html").is_file()


def test_one_model_folder_however_spelled(tmp_path, monkeypatch):
    from chexpercept.eval.registry import same_model_id
    from chexpercept.eval.runner.store import RunStore

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "vlm").mkdir(parents=True)
    absolute = str(tmp_path / "models" / "vlm")
    assert same_model_id("models/vlm", absolute) and same_model_id("./models/vlm/", absolute)
    assert not same_model_id("models/vlm", "org/vlm") and not same_model_id("a/b", "a/c")
    assert same_model_id("org/name", "org/name") and not same_model_id(None, "x")
    # resuming a run made with the relative spelling, now given the absolute one
    store = RunStore(tmp_path / "runs" / "vlm" / "oracle_none")
    store.path.mkdir(parents=True)
    settings = {"model_id": "models/vlm", "backend": "vllm"}
    (store.path / "run.json").write_text(json.dumps({"settings": settings}))
    (store.path / "results.jsonl").write_text("{}\n")  # a saved line: the settings bind
    assert store.check_settings({**settings, "model_id": absolute}) is not None
    from chexpercept.eval.runner.store import StoreError

    with pytest.raises(StoreError, match="model_id"):
        store.check_settings({**settings, "model_id": "other/model"})


def test_estimate_from_run_accepts_the_same_model_given_another_way(tmp_path, monkeypatch):
    from chexpercept.eval.estimate.command import timed_session

    def _seconds_per_case(run_dir: str, model_id: str) -> float:
        _, seconds, cases = timed_session(run_dir, model_id)
        return seconds / cases

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vlm").mkdir()
    run = tmp_path / "runs" / "vlm" / "oracle_none"
    run.mkdir(parents=True)
    info = {
        "model_id": "vlm",
        "backend": "vllm",
        "last_session": {"seconds_main_process": 30.0, "cases": 10},
    }
    (run / "run.json").write_text(json.dumps(info))
    assert _seconds_per_case(str(run), str(tmp_path / "vlm")) == 3.0
    assert _seconds_per_case(os.path.relpath(run), "./vlm/") == 3.0
    with pytest.raises(ValueError, match="cannot time"):
        _seconds_per_case(str(run), "gpt-5.4")
    with pytest.raises(ValueError, match="no such folder"):
        _seconds_per_case(str(run) + "x", "vlm")


def test_estimate_says_why_a_column_is_na(fixture_bundle, capsys):
    args = ["estimate", "--data-dir", str(fixture_bundle), "--oracle", "none"]
    assert cli([*args, "--model", "gpt-5.4"]) == 0
    out = capsys.readouterr().out
    assert "time N/A: an API's speed depends on the provider's rate limits" in out
    assert "--from-run RUN_DIR" in out and "USD N/A" not in out
    assert cli([*args, "--model", "gpt-5.4", "--tokens-per-second", "100", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []
