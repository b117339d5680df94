"""Scores where the Hub shows them, against the loopback Hub: ``push-results --model-repo`` (Eval Results
in a pull request), ``benchmark-card`` (README.md and eval.yaml), ``leaderboard`` and
``report --hub-leaderboard``."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import yaml
from fake_hub import FakeDataset, FakeHub, FakeModel
from huggingface_hub import constants, parse_eval_result_entries

from chexpercept.cli import main as cli
from chexpercept.eval.run import main as run_main
from chexpercept.metrics import score_path
from chexpercept.metrics.hub.eval_results import HUB_TASKS, TASK_IDS, eval_results_schema, stage_eval_results
from chexpercept.metrics.hub.guard import Manifest, PushRefused
from chexpercept.metrics.hub.leaderboard import HubBoard, HubEntry, side_by_side
from chexpercept.metrics.hub.push_results import model_folders

BENCH = "org/chexpercept"
MODEL_REPO = "org/toy-vlm"


@pytest.fixture(scope="module")
def runs(fixture_bundle, tmp_path_factory) -> Path:
    """One model (the random baseline) under oracle none, implicit and explicit; the explicit run's
    run.json says thinking was off."""
    out = tmp_path_factory.mktemp("evalres") / "runs"
    for oracle in ("none", "implicit", "explicit"):
        args = ["--data-dir", str(fixture_bundle), "--model", "baseline:random", "--oracle", oracle]
        assert run_main([*args, "--output-dir", str(out), "--no-progress", "--no-score"]) == 0
    run_json = out / "baseline-random" / "oracle_explicit" / "run.json"
    meta = json.loads(run_json.read_text())
    meta["chat_template_kwargs"] = {"enable_thinking": False}
    run_json.write_text(json.dumps(meta))
    return out


@pytest.fixture
def hub(monkeypatch):
    server = FakeHub().start()
    server.models[MODEL_REPO] = FakeModel({"config.json": b"{}"})
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_TOKEN", "hf_fake")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    yield server
    server.stop()


def push(runs: Path, *extra: str) -> int:
    return cli(["push-results", str(runs), "--model-repo", MODEL_REPO, "--benchmark", BENCH, *extra])


FILES = {
    "none": ".eval_results/chexpercept_oracle-none_reference-parsing.yaml",
    "implicit": ".eval_results/chexpercept_oracle-implicit_reference-parsing.yaml",
    "explicit": ".eval_results/chexpercept_oracle-explicit_reference-parsing_thinking-off.yaml",
}


# ------------------------------------------------------------------------------------ push-results --model-repo
def test_model_repo_push_opens_a_pull_request_with_exactly_the_eval_results(runs, hub, capsys):
    assert push(runs, "--allow-synthetic") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    model = hub.models[MODEL_REPO]
    assert model.commits == [] and set(model.files) == {"config.json"}, "pushed to main"
    assert len(model.pulls) == 1
    pr = model.pulls[0]
    assert sorted(pr["files"]) == sorted(FILES.values())
    assert f"pull request {hub.url}/{MODEL_REPO}/discussions/1" in out
    assert pr["title"] == "Add CheXpercept evaluation results"
    assert all(f in pr["description"] for f in FILES.values()) and BENCH in pr["description"]
    posted = [p for m, p in hub.requests if m == "POST"]
    assert posted == [f"/api/models/{MODEL_REPO}/preupload/main", f"/api/models/{MODEL_REPO}/commit/main"]

    # each file is the Hub's format (huggingface_hub parses it) with the public scorer's numbers
    parsed = {s: parse_eval_result_entries(yaml.safe_load(pr["files"][f])) for s, f in FILES.items()}
    folder = runs / "baseline-random"
    e2e = score_path(folder / "oracle_none")
    both = score_path(folder, oracle=None)  # none + implicit (+ explicit ignored for OP)
    none = {e.task_id: e.value for e in parsed["none"]}
    assert set(none) == {"end_to_end", "stage1", "e2e_stage2", "e2e_stage3", "e2e_stage4"}
    assert none["e2e_stage2"] == round(100 * e2e.values["e2e/stage2/all"], 2)
    stages = [e2e.values[f"e2e/stage{k}/all"] for k in (1, 2, 3, 4)]
    assert none["end_to_end"] == round(100 * sum(stages) / 4, 2)
    implicit = {e.task_id: e.value for e in parsed["implicit"]}
    assert set(implicit) == {"oracle_passed", "op_stage2", "op_stage3", "op_stage4"}
    assert implicit["op_stage3"] == round(100 * both.values["op/stage3/all"], 2)
    op = [both.values[k] for k in ("e2e/stage1/all", "op/stage2/all", "op/stage3/all", "op/stage4/all")]
    assert implicit["oracle_passed"] == round(100 * sum(op) / 4, 2)
    for setting, entries in parsed.items():
        for e in entries:
            assert e.dataset_id == BENCH and e.source_url == f"{hub.url}/datasets/{BENCH}"
            assert e.notes.startswith(f"oracle {setting}; reference answer parsing")
            assert "synthetic bundle" in e.notes and "chexpercept 0.1.0" in e.notes
            assert e.date and len(e.date) == 10
    assert "thinking off" in parsed["explicit"][0].notes
    assert "Stage 1 from the oracle none run" in parsed["implicit"][0].notes


def test_model_repo_dry_run_prints_the_yaml_and_sends_nothing(runs, hub, capsys):
    assert push(runs, "--allow-synthetic", "--dry-run") == 0
    out = capsys.readouterr().out
    assert all(f"--- {f}" in out for f in FILES.values())
    assert "task_id: end_to_end" in out and "value:" in out
    assert hub.requests == [] and hub.models[MODEL_REPO].pulls == []


def test_model_repo_push_refuses_synthetic_runs_unless_allowed(runs, hub, capsys):
    assert push(runs) == 2
    assert "synthetic (phantom) bundle" in capsys.readouterr().err and hub.requests == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--private"], "--private apply only to --repo"),
        (["--bootstrap", "10"], "--bootstrap apply only to --repo"),
        (["--benchmark", "nobenchmark"], "--benchmark must be ORG/NAME"),
    ],
)
def test_model_repo_options(runs, hub, capsys, extra, message):
    assert push(runs, "--allow-synthetic", *extra) == 2
    assert message in capsys.readouterr().err and hub.requests == []


def test_model_repo_needs_a_benchmark_and_one_model(runs, fixture_bundle, hub, capsys, tmp_path):
    assert cli(["push-results", str(runs), "--model-repo", MODEL_REPO]) == 2
    assert "--model-repo needs --benchmark" in capsys.readouterr().err
    two = tmp_path / "runs"
    shutil.copytree(runs, two)
    shutil.copytree(two / "baseline-random", two / "other-model")
    assert cli(["push-results", str(two), "--model-repo", MODEL_REPO, "--benchmark", BENCH]) == 2
    assert "holds 2 models (baseline-random, other-model)" in capsys.readouterr().err
    assert hub.requests == []


def test_model_repo_pull_request_to_a_missing_model_fails_cleanly(runs, hub, capsys):
    del hub.models[MODEL_REPO]
    assert push(runs, "--allow-synthetic") == 1
    assert "upload failed" in capsys.readouterr().err


def _restage(staged, folder: Path, rel: str, change):
    manifest = Manifest(folder, staged.manifest.context)
    for f in staged.files:
        text = (staged.manifest.root / f).read_text()
        manifest.write(f, change(text) if f == rel else text, staged.manifest.staged[f].schema)
    return manifest


@pytest.fixture(scope="module")
def staged(runs, tmp_path_factory):
    folder = model_folders(runs)["baseline-random"]
    return stage_eval_results(
        folder,
        tmp_path_factory.mktemp("evalres-staged") / "s",
        benchmark=BENCH,
        source_url=f"https://huggingface.co/datasets/{BENCH}",
        allow_synthetic=True,
    )


def _key(fixture_bundle: Path) -> str:
    return next(iter(json.loads((fixture_bundle / "chexpercept.json").read_text())))


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda t, k: "# the model answered: effusion, left\n" + t, "not laid out as the stager writes YAML"),
        (
            lambda t, k: t.replace("notes: oracle none", f"notes: {k}; oracle none", 1),
            "a key_id of the bundle",
        ),
        (
            lambda t, k: t.replace("  value:", "  raw_response: (1) Yes\n  value:", 1),
            "a key the stager does not write",
        ),
        (
            lambda t, k: t.replace("task_id: stage1", "task_id: hardest_case", 1),
            "a string the stager does not write",
        ),
        (lambda t, k: t.replace("id: org/chexpercept", "id: org/other", 1), "dataset.id"),
        (lambda t, k: t.replace("url: https", f"url: https://x.org/{k}#https", 1), "a key_id of the bundle"),
    ],
)
def test_the_guard_checks_eval_results_like_every_upload(staged, fixture_bundle, tmp_path, change, reason):
    rel = FILES["none"]
    key = _key(fixture_bundle)
    manifest = _restage(staged, tmp_path / "s", rel, lambda t: change(t, key))
    with pytest.raises(PushRefused) as e:
        manifest.verify()
    assert f"{rel}: " in str(e.value) and reason in str(e.value), str(e.value)


def test_the_eval_results_schema_accepts_what_the_stager_writes(staged):
    assert list(staged.verify()) == sorted(FILES.values())
    assert isinstance(eval_results_schema(BENCH), type(staged.manifest.staged[FILES["none"]].schema))


# ------------------------------------------------------------------------------------ benchmark-card
def test_benchmark_card_commits_a_card_and_eval_yaml_without_data(hub, capsys):
    assert cli(["benchmark-card", "--repo", BENCH]) == 0, capsys.readouterr().err
    ds = hub.datasets[BENCH]
    assert sorted(ds.files) == ["README.md", "eval.yaml"] and len(ds.commits) == 1
    spec = yaml.safe_load(ds.files["eval.yaml"])
    assert spec["name"] == "CheXpercept" and spec["evaluation_framework"] == "chexpercept"
    assert [t["id"] for t in spec["tasks"]] == list(TASK_IDS) and spec["tasks"][0]["id"] == "end_to_end"
    card = ds.files["README.md"].decode()
    front = yaml.safe_load(card.split("---\n", 2)[1])
    assert not {"configs", "dataset_info", "gated"} & set(front) and front["license"] == "other"
    assert not any(k.startswith("extra_gated") for k in front)
    assert "This repository holds no data" in card and "physionet.org/settings/credentialing" in card
    assert 'load_dataset("chexpercept", data_dir=' in card
    assert all(f"`{t.id}`" in card for t in HUB_TASKS)
    assert f"--benchmark {BENCH}" in card
    posted = [p for m, p in hub.requests if m == "POST"]
    assert posted[:2] == ["/api/repos/create", "/api/validate-yaml"]


def test_benchmark_card_task_ids_are_the_ones_the_model_files_use(staged, hub, capsys):
    assert cli(["benchmark-card", "--repo", BENCH, "--dry-run"]) == 0
    out = capsys.readouterr().out
    listed = {line.split("id: ", 1)[1] for line in out.splitlines() if line.startswith("- id: ")}
    used = {e["dataset"]["task_id"] for entries in staged.entries.values() for e in entries}
    assert used <= listed and listed == set(TASK_IDS)
    assert hub.requests == []


# ------------------------------------------------------------------------------------ leaderboard
def _entry(rank: int, model: str, value: float, **kw) -> dict:
    return {
        "rank": rank,
        "modelId": model,
        "value": value,
        "filename": ".eval_results/chexpercept_oracle-none_reference-parsing.yaml",
        "verified": kw.pop("verified", False),
        "source": {"url": "https://example.org", "name": "Eval traces", "isExternal": False},
        "author": {"name": model.split("/")[0], "type": "org", "fullname": "Org", "avatarUrl": ""},
        **kw,
    }


@pytest.fixture
def board(hub):
    hub.leaderboards[BENCH] = [
        _entry(1, "acme/vlm-large", 61.25, verified=True, notes="oracle none; reference answer parsing"),
        _entry(2, "org/toy-vlm", 40.5, pullRequest=3, notes="oracle none; thinking off"),
    ]
    return hub


def test_leaderboard_prints_rank_model_value_and_verified(board, capsys):
    assert cli(["leaderboard", BENCH]) == 0
    out = capsys.readouterr().out
    assert "| Rank | Model | Value | Verified | Notes |" in out
    assert "| 1 | acme/vlm-large | 61.25 | verified | oracle none; reference answer parsing |" in out
    assert "| 2 | org/toy-vlm | 40.5 | community | oracle none; thinking off |" in out
    assert board.leaderboard_queries == [{}]
    assert cli(["leaderboard", BENCH, "--all-models", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in rows] == ["acme/vlm-large", "org/toy-vlm"] and rows[0]["verified"] is True
    assert board.leaderboard_queries[-1] == {"base_model": ["false"]}


def test_leaderboard_errors_name_the_repo(hub, capsys, monkeypatch):
    assert cli(["leaderboard", "org/missing"]) == 1
    assert "org/missing: no such dataset repo" in capsys.readouterr().err
    hub.datasets["org/plain"] = FakeDataset(private=False)
    assert cli(["leaderboard", "org/plain"]) == 1
    assert "org/plain: the Hub gave no leaderboard" in capsys.readouterr().err
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert cli(["leaderboard", BENCH]) == 1
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err
    # a Hub that cannot be reached (nothing listens there): one line, never the HTTP client's
    # traceback (red team, stop 44)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert cli(["leaderboard", BENCH]) == 1
    err = capsys.readouterr().err
    assert f"{BENCH}: the Hub could not be reached (ConnectError" in err and "Traceback" not in err, err
    # a Hub that takes the connection and never answers: the call has a deadline (red team, stop 44)
    import chexpercept.peer_http as peer_http

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(peer_http, "HUB_TIMEOUT", 1.0)
        from huggingface_hub.utils import _http

        _http.close_session()  # the next client is made with the deadline above
        try:
            assert cli(["leaderboard", BENCH]) == 1
        finally:
            _http.close_session()  # no client of that deadline is left for the next test
    assert "the Hub could not be reached" in capsys.readouterr().err
    # a repo id the Hub would not take is named before anything is asked (red team, stop 44)
    for bad in ("me/b b", "nope", "a/b/c"):
        assert cli(["leaderboard", bad]) == 2
        assert "the benchmark repo must be ORG/NAME" in capsys.readouterr().err


def test_report_shows_the_hub_rows_beside_local_runs(runs, board, tmp_path, capsys):
    out = tmp_path / "report"
    args = ["report", "--results", str(runs), "--output-dir", str(out), "--bootstrap", "0", "--no-plots"]
    assert cli([*args, "--no-html", "--hub-leaderboard", BENCH]) == 0, capsys.readouterr().err
    md = (out / "leaderboard.md").read_text()
    assert f"**Leaderboard of {BENCH} on the Hub**" in md
    assert "| 1 | acme/vlm-large | 61.25 | verified |" in md
    local = next(line for line in md.splitlines() if "baseline-random" in line and "local run" in line)
    assert local.endswith("| local run |")
    assert (
        "| acme/vlm-large | 61.2 | Hub, verified |" in md or "| acme/vlm-large | 61.3 | Hub, verified |" in md
    )
    assert (out / "hub_leaderboard.csv").read_text().startswith("rank,model,value,verified,status")
    data = json.loads((out / "metrics.json").read_text())
    assert data["hub_leaderboard"]["repo"] == BENCH and len(data["hub_leaderboard"]["entries"]) == 2


def test_side_by_side_ranks_local_and_hub_rows_together():
    rows = [
        {"setting": "e2e", "model": "mine", "score": 0.5},
        {"setting": "op", "model": "mine", "score": 0.9},
    ]
    hub = HubBoard(BENCH, (HubEntry(1, "acme/x", 61.0, True), HubEntry(2, "acme/y", 12.0, False)))
    assert [(r["model"], r["from"]) for r in side_by_side(rows, hub)] == [
        ("acme/x", "Hub, verified"),
        ("mine", "local run"),
        ("acme/y", "Hub, submitted"),
    ]


def test_the_pull_request_text_is_checked_too(staged, fixture_bundle, hub):
    from chexpercept.metrics.hub.commit import upload

    key = _key(fixture_bundle)
    with pytest.raises(PushRefused, match="the pull request description: a key_id of the bundle"):
        upload(staged.manifest, MODEL_REPO, repo_type="model", create_pr=True, message="m", description=key)
    assert hub.requests == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--benchmark", BENCH], "--benchmark apply only to --model-repo"),
        (["--allow-synthetic"], "--allow-synthetic apply only to --model-repo"),
        (["--bootstrap", "-1"], "argument --bootstrap: must be a whole number from 0"),
    ],
)
def test_dataset_repo_options(runs, hub, capsys, extra, message):
    try:
        status = cli(["push-results", str(runs), "--repo", "org/scores", *extra])
    except SystemExit as e:  # argparse: a value outside its option's domain
        status = e.code
    assert status == 2
    assert message in capsys.readouterr().err and hub.requests == []
