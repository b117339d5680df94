"""``chexpercept push-results``: scores staged, guarded and committed to a loopback Hub; never data."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
from fake_hub import FakeHub
from huggingface_hub import constants

from chexpercept.cli import main as cli
from chexpercept.eval.run import main as run_main
from chexpercept.metrics.hub.push_results import PushRefused, provenance, scrub, stage

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
KEY = "edema_s50000720_positive_0"


@pytest.fixture(scope="module")
def runs(fixture_bundle, tmp_path_factory):
    """Two models' runs made by chexpercept run, plus every kind of credentialed file beside them."""
    out = tmp_path_factory.mktemp("push") / "runs"
    for model, oracle in (
        ("baseline:oracle", "implicit"),
        ("baseline:oracle", "none"),
        ("baseline:random", "none"),
    ):
        args = ["--data-dir", str(fixture_bundle), "--model", model, "--oracle", oracle]
        assert run_main([*args, "--output-dir", str(out), "--no-progress", "--no-score"]) == 0
    junk = out / "baseline-oracle" / "oracle_none"
    (junk / "image.png").write_bytes(PNG)
    (junk / "conversation.json").write_text(json.dumps({"messages": ["hi"]}))
    return out


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


def forbidden_folder(root: Path) -> Path:
    """A run folder holding every kind of file the guard must refuse."""
    root.mkdir(parents=True)
    (root / "results.jsonl").write_text(json.dumps({"key_id": KEY}) + "\n")
    (root / "failures.jsonl").write_text("{}\n")
    (root / "all_results.json").write_text("{}")
    (root / "chest.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\x00" * 16)
    (root / "image.json").write_bytes(PNG)  # image bytes under an innocent name
    (root / "mask.npy").write_bytes(b"\x93NUMPY")
    (root / "conversations.json").write_text("[]")
    (root / "raw_responses.md").write_text("the model said")
    (root / "notes.md").write_text(f"see case {KEY}\n")
    (root / "viewer.md").write_text("![x](data:image/png;base64," + base64.b64encode(PNG).decode() + ")")
    (root / "metrics.json").write_text(json.dumps({"flat": {}, "turns": [{"response": "A"}]}))
    return root


def test_the_guard_refuses_every_kind_of_credentialed_file(runs, tmp_path):
    """What the deny-list used to look for, put into a staging folder: none of it was staged."""
    staged = stage(runs, tmp_path / "staging", bootstrap=0)
    folder = forbidden_folder(tmp_path / "run")
    for f in folder.iterdir():
        shutil.copy(f, staged.folder / f.name)
    shutil.copy(folder / "metrics.json", staged.folder / "models" / "baseline-oracle" / "metrics.json")
    with pytest.raises(PushRefused) as e:
        staged.verify()
    msg = str(e.value)
    for name in (
        "results.jsonl",
        "failures.jsonl",
        "all_results.json",
        "chest.jpg",
        "image.json",
        "mask.npy",
        "conversations.json",
        "raw_responses.md",
        "notes.md",
        "viewer.md",
    ):
        assert f"  {name}: not written by the stager" in msg, name
    assert "models/baseline-oracle/metrics.json: changed after staging" in msg
    assert "PhysioNet" in msg and "Data Use Agreement" in msg


def test_provenance_loses_local_paths():
    meta = {
        "model_id": "/home/me/models/x",
        "bundle": {"path": "/data/bundle", "fingerprint": "abc"},
        "command": ["eval/run.py", "--data-dir", "/data"],
        "backend_settings": {"model": "/scratch/hf/snapshots/1", "dtype": "bfloat16"},
        "last_session": {"cases": 12},
    }
    assert scrub(meta) == {
        "model_id": "<local path removed>",
        "bundle": {"fingerprint": "abc"},
        "backend_settings": {"model": "<local path removed>", "dtype": "bfloat16"},
        "last_session": {"cases": 12},
    }


def test_provenance_keeps_known_fields_only():
    meta = {
        "model": "m",
        "model_id": "/home/me/models/x",
        "sampling": {"temperature": 0.7000000001, "top_p": 1.0, "max_tokens": 64, "greedy": False, "n": 3},
        "chat_template_kwargs": {"enable_thinking": False, "system": "free text"},
        "backend_settings": {"api_base": "https://example.org/v1"},
        "estimate": {"cost": 1.0},
        "last_session": {"cases": 12},
        "bundle": {"path": "/data/bundle", "fingerprint": "ab" * 32, "n_cases": 21},
        "notes": ["anything"],
    }
    assert provenance(meta) == {
        "model": "m",
        "model_id": "<local path removed>",
        "sampling": {"temperature": 0.7, "top_p": 1.0, "max_tokens": 64, "greedy": False},
        "chat_template_kwargs": {"enable_thinking": False},
        "bundle": {"fingerprint": "ab" * 32, "n_cases": 21},
    }


def test_staging_holds_scores_only(runs, tmp_path):
    staged = stage(runs, tmp_path / "staging", bootstrap=20, repo="org/scores")
    assert list(staged.verify()) == staged.files
    assert sorted(staged.models) == ["baseline-oracle", "baseline-random"]
    files = set(staged.files)
    for model in ("baseline-oracle", "baseline-random"):
        assert {f"models/{model}/metrics.json", f"models/{model}/intervals.json"} <= files
        assert {f"models/{model}/table2.md", f"models/{model}/table2.csv"} <= files
    assert "models/baseline-oracle/run_oracle_implicit.json" in files
    assert {
        "README.md",
        "leaderboard.md",
        "leaderboard.csv",
        "tables/table2.md",
        "tables/table11.csv",
    } <= files
    assert all(f.endswith((".md", ".csv", ".json")) for f in files)
    text = "\n".join((staged.folder / f).read_text() for f in files)
    assert str(runs) not in text and str(tmp_path) not in text
    flat = json.loads((staged.folder / "models/baseline-oracle/metrics.json").read_text())["flat"]
    assert flat["op/stage2/all"] == 1.0
    card = (staged.folder / "README.md").read_text()
    fingerprint = json.loads((runs / "baseline-oracle/oracle_none/run.json").read_text())["bundle"][
        "fingerprint"
    ]
    assert fingerprint in card and "baseline-random" in card and "PhysioNet" in card
    assert "## Leaderboard" in card and card.startswith("---\npretty_name:")


def test_dry_run_lists_exactly_what_would_be_uploaded(runs, hub, capsys):
    assert cli(["push-results", str(runs), "--repo", "org/scores", "--dry-run", "--bootstrap", "10"]) == 0
    out = capsys.readouterr().out
    listed = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert "README.md" in listed and "models/baseline-oracle/metrics.json" in listed
    assert not any(name in out for name in ("results.jsonl", "image.png", "conversation"))
    assert hub.requests == []


def test_push_commits_the_staged_files_to_a_dataset_repo(runs, hub, capsys, tmp_path):
    keep = tmp_path / "kept"
    rc = cli(
        [
            "push-results",
            str(runs),
            "--repo",
            "org/scores",
            "--private",
            "--bootstrap",
            "10",
            "--output-dir",
            str(keep),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{hub.url}/datasets/org/scores/commit/" in out
    ds = hub.datasets["org/scores"]
    assert ds.private and len(ds.commits) == 1
    staged = sorted(p.relative_to(keep).as_posix() for p in keep.rglob("*") if p.is_file())
    assert sorted(ds.files) == staged
    assert ds.files["README.md"] == (keep / "README.md").read_bytes()
    posted = [p for m, p in hub.requests if m == "POST"]
    assert posted == [
        "/api/repos/create",
        "/api/validate-yaml",
        "/api/datasets/org/scores/preupload/main",
        "/api/datasets/org/scores/commit/main",
    ]
    # a second push goes to the existing repo
    shutil.rmtree(keep)
    assert cli(["push-results", str(runs), "--repo", "org/scores", "--bootstrap", "0"]) == 0
    assert len(ds.commits) == 2 and "models/baseline-oracle/intervals.json" not in ds.commits[1]["files"]


def test_push_refuses_when_the_staging_holds_credentialed_data(runs, hub, monkeypatch, capsys):
    import chexpercept.metrics.hub.push_results as push

    real_stage = push.stage

    def leaky(runs_dir, staging, **kw):
        staged = real_stage(runs_dir, staging, **kw)
        shutil.copy(
            runs / "baseline-oracle" / "oracle_none" / "results.jsonl", Path(staging) / "results.jsonl"
        )
        return staged

    monkeypatch.setattr(push, "stage", leaky)
    assert cli(["push-results", str(runs), "--repo", "org/scores", "--bootstrap", "0"]) == 2
    err = capsys.readouterr().err
    assert "refusing to upload" in err and "results.jsonl" in err and "PhysioNet" in err
    assert hub.requests == []


def test_push_needs_runs(tmp_path, capsys):
    assert cli(["push-results", str(tmp_path), "--repo", "org/scores", "--dry-run"]) == 2
    assert "no runs in" in capsys.readouterr().err
