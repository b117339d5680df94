"""A resume never keeps an answer made under other settings (issue 28, class A).

A run's identity (eval/runner/identity.py) is everything that can change an answer; each member below
changes one part of it between two runs on one folder, and the second run must refuse, naming the
difference, before anything runs. Lines whose identity cannot be established are quarantined,
never scored.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from fake_openai import FakeServer

from chexpercept.eval.run import main
from chexpercept.eval.runner.store import RunStore


def _run(bundle, out, model, *extra) -> int:
    return main(
        [
            "--data-dir",
            str(bundle),
            "--model",
            model,
            "--output-dir",
            str(out),
            "--no-progress",
            "--no-score",
            *extra,
        ]
    )


def _refused(capsys, *names: str) -> str:
    err = capsys.readouterr().err
    assert "holds a run made with other settings" in err, err
    for name in names:
        assert name in err, err
    return err


def test_another_request_field_is_refused(fixture_bundle, tmp_path, capsys):
    """--request-extra reasoning_effort low -> high (an API run)."""
    with FakeServer() as server:
        api = ["--backend", "openai", "--base-url", server.url, "--limit", "2"]
        assert (
            _run(fixture_bundle, tmp_path, "gpt-5.4", *api, "--request-extra", '{"reasoning_effort": "low"}')
            == 0
        )
        calls = len(server.requests)
        assert _run(fixture_bundle, tmp_path, "gpt-5.4", *api, "--limit", "4",
                    "--request-extra", '{"reasoning_effort": "high"}') == 2  # fmt: skip
        assert len(server.requests) == calls  # refused before any request
    _refused(capsys, "backend_identity.request_fields.reasoning_effort: 'low' -> 'high'")


def test_another_dtype_is_refused(fixture_bundle, tmp_path, tiny_model, capsys):
    """--dtype float32 -> bfloat16 (a transformers run); refused before the model loads."""
    args = ["--backend", "transformers", "--limit", "1", "--max-tokens", "2"]
    assert _run(fixture_bundle, tmp_path, str(tiny_model), *args, "--dtype", "float32") == 0
    assert _run(fixture_bundle, tmp_path, str(tiny_model), *args, "--dtype", "bfloat16") == 2
    _refused(capsys, "backend_identity.dtype: 'float32' -> 'bfloat16'")


def test_changed_weights_in_the_same_folder_are_refused(fixture_bundle, tmp_path, tiny_model, capsys):
    """The model folder's weights rewritten (a fine-tune saved over it) between two runs."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    args = ["--backend", "transformers", "--limit", "1", "--max-tokens", "2"]
    assert _run(fixture_bundle, tmp_path / "runs", str(model), *args) == 0
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # the last bytes of the last tensor
    weights.write_bytes(bytes(data))
    assert _run(fixture_bundle, tmp_path / "runs", str(model), *args) == 2
    _refused(capsys, "weights.folder: 'sha256:")


def test_a_prior_over_another_selection_is_refused(fixture_bundle, tmp_path, capsys):
    """baseline:prior's answers come from the selected cases: another --limit gives another prior."""
    assert _run(fixture_bundle, tmp_path, "baseline:prior") == 0
    assert _run(fixture_bundle, tmp_path, "baseline:prior", "--limit", "5") == 2
    _refused(capsys, "backend_identity.prior.")


def test_another_prompt_version_is_refused(fixture_bundle, tmp_path, capsys, monkeypatch):
    """A run made before the toolkit's prompts changed is not resumed after."""
    from chexpercept.eval.runner import execute as runner

    assert _run(fixture_bundle, tmp_path, "baseline:random", "--limit", "3") == 0
    monkeypatch.setattr(runner, "PROMPT_VERSION", runner.PROMPT_VERSION + 1)
    assert _run(fixture_bundle, tmp_path, "baseline:random") == 2
    _refused(capsys, "prompt_version:")


def test_vllm_engine_arguments_that_change_answers_enter_the_identity():
    """--engine-args: dtype, quantization or max_model_len are identity; memory and placement are not."""
    from chexpercept.eval.backends.vllm.backend import VLLMBackend
    from chexpercept.eval.protocol import RunContext, Sampling
    from chexpercept.eval.registry import resolve

    def identity(**engine_args):
        backend = VLLMBackend(
            resolve("medgemma-1.5-4b"), sampling=Sampling(0, 1, 8, True), engine_args=engine_args
        )
        return backend.identity(RunContext(root=".", cases=[]))["engine_args"]

    base = identity()
    assert identity(dtype="float16") != base and identity(quantization="fp8") != base
    assert identity(max_model_len=4096) != base
    assert identity(gpu_memory_utilization=0.5, max_num_seqs=8, enforce_eager=True) == base


def test_a_line_without_identity_is_quarantined_not_kept(fixture_bundle, tmp_path, capsys):
    """A line with no run identity (as older versions wrote), from another model, appended to
    results.jsonl: moved aside on resume, its case run again; never scored."""
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "3") == 0
    folder = RunStore(tmp_path / "baseline-constant-1" / "oracle_implicit")
    lines = folder.results.read_text().splitlines()
    foreign = json.loads(lines[0])
    foreign.pop("run")
    foreign["key_id"] = json.loads(lines[-1])["key_id"]  # it claims a case the run has done...
    keep = lines[:-1]  # ...whose own line is gone
    folder.results.write_text("\n".join([*keep, json.dumps(foreign)]) + "\n")
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "3") == 0
    err = capsys.readouterr().err
    assert "carried no run identity" in err and "quarantine.jsonl" in err
    records = [json.loads(line) for line in folder.results.read_text().splitlines()]
    assert len(records) == 3 and all(r.get("run") for r in records)
    assert json.loads(folder.quarantine.read_text())["key_id"] == foreign["key_id"]


def test_a_folder_mixing_lines_with_and_without_identity_is_not_scored(fixture_bundle, tmp_path):
    from chexpercept.metrics import score_path

    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "3") == 0
    results = tmp_path / "baseline-constant-1" / "oracle_implicit" / "results.jsonl"
    lines = results.read_text().splitlines()
    stray = json.loads(lines[0])
    stray.pop("run")
    stray["key_id"] = "someone_elses_case"
    results.write_text("\n".join([*lines, json.dumps(stray)]) + "\n")
    with pytest.raises(ValueError, match="no run identity"):
        score_path(tmp_path / "baseline-constant-1")


def test_each_session_is_recorded(fixture_bundle, tmp_path):
    """Settings outside the identity (batch size, the command) are kept per session, not overwritten."""
    assert _run(fixture_bundle, tmp_path, "baseline:random", "--limit", "3", "--batch-size", "2") == 0
    assert _run(fixture_bundle, tmp_path, "baseline:random", "--batch-size", "5") == 0
    info = json.loads((tmp_path / "baseline-random" / "oracle_implicit" / "run.json").read_text())
    assert [s["batch_size"] for s in info["sessions"]] == [2, 5]


def _edit_first_line(results, **fields):
    lines = results.read_text().splitlines()
    record = json.loads(lines[0])
    for name, value in fields.items():
        if value is _DROP:
            record.pop(name)
        else:
            record[name] = value
    results.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")


_DROP = object()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"run": "garbage"}, "field run: expected"),
        ({"usage": ["not", "an", "object"]}, "field usage: expected"),
        ({"turns": [{"task": "detection"}]}, "field turns[0].stage: missing"),
    ],
)
def test_a_bad_field_of_a_results_line_is_named_by_run_and_score(
    fixture_bundle, tmp_path, capsys, fields, named
):
    """Every field of a results line is read by one typed reader (chexpercept.results.read_typed):
    a hand-edited value gives one line naming the file, the line and the field, in run and score."""
    from chexpercept.metrics import score_path

    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "2") == 0
    results = tmp_path / "baseline-constant-1" / "oracle_implicit" / "results.jsonl"
    _edit_first_line(results, **fields)
    capsys.readouterr()
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "3") == 2
    err = capsys.readouterr().err
    assert f"{results}:1: field" in err and named in err and "Traceback" not in err, err
    with pytest.raises(ValueError, match=r"results\.jsonl:1: field") as caught:
        score_path(tmp_path / "baseline-constant-1")
    assert named in str(caught.value)


def test_lines_without_identity_beside_a_run_json_with_settings_are_not_scored(fixture_bundle, tmp_path):
    """run.json records settings (so its version stamps every line): lines lacking ``run``, even every
    line of the file, cannot be checked and are not scored (only a run.json without settings, an
    older version's, is read unchecked)."""
    from chexpercept.metrics import score_path

    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "2") == 0
    results = tmp_path / "baseline-constant-1" / "oracle_implicit" / "results.jsonl"
    records = [json.loads(line) for line in results.read_text().splitlines()]
    for record in records:
        record.pop("run")
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match="line 1 .* and 1 more carries no run identity"):
        score_path(tmp_path / "baseline-constant-1")


def test_a_folder_of_an_older_version_is_refused_as_such(fixture_bundle, tmp_path, capsys):
    """run.json without settings: said to be an older version's without a recorded identity, not a
    list of ``None -> ...`` differences."""
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "2") == 0
    run_json = tmp_path / "baseline-constant-1" / "oracle_implicit" / "run.json"
    info = json.loads(run_json.read_text())
    settings = info.pop("settings")
    run_json.write_text(json.dumps(info))
    capsys.readouterr()
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "2") == 2
    err = capsys.readouterr().err
    assert "older version of the toolkit" in err and "did not record a run identity" in err, err
    assert "None ->" not in err

    info["settings"] = {k: v for k, v in settings.items() if k != "bundle_images"}
    info["sessions"][-1]["versions"]["chexpercept"] = "0.0.1"  # another version, whose identity lacked it
    run_json.write_text(json.dumps(info))  # made by a version whose identity lacked a part this one has
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "2") == 2
    assert "bundle_images: not recorded by the version that made that run" in capsys.readouterr().err


def test_an_image_changed_in_place_is_refused(fixture_bundle, tmp_path, capsys):
    """One image of the bundle inverted in place between two sessions: the images are part of the
    identity (Bundle.images_fingerprint), so the resume is refused before anything runs."""
    bundle = tmp_path / "bundle"
    shutil.copytree(fixture_bundle, bundle)
    assert _run(bundle, tmp_path / "runs", "baseline:constant:1", "--limit", "2") == 0
    from PIL import Image, ImageOps

    from chexpercept.bundle import read_bundle

    image = bundle / read_bundle(bundle, check_images="none").cases[0].cxr_image
    with Image.open(image) as im:
        inverted = ImageOps.invert(im.convert("L"))
    inverted.save(image)
    assert _run(bundle, tmp_path / "runs", "baseline:constant:1", "--limit", "3") == 2
    _refused(capsys, "bundle_images: 'sha256:")


def test_a_model_file_changed_anywhere_changes_the_fingerprint(tiny_model, tmp_path):
    """The whole file counts (a weight file changed in its middle), and every file of the folder but
    README, LICENSE and dot-files (tokenizer.model.v3, chat_template.j2); unchanged files are not
    read again (the digest cache), and a Hub blob counts by its content, never by its name."""
    from chexpercept.eval.runner.identity import folder_fingerprint
    from chexpercept.file_digest import DigestCache

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cache = DigestCache(tmp_path / "cache")
    before = folder_fingerprint(model, cache)
    assert cache.hashed_bytes > 0
    cache.hashed_bytes = 0
    assert folder_fingerprint(model, cache) == before and cache.hashed_bytes == 0  # known by stat

    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the middle of the file: neither its first nor its last MiB
    weights.write_bytes(bytes(data))
    seen = {before, folder_fingerprint(model, cache)}
    for name in ("tokenizer.model.v3", "chat_template.j2", "processor/preprocessor_config.json"):
        (model / name).parent.mkdir(exist_ok=True)
        (model / name).write_text("x")
        seen.add(folder_fingerprint(model, cache))
    assert len(seen) == 5
    (model / "README.md").write_text("changed card")
    (model / ".git").mkdir()
    (model / ".git" / "HEAD").write_text("ref")
    assert folder_fingerprint(model, cache) in seen  # not the model

    blobs = tmp_path / "hub" / "blobs"
    blobs.mkdir(parents=True)
    digest = hashlib.sha256(b"weights").hexdigest()
    (blobs / digest).write_bytes(b"weights")
    linked = tmp_path / "hub" / "model.safetensors"
    linked.symlink_to(blobs / digest)
    assert cache.digest(linked) == digest
    (blobs / digest).write_bytes(b"weights rewritten in place")  # same name, new content
    assert cache.digest(linked) == hashlib.sha256(b"weights rewritten in place").hexdigest()


def test_a_digest_cache_of_another_account_is_ignored(tmp_path):
    """Rule: the digest cache file and its folder are used only when this account's (else ignored
    with a one-line warning and digests computed afresh): another account's cache would decide the
    run's identity."""
    import hashlib
    import os

    from chexpercept.file_digest import CACHE_NAME, DigestCache, _key

    if os.geteuid() != 0:
        pytest.skip("needs root to give files to another account")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"the real weights")
    true = hashlib.sha256(b"the real weights").hexdigest()
    for foreign_folder in (True, False):
        folder = tmp_path / f"cache-{foreign_folder}"
        folder.mkdir()
        (folder / CACHE_NAME).write_text(json.dumps({_key(os.stat(weights)): "0" * 64}))
        os.chown(folder / CACHE_NAME, 65534, 65534)
        if foreign_folder:
            os.chown(folder, 65534, 65534)
        with pytest.warns(UserWarning, match="not this account's"):
            cache = DigestCache(folder)
        assert cache.digest(weights) == true
        cache.save()
        assert (folder / CACHE_NAME).stat().st_uid == (65534 if foreign_folder else os.geteuid())


def test_linked_folders_are_walked_into_by_bundle_and_model_digests(fixture_bundle, tmp_path):
    """Rule: one walker of a tree that follows links (chexpercept/tree_walk.py, loops guarded), used
    by the bundle's image digest and the model's file list: an image inside a case folder that is a
    link elsewhere in the bundle, and a file of a model's linked processor/ folder, both count."""
    import os

    from chexpercept.bundle import read_bundle
    from chexpercept.eval.runner.identity import folder_fingerprint, model_files
    from chexpercept.file_digest import DigestCache

    bundle = tmp_path / "bundle"
    shutil.copytree(fixture_bundle, bundle)
    case = sorted(p for p in (bundle / "chexpercept").iterdir() if p.is_dir())[0]
    moved = bundle / "moved" / case.name
    moved.parent.mkdir()
    case.rename(moved)
    case.symlink_to(moved, target_is_directory=True)
    cache = DigestCache(tmp_path / "cache")
    before = read_bundle(bundle).images_fingerprint(cache)
    image = sorted(p for p in moved.rglob("*") if p.is_file())[0]
    image.write_bytes(image.read_bytes() + b"changed")
    assert read_bundle(bundle).images_fingerprint(cache) != before

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    shared = tmp_path / "shared-processor"
    shared.mkdir()
    (shared / "preprocessor_config.json").write_text('{"size": 1}')
    (model / "processor").symlink_to(shared, target_is_directory=True)
    (shared / "loop").symlink_to(model, target_is_directory=True)  # a loop back to the model
    os.symlink(".", model / "self")  # a link to the folder it sits in
    assert model_files(model) == ["config.json", "processor/preprocessor_config.json"]
    before = folder_fingerprint(model, cache)
    (shared / "preprocessor_config.json").write_text('{"size": 2}')
    assert folder_fingerprint(model, cache) != before


def test_an_alias_served_by_another_snapshot_stops_the_resume(fixture_bundle, tmp_path, capsys):
    """Session 1 answered as gpt-5.4-2025-08-06; session 2's server (at another --base-url) answers
    the same alias as gpt-5.4-2025-11-20: the resume says the URL changed, stops at the first answer
    with the served-model diff (nothing appended), and run.json counts every session's served models;
    a folder that mixes them anyway (edited by hand) is scored with a note."""
    from chexpercept.metrics.runs import read_chexpercept_run

    folder = tmp_path / "gpt-5.4" / "oracle_implicit"
    with FakeServer() as first:
        first.served = "gpt-5.4-2025-08-06"
        assert _run(fixture_bundle, tmp_path, "gpt-5.4", "--backend", "openai", "--base-url", first.url,
                    "--limit", "2") == 0  # fmt: skip
        first_url = first.url
    info = json.loads((folder / "run.json").read_text())
    assert set(info["backend_settings"]["served_models"]) == {"gpt-5.4-2025-08-06"}
    kept = (folder / "results.jsonl").read_text()
    capsys.readouterr()
    with FakeServer() as second:
        second.served = "gpt-5.4-2025-11-20"
        assert _run(fixture_bundle, tmp_path, "gpt-5.4", "--backend", "openai", "--base-url", second.url,
                    "--limit", "3") == 2  # fmt: skip
    err = capsys.readouterr().err
    assert f"base_url: '{first_url}' -> '{second.url}'" in err, err
    assert "served_model: 'gpt-5.4-2025-08-06' -> 'gpt-5.4-2025-11-20'" in err, err
    assert (folder / "results.jsonl").read_text() == kept

    records = [json.loads(line) for line in kept.splitlines()]
    for turn in records[0]["turns"]:
        turn["usage"]["served_model"] = "gpt-5.4-2025-11-20"
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    notes = read_chexpercept_run(folder).notes
    assert any("2 served models" in n and "gpt-5.4-2025-11-20" in n for n in notes), notes


@pytest.mark.parametrize("first_served,then_served", [("", "gpt-5.4-2025-11-20"), ("gpt-5.4-2025-08-06", "")])
def test_a_served_model_the_server_did_not_name_is_unknown_never_the_named_one(
    fixture_bundle, tmp_path, capsys, first_served, then_served
):
    """Session 1's server named no served model, session 2's named one (or the other way round): the
    resume went on, the unnamed answers were taken as the named model's, and run.json counted the
    named model alone (red team, stop 43). An unnamed served model is unknown: its own entry in the
    counts, and another than any named one."""
    from chexpercept.results import UNKNOWN_SERVED

    folder = tmp_path / "gpt-5.4" / "oracle_implicit"
    base = ["--backend", "openai"]
    with FakeServer() as server:
        server.served = first_served
        assert _run(fixture_bundle, tmp_path, "gpt-5.4", *base, "--base-url", server.url, "--limit", "2") == 0
        kept = (folder / "results.jsonl").read_text()
        capsys.readouterr()
        server.served = then_served
        assert _run(fixture_bundle, tmp_path, "gpt-5.4", *base, "--base-url", server.url, "--limit", "3") == 2
    err = capsys.readouterr().err
    said = [repr(m or UNKNOWN_SERVED) for m in (first_served, then_served)]
    assert f"served_model: {said[0]} -> {said[1]}" in err, err
    assert (folder / "results.jsonl").read_text() == kept
    from chexpercept.results import served_models

    records = [json.loads(line) for line in kept.splitlines()]
    usages = [t["usage"] for r in records for t in r["turns"]]
    usages[0] = (
        {**usages[0], "served_model": "x"}
        if not first_served
        else {k: v for k, v in usages[0].items() if k != "served_model"}
    )
    counts = served_models(usages)
    assert UNKNOWN_SERVED in counts and sum(counts.values()) == len(usages)


def test_another_engine_library_version_is_refused(fixture_bundle, tmp_path, tiny_model, capsys, monkeypatch):
    """A local backend's engine library builds the prompt and runs the model: a resume after
    transformers was upgraded is refused, naming it (an API's client library is not part of it)."""
    from importlib import metadata

    args = ["--backend", "transformers", "--limit", "1", "--max-tokens", "2"]
    assert _run(fixture_bundle, tmp_path, str(tiny_model), *args) == 0
    info = json.loads(next(tmp_path.rglob("run.json")).read_text())
    installed = metadata.version("transformers")
    assert info["settings"]["engine_versions"]["transformers"] == installed
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "99.0" if name == "transformers" else real(name))
    assert _run(fixture_bundle, tmp_path, str(tiny_model), *args) == 2
    _refused(capsys, f"engine_versions.transformers: '{installed}' -> '99.0'")


def test_a_file_named_by_an_option_counts_by_its_content(tmp_path):
    """A local path among the options that change answers (a tokenizer folder in --engine-args) is
    part of the identity by its content: the same path with another file in it is another identity."""
    from chexpercept.eval.backends.vllm.backend import VLLMBackend
    from chexpercept.eval.protocol import RunContext, Sampling
    from chexpercept.eval.registry import resolve
    from chexpercept.eval.runner.identity import with_file_contents

    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text('{"v": 1}')

    def identity():
        backend = VLLMBackend(
            resolve("medgemma-1.5-4b"),
            sampling=Sampling(0, 1, 8, True),
            engine_args={"tokenizer": str(tokenizer)},
        )
        return with_file_contents(backend.identity(RunContext(root=".", cases=[])))

    before = identity()
    assert before["engine_args"]["tokenizer"]["path"] == str(tokenizer)
    (tokenizer / "tokenizer.json").write_text('{"v": 2}')
    assert identity() != before


def test_a_relative_path_in_the_options_counts_by_its_content_too(tmp_path, monkeypatch):
    """Final red team: a chat template or tokenizer given relative to the working directory (as the
    engine opens it) counts by its content, as an absolute one does; words that name no file stay."""
    from chexpercept.eval.runner.identity import with_file_contents

    monkeypatch.chdir(tmp_path)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "chat.jinja").write_text("{{ messages }}")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    (tmp_path / "medium").write_text("a file that happens to be called as a value is")
    args = {"chat_template": "templates/chat.jinja", "tokenizer": "./tok", "dtype": "bfloat16"}
    args["reasoning_effort"] = "medium"  # red team: a word, not a path, whatever the folder holds
    before = with_file_contents({"engine_args": args})["engine_args"]
    assert before["chat_template"]["path"] == "templates/chat.jinja"
    assert before["tokenizer"]["content"] and before["dtype"] == "bfloat16"
    assert before["reasoning_effort"] == "medium"
    (tmp_path / "templates" / "chat.jinja").write_text("{{ messages | reverse }}")
    after = with_file_contents({"engine_args": args})["engine_args"]
    assert after["chat_template"] != before["chat_template"] and after["tokenizer"] == before["tokenizer"]


def test_a_bad_field_of_run_json_is_named_on_resume(fixture_bundle, tmp_path, capsys):
    """run.json's fields are read typed on resume as by score (RunMetadata): a hand-edited
    ``"resumed": 5`` is one line naming the file and the field, not a traceback."""
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "2") == 0
    run_json = tmp_path / "baseline-constant-1" / "oracle_implicit" / "run.json"
    info = json.loads(run_json.read_text())
    info["resumed"] = 5
    run_json.write_text(json.dumps(info))
    capsys.readouterr()
    assert _run(fixture_bundle, tmp_path, "baseline:constant:1", "--limit", "3") == 2
    err = capsys.readouterr().err
    assert str(run_json) in err and "resumed" in err and "internal error" not in err, err


def test_one_model_folder_holds_one_models_settings(fixture_bundle, tmp_path, capsys):
    """Final red team: a second model run under the same --run-name (or the same model on another
    bundle or at another temperature) put its settings folder beside the first's, and score combined
    them into one row (End-to-End from one model, Oracle-Passed from the other). The settings folders
    of one model folder now share one identity but the oracle."""
    from chexpercept.eval.run import main

    out = ["--output-dir", str(tmp_path), "--no-progress", "--no-score", "--limit", "2"]
    first = ["--data-dir", str(fixture_bundle), "--model", "baseline:constant:1", "--run-name", "exp1"]
    assert main([*first, "--oracle", "none", *out]) == 0
    other = ["--data-dir", str(fixture_bundle), "--model", "baseline:random", "--run-name", "exp1"]
    assert main([*other, "--oracle", "implicit", *out]) != 0
    err = capsys.readouterr().err
    assert "oracle_none: model_id" in err and "--run-name" in err, err
    assert not (tmp_path / "exp1" / "oracle_implicit" / "results.jsonl").exists()
    # the same model's other setting goes beside it
    assert main([*first, "--oracle", "implicit", *out]) == 0
    # a folder mixed by hand (or by an older version) is not scored as one model
    from chexpercept.cli import main as cli

    other2 = ["--data-dir", str(fixture_bundle), "--model", "baseline:random", "--run-name", "exp2"]
    assert main([*other2, "--oracle", "explicit", *out]) == 0
    (tmp_path / "exp2" / "oracle_explicit").rename(tmp_path / "exp1" / "oracle_explicit")
    capsys.readouterr()
    assert cli(["score", str(tmp_path / "exp1")]) != 0
    err = capsys.readouterr().err
    assert "made by different models or settings" in err and "model_id" in err, err


def test_a_folder_that_saved_nothing_binds_no_settings(fixture_bundle, tmp_path, capsys):
    """Red team: a run that stopped before its first case (here: an endpoint never reached; in the
    report: a backend whose package was missing) left run.json with its settings, and the rerun after
    the fix was refused for "other settings" although nothing had been saved. Rule: only a folder that
    holds a saved line (results, failures, quarantine) binds a later run (RunStore.holds_records); a
    sibling oracle folder that saved nothing is not compared either."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    extra = ["--backend", "openai", "--limit", "2", "--oracle", "none", "implicit"]
    assert _run(fixture_bundle, tmp_path, "gpt-5.4", *extra, "--base-url", dead, "--max-tokens", "100") == 2
    assert not (
        tmp_path / "gpt-5.4"
    ).exists()  # it saved nothing, so it left nothing (execute._forget_unsaved)
    # a folder left with settings and no saved line (by a start that failed in a multi-process run, or
    # by an older version): made here by emptying a finished run's files
    with FakeServer() as server:
        assert (
            _run(fixture_bundle, tmp_path, "gpt-5.4", *extra, "--base-url", server.url, "--max-tokens", "100")
            == 0
        )
    folder = tmp_path / "gpt-5.4" / "oracle_none"
    for setting in ("oracle_none", "oracle_implicit"):
        (tmp_path / "gpt-5.4" / setting / "results.jsonl").write_bytes(b"")
    assert (folder / "run.json").is_file() and not RunStore(folder).holds_records()
    capsys.readouterr()
    with FakeServer() as server:
        assert _run(fixture_bundle, tmp_path, "gpt-5.4", *extra, "--base-url", server.url) == 0
        assert server.requests
    err = capsys.readouterr().err
    assert "other settings" not in err, err
    info = json.loads((folder / "run.json").read_text())
    assert info["finished"] and info["settings"]["backend_identity"] != {}
    # once a line is saved, the settings bind again: the same change is refused
    with FakeServer() as server:
        assert (
            _run(fixture_bundle, tmp_path, "gpt-5.4", *extra, "--base-url", server.url, "--max-tokens", "100")
            == 2
        )
    _refused(capsys)
