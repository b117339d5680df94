"""Issue 27 item 5: an upload carries no free text. Every string staged for the Hub is a fixed word, a
strict format, or a name (chexpercept.metrics.hub.names): the model registry's, a baseline's, or a label
the user gives on the push command line (``--name FOLDER=LABEL``). A model's own name as its run folder
holds it is never published, so an encoding the identifier search never decodes (base32, base85, rot13,
reversed, hex split by dashes, look-alike letters...) is refused because it is not a name, not because
it was decoded.
"""

from __future__ import annotations

import base64
import codecs
import json
import shutil
import sys
from pathlib import Path

import pytest

from chexpercept.cli import main as cli
from chexpercept.eval.run import main as run_main
from chexpercept.metrics.hub.guard import Context, Manifest
from chexpercept.metrics.hub.identifiers import Identifiers
from chexpercept.metrics.hub.names import NameRefused
from chexpercept.metrics.hub.scores_repo import METRICS
from chexpercept.testing import write_fixture_bundle

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeServer


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    return write_fixture_bundle(tmp_path_factory.mktemp("names") / "bundle", per_cell=1, seed=8)


@pytest.fixture(scope="module")
def key_id(bundle) -> str:
    keys = json.loads((bundle / "chexpercept.json").read_text())
    return next(k for k in keys if "_positive_" in k)


def encodings(key: str) -> dict[str, str]:
    """Spellings of ``key`` the identifier search does not decode."""
    study = key.split("_")[1]
    return {
        "base32": base64.b32encode(key.encode()).decode().rstrip("="),
        "base32 lower": base64.b32encode(key.encode()).decode().rstrip("=").lower(),
        "base85": base64.b85encode(key.encode()).decode(),
        "rot13": codecs.encode(key, "rot13"),
        "rot13 dashes": codecs.encode(key, "rot13").replace("_", "-"),
        "reversed": key[::-1],
        "hex split by dashes": "-".join(key.encode().hex()[i : i + 4] for i in range(0, 2 * len(key), 4)),
        "fullwidth look-alikes": "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in key),
        "cyrillic look-alikes": key.replace("e", "\u0435").replace("a", "\u0430").replace("o", "\u043e"),
        "base32 of the study id": base64.b32encode(study.encode()).decode().rstrip("="),
        "org and name id": f"acme/{codecs.encode(key, 'rot13').replace('_', '-')}",
    }


NAMES = sorted(encodings("edema_s50000001_positive_0"))


@pytest.fixture(scope="module")
def api_runs(bundle, key_id, tmp_path_factory) -> Path:
    """The issue's shape: runs against a loopback API whose --model is an encoding of a key_id, one
    model folder per encoding, plus a registry model and a baseline."""
    out = tmp_path_factory.mktemp("api-runs") / "runs"
    with FakeServer() as server:
        for name, model in [*encodings(key_id).items(), ("registry", "gpt-5.4")]:
            args = [
                "--data-dir",
                str(bundle),
                "--model",
                model,
                "--backend",
                "openai",
                "--base-url",
                server.url,
            ]
            args += ["--oracle", "none", "--limit", "2", "--run-name", name.replace(" ", "-")]
            assert run_main([*args, "--output-dir", str(out), "--no-progress", "--no-score"]) == 0
    args = ["--data-dir", str(bundle), "--model", "baseline:random", "--oracle", "none", "--limit", "2"]
    assert run_main([*args, "--output-dir", str(out), "--no-progress", "--no-score"]) == 0
    return out


def one(api_runs: Path, folder: str, tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copytree(api_runs / folder, runs / folder)
    return runs


@pytest.mark.parametrize("name", NAMES)
def test_a_model_named_by_an_encoding_is_not_published(api_runs, bundle, key_id, name, tmp_path, capsys):
    folder = name.replace(" ", "-")
    runs = one(api_runs, folder, tmp_path)
    rc = cli(["push-results", str(runs), "--repo", "org/scores", "--dry-run", "--data-dir", str(bundle)])
    captured = capsys.readouterr()
    assert rc == 2
    assert (
        f"--name {folder}=LABEL" in captured.err
        and "not a model of the registry nor a baseline" in captured.err
    )
    assert "of the bundle" not in captured.err  # refused as not a name, not as a decoded identifier
    assert "would upload" not in captured.out and encodings(key_id)[name] not in captured.out


@pytest.mark.parametrize("name", [n for n in NAMES if n != "base32 of the study id"])
def test_a_label_that_is_an_encoding_is_refused_by_the_label_rule(
    api_runs, bundle, key_id, name, tmp_path, capsys
):
    """--name is the user's own word, and still no key_id fits into it in any of these spellings."""
    folder = name.replace(" ", "-")
    runs = one(api_runs, folder, tmp_path)
    label = encodings(key_id)[name]
    args = ["push-results", str(runs), "--repo", "org/scores", "--dry-run", "--data-dir", str(bundle)]
    assert cli([*args, "--name", f"{folder}={label}"]) == 2
    err = capsys.readouterr().err
    assert f"--name {folder}=LABEL: {label!r} is not a label" in err and "at most 24 characters" in err


def test_legitimate_names_are_published(api_runs, bundle, tmp_path, capsys):
    """A registry model under its registry names, a baseline, and a model outside the registry under
    the label its user gives it."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for folder in ("registry", "baseline-random", "base32"):
        shutil.copytree(api_runs / folder, runs / folder)
    keep = tmp_path / "staged"
    args = ["push-results", str(runs), "--repo", "org/scores", "--dry-run", "--data-dir", str(bundle)]
    assert cli([*args, "--name", "base32=tiny-vlm", "--bootstrap", "0", "--output-dir", str(keep)]) == 0
    out = capsys.readouterr().out
    assert "models/gpt-5.4/metrics.json" in out and "models/tiny-vlm/metrics.json" in out
    assert "models/baseline-random/metrics.json" in out and "models/base32/" not in out
    card = (keep / "README.md").read_text()
    assert "| GPT-5.4 | gpt-5.4-2026-03-05 | openai |" in card and "| tiny-vlm |  | openai |" in card
    run = json.loads((keep / "models" / "tiny-vlm" / "run_oracle_none.json").read_text())
    assert run["model"] == run["display_name"] == "tiny-vlm" and run["model_id"] is None


def test_repo_ids_source_urls_and_frameworks_follow_their_rules(api_runs, bundle, tmp_path, capsys):
    runs = one(api_runs, "baseline-random", tmp_path)
    base = ["push-results", str(runs), "--dry-run", "--data-dir", str(bundle)]
    for repo in ("org/scores\x1b[2J", "org/sc ores", "org/" + "x" * 97, "org/a--b", "o/r/g"):
        assert cli([*base, "--repo", repo]) == 2
        assert "--repo must be ORG/NAME" in capsys.readouterr().err
    model = [*base, "--model-repo", "acme/tiny", "--benchmark", "org/chexpercept", "--allow-synthetic"]
    assert cli([*model, "--source-url", "https://tracker.example/?q=edema_s50000001"]) == 2
    assert (
        "--source-url 'https://tracker.example/?q=edema_s50000001' is not the Hub page"
        in capsys.readouterr().err
    )
    assert cli([*model, "--source-url", "https://huggingface.co/acme/tiny"]) == 0
    capsys.readouterr()
    assert (
        cli(["benchmark-card", "--repo", "org/bench", "--dry-run", "--evaluation-framework", "Free text!"])
        == 2
    )
    assert "--evaluation-framework must be a framework's slug" in capsys.readouterr().err


def test_a_context_or_a_staged_folder_can_hold_names_only(tmp_path):
    """By construction: a schema's names come from a Context, which refuses free text; a staged file's
    folders are fixed ones or names."""
    with pytest.raises(NameRefused, match="'GU4DAMBQGA3TEMA-free text' is not in the model registry"):
        Context(Identifiers(), frozenset({"GU4DAMBQGA3TEMA-free text"}))
    manifest = Manifest(tmp_path / "staging", Context(Identifiers(), frozenset({"tiny-vlm"})))
    with pytest.raises(ValueError, match="a folder a stager does not write"):
        manifest.write("models/GU4DAMBQGA3TEMA/metrics.json", "{}\n", METRICS)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 10**4000),
        ("seed", True),
        ("sampling.max_tokens", 10**30),
        ("sampling.max_tokens", True),
        ("batch_size", 10**12),
        ("selection.limit", -5),
        ("sampling.temperature", 1e300),
    ],
    ids=[
        "huge-seed",
        "bool-seed",
        "huge-max-tokens",
        "bool-max-tokens",
        "huge-batch",
        "negative-limit",
        "huge-temp",
    ],
)
def test_a_published_number_is_within_its_declared_range(api_runs, bundle, field, value, tmp_path, capsys):
    """Issue 27 red team #3: a number in a tampered run.json (a huge int is free text in digits; a bool
    is no count) is refused for the Hub, naming the field and its range; nothing is staged."""
    runs = one(api_runs, "registry", tmp_path)
    path = runs / "registry" / "oracle_none" / "run.json"
    meta = json.loads(path.read_text())
    *parents, leaf = field.split(".")
    node = meta
    for parent in parents:
        node = node.setdefault(parent, {})
    node[leaf] = value
    path.write_text(json.dumps(meta))
    args = ["push-results", str(runs), "--repo", "org/scores", "--dry-run", "--data-dir", str(bundle)]
    assert cli([*args, "--bootstrap", "0"]) == 2
    captured = capsys.readouterr()
    assert leaf in captured.err and ("must be an integer" in captured.err or " from " in captured.err)
    assert "would upload" not in captured.out and "0" * 100 not in captured.out + captured.err


def test_repo_ids_and_frameworks_cannot_carry_an_identifier_without_a_bundle(capsys):
    """Issue 27 red team #11/#12: benchmark-card without --data-dir still refuses a repo id or a framework
    shaped like a case identifier or an encoding of one (the shape rule needs no bundle)."""
    key_id = "edema_s50000001_positive_0"
    for repo in ("org/edema-s50000001-positive-0", "org/" + encodings(key_id)["base32"].lower()[:40]):
        assert cli(["benchmark-card", "--repo", repo, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert "the shapes of case identifiers" in err, err
    assert (
        cli(["benchmark-card", "--repo", "org/bench", "--evaluation-framework", "s50000001", "--dry-run"])
        == 2
    )
    assert "digits in a row" in capsys.readouterr().err
    assert cli(["benchmark-card", "--repo", "stanford-aimi/chexpercept-v1.0", "--dry-run"]) == 0
    capsys.readouterr()
