"""chexpercept estimate: provider rules, the conversations counted, the command."""

from __future__ import annotations

import json
import shutil

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.cli import main as cli
from chexpercept.eval.estimate.count import ApiCounter, Estimate, estimate_oracle, walk
from chexpercept.eval.estimate.pricing import GEMINI3, OPENAI_GPT4, OPENAI_GPT5, call_cost, rules_for
from chexpercept.eval.protocol import Response
from chexpercept.testing import write_fixture_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("est") / "bundle"
    write_fixture_bundle(root, per_cell=2, image_size=1024, image_style="smooth", image_pool=3)
    return read_bundle(root)


def test_openai_tile_rule_matches_the_documented_examples():
    # platform.openai.com "calculating costs": 1024 x 1024 at high detail is 765 tokens (GPT-4o),
    # 2048 x 4096 is 1105 tokens (6 tiles)
    assert OPENAI_GPT4.image(1024, 1024) == 765
    assert OPENAI_GPT4.image(2048, 4096) == 1105
    assert OPENAI_GPT5.image(1024, 1024) == 70 + 4 * 140
    assert GEMINI3.image(1024, 1024) == GEMINI3.image(512, 300) == 1120
    assert rules_for("gpt-5.4-2026-03-05") is OPENAI_GPT5
    assert rules_for("gemini-3.1-pro-preview") is GEMINI3


def test_cached_prefix_rules():
    assert OPENAI_GPT5.cached(1023) == 0
    assert OPENAI_GPT5.cached(1024) == 1024
    assert OPENAI_GPT5.cached(1300) == 1280  # steps of 128
    assert GEMINI3.cached(7999) == 0 and GEMINI3.cached(9000) == 9000


def test_call_cost_uses_the_paper_price_table():
    # gpt-5.4: 2.50 / 0.25 / 15.00 USD per 1M tokens
    assert call_cost("gpt-5.4-2026-03-05", 1_000_000, 400_000, 100_000) == pytest.approx(
        0.6 * 2.5 + 0.4 * 0.25 + 0.1 * 15
    )
    assert call_cost("some-local-model", 10, 0, 10) is None  # no price: unknown, never $0


def test_estimate_counts_exactly_the_turns_and_images_run_sends(bundle):
    seen = []
    walk(
        bundle.cases,
        "implicit",
        lambda case: lambda r: Response(text="Answer: 1"),
        lambda r, p: seen.append(r),
    )
    assert len(seen) == sum(len(c.tasks) for c in bundle.cases)
    counter = ApiCounter(bundle.root, OPENAI_GPT5, text=lambda s: len(s.split()), answer_tokens=50)
    est = estimate_oracle(
        bundle.cases, "none", counter, model_id="gpt-5.4", scenario="all_right", answer_tokens=50
    )
    assert est.calls == len(seen) and est.cases == len(bundle.cases)
    images_sent = sum(len(r.images) for r in seen)
    assert est.input_image_tokens == images_sent * 630
    assert est.output_tokens == 50 * est.calls
    # every call re-sends the history: the cached prefix is the previous call's prompt, so at least
    # the images of all turns but the first of each case are billed as cached
    assert est.cached_input_tokens > 0
    assert est.cost_usd < est.cost_usd_without_cache


def test_explicit_oracle_texts_make_the_all_wrong_scenario_longer(bundle):
    counter = ApiCounter(bundle.root, OPENAI_GPT5, text=lambda s: len(s), answer_tokens=10)
    right = estimate_oracle(bundle.cases, "explicit", counter, model_id="gpt-5.4", scenario="all_right")
    wrong = estimate_oracle(bundle.cases, "explicit", counter, model_id="gpt-5.4", scenario="all_wrong")
    assert wrong.input_text_tokens > right.input_text_tokens
    assert wrong.calls == right.calls  # every turn is asked whatever the answers


def test_estimate_command_markdown_and_json(bundle, tmp_path, capsys):
    assert cli(["estimate", "--data-dir", str(bundle.root), "--model", "gpt-5.4", "--per-cell", "1"]) == 0
    out = capsys.readouterr().out
    assert "| none | 21 |" in out and "**total**" in out
    target = tmp_path / "e.json"
    args = ["estimate", "--data-dir", str(bundle.root), "--model", "gemini-3.1-pro", "--oracle", "implicit"]
    assert cli([*args, "--format", "json", "--output", str(target), "--tokens-per-second", "1000"]) == 0
    data = json.loads(target.read_text())
    est = data["estimates"]["implicit"]["min"]
    assert est["calls"] == sum(len(c.tasks) for c in bundle.cases)
    assert est["seconds"] == pytest.approx(
        (est["input_tokens"] - est["cached_input_tokens"] + est["output_tokens"]) / 1000, abs=0.1
    )


def test_estimate_refuses_baselines_and_bad_selections(bundle, capsys):
    assert cli(["estimate", "--data-dir", str(bundle.root), "--model", "baseline:prior"]) == 2
    assert "makes no model calls" in capsys.readouterr().err
    assert cli(["estimate", "--data-dir", str(bundle.root), "--model", "gpt-5.4", "--lesions", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_local_model_counts_with_its_own_processor(bundle, tiny_model, capsys):
    args = [
        "estimate",
        "--data-dir",
        str(bundle.root),
        "--model",
        str(tiny_model),
        "--backend",
        "transformers",
    ]
    assert cli([*args, "--oracle", "none", "--limit", "3", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    est = data["estimates"]["none"]["min"]
    assert data["exact"] is True and "Processor" in data["counter"]
    assert est["input_image_tokens"] > 0 and est["cost_usd"] is None


def test_estimate_total_is_the_sum(bundle):
    from chexpercept.eval.estimate.count import total

    counter = ApiCounter(bundle.root, OPENAI_GPT5, text=len, answer_tokens=5)
    parts = [
        estimate_oracle(bundle.cases, o, counter, model_id="gpt-5.4", scenario="all_right")
        for o in ("none", "implicit")
    ]
    summed = total(parts, "min")
    assert isinstance(summed, Estimate)
    assert summed.calls == sum(p.calls for p in parts)
    assert summed.cost_usd == pytest.approx(sum(p.cost_usd for p in parts))


def test_recorded_estimate_against_usage_a_loopback_api_reports(tmp_path):
    """The estimator's error made visible: a phantom run through the openai backend against a server
    that reports usage the way the API counts it, then the same conversations estimated."""
    from chexpercept.eval.estimate.count import compare, estimate_recorded

    from .fake_openai import FakeServer, RealisticUsage, backend_for, run_cases

    root = write_fixture_bundle(
        tmp_path / "b", per_cell=1, image_size=1024, image_style="smooth", image_pool=2
    )
    bundle = read_bundle(root)
    with FakeServer(usage=RealisticUsage(reasoning=200)) as server:
        results = run_cases(backend_for(server), bundle)
    counter = ApiCounter(bundle.root, rules_for("gpt-5.4-2026-03-05"))
    estimate = estimate_recorded(bundle.cases, results, "implicit", counter, model_id="gpt-5.4-2026-03-05")
    comparison = compare(estimate, results)
    assert comparison.actual["calls"] == estimate.calls == sum(len(c.tasks) for c in bundle.cases)
    # same route, same images, same outputs: only the text tokenizer differs
    assert comparison.actual["output_tokens"] == estimate.output_tokens == 240 * estimate.calls
    assert abs(comparison.relative_error["input_tokens"]) < 0.10
    assert abs(comparison.relative_error["cached_input_tokens"]) < 0.15
    assert abs(comparison.relative_error["cost_usd"]) < 0.10


def test_score_details_sets_the_estimate_beside_the_reported_usage(tmp_path, capsys):
    """A real run through the openai backend (loopback API reporting usage as the API counts it):
    run.json records the estimate of the conversations the run had, score --details shows it."""
    from chexpercept.eval.run import main as run_main

    from .fake_openai import FakeServer, RealisticUsage

    root = write_fixture_bundle(
        tmp_path / "b", per_cell=1, image_size=1024, image_style="smooth", image_pool=2
    )
    with FakeServer(usage=RealisticUsage(reasoning=100)) as server:
        argv = ["--data-dir", str(root), "--model", "gpt-5.4", "--base-url", server.url, "--paths", "RF"]
        argv += ["--oracle", "implicit"]  # the setting this bound was measured on (see below for none)
        rc = run_main([*argv, "--output-dir", str(tmp_path / "runs"), "--no-progress", "--no-score"])
    assert rc == 0
    capsys.readouterr()
    assert cli(["score", str(tmp_path / "runs" / "gpt-5.4"), "--details"]) == 0
    details = json.loads(capsys.readouterr().out)
    usage = details["runs"][0]["usage"]
    assert (
        usage["actual"]["calls"] == usage["estimated"]["calls"] == 7 * 6 - 4
    )  # RF: 6 turns, 4 for cardiomegaly
    assert (
        usage["actual"]["output_tokens"]
        == usage["estimated"]["output_tokens"]
        == 140 * usage["actual"]["calls"]
    )
    assert usage["actual"]["input_tokens"] > 0 and abs(usage["relative_error"]["input_tokens"]) < 0.10
    assert usage["actual"]["cost_usd"] > 0 and abs(usage["relative_error"]["cost_usd"]) < 0.10


def test_local_estimate_resends_earlier_answers_at_the_assumed_length(bundle, tiny_model, capsys):
    """Earlier answers are re-sent at --answer-tokens for local models too (found by a new user:
    only the output column moved)."""
    base = ["estimate", "--data-dir", str(bundle.root), "--model", str(tiny_model), "--backend", "vllm"]
    totals = {}
    for n in (1, 1000):
        args = [*base, "--paths", "RR", "--limit", "2", "--oracle", "none", "--answer-tokens", str(n)]
        assert cli([*args, "--format", "json"]) == 0
        est = json.loads(capsys.readouterr().out)["estimates"]["none"]["min"]
        totals[n] = est
    calls = totals[1]["calls"]
    earlier_answers = sum(range(calls // 2)) * 2  # 2 cases: turn k re-sends k earlier answers
    assert totals[1000]["input_tokens"] - totals[1]["input_tokens"] == 999 * earlier_answers
    assert totals[1000]["cached_input_tokens"] > totals[1]["cached_input_tokens"]


def test_from_run_needs_a_timed_run_of_the_same_model(bundle, tmp_path, capsys):
    from chexpercept.eval.run import main as run_main

    out = tmp_path / "runs"
    assert run_main(["--data-dir", str(bundle.root), "--model", "baseline:prior", "--output-dir", str(out),
                     "--no-progress", "--no-score", "--limit", "3"]) == 0  # fmt: skip
    args = ["estimate", "--data-dir", str(bundle.root), "--model", "gpt-5.4", "--oracle", "none"]
    assert cli([*args, "--from-run", str(out / "baseline-prior" / "oracle_implicit")]) == 2
    assert "cannot time 'gpt-5.4-2026-03-05'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one way to give the throughput
        cli([*args, "--from-run", str(out), "--tokens-per-second", "10"])
    target = tmp_path / "new" / "folder" / "e.md"  # written into a folder that exists, as > writes
    with pytest.raises(SystemExit):
        cli([*args, "--output", str(target)])
    assert "does not exist" in capsys.readouterr().err and not target.parent.parent.exists()
    target.parent.mkdir(parents=True)
    assert cli([*args, "--output", str(target)]) == 0 and target.is_file()


@pytest.fixture(scope="module")
def mixed_sizes(tmp_path_factory):
    """Two lesions' cells with images of several sizes (the processor's expansion is learned per size)."""
    from PIL import Image

    root = write_fixture_bundle(
        tmp_path_factory.mktemp("sizes") / "b", per_cell=1, image_size=64, image_style="smooth",
        lesions=("cardiomegaly", "effusion"),
    )  # fmt: skip
    for i, png in enumerate(sorted(root.rglob("*.png"))):
        if i % 3 == 0:
            Image.new("RGB", (48 + 16 * (i % 4), 80), (i * 7 % 256, 90, 30)).save(png)
    return read_bundle(root)


def test_local_count_once_per_shape_equals_the_processor_on_every_call(mixed_sizes, tiny_model):
    """The fast count (template and image tokens once per shape) gives the same numbers as the
    processor on every call's real images, the way the estimate counted before."""
    from chexpercept.eval.estimate.count import estimate_bounds, sample_calls
    from chexpercept.eval.estimate.local_tokens import ProcessorCounter
    from chexpercept.results import ORACLE_SETTINGS

    cases = mixed_sizes.cases
    fast = ProcessorCounter(mixed_sizes.root, str(tiny_model), answer_tokens=700)
    fast.check(sample_calls(cases, ORACLE_SETTINGS))
    assert fast.strategy == "pieces" and "same ids as the processor on 24 sample calls" in fast.name
    slow = ProcessorCounter(mixed_sizes.root, str(tiny_model), answer_tokens=700, strategy="processor")
    for oracle in ORACLE_SETTINGS:
        for a, b in zip(
            estimate_bounds(cases, oracle, fast, model_id="m", answer_tokens=700),
            estimate_bounds(cases, oracle, slow, model_id="m", answer_tokens=700),
        ):
            assert {**a.as_dict(), "counter": ""} == {**b.as_dict(), "counter": ""}
    assert len(fast._expansions) >= 3  # one per image size met, each learned once
    requests: list = []
    walk(
        cases[:3], "implicit", lambda c: lambda r: Response(text="Answer: 1"), lambda r, p: requests.append(r)
    )
    assert all(fast.ids(r) == slow.exact_ids(r) for r in requests)
    # image tokens are the image's feature tokens (the tiny Gemma 3: 4 per image), not one marker per
    # image (Gemma 3's processor calls its start-of-image marker image_token)
    assert fast.tokenizer.convert_ids_to_tokens([fast.image_token_id]) == ["<image_soft_token>"]
    assert all(fast.count(r, None).image == 4 * len(r.images) for r in requests)


def test_local_count_falls_back_to_the_processor_when_a_fast_way_differs(
    mixed_sizes, tiny_model, monkeypatch
):
    from chexpercept.eval.estimate.count import sample_calls
    from chexpercept.eval.estimate.local_tokens import ProcessorCounter

    calls = sample_calls(mixed_sizes.cases, ["implicit"])
    counter = ProcessorCounter(mixed_sizes.root, str(tiny_model))
    monkeypatch.setattr(counter, "_piece_ids", lambda text: [0])
    counter.check(calls)
    assert counter.strategy == "text" and "tokenized" in counter.name  # the next way that agrees
    monkeypatch.setattr(counter, "_text_ids", lambda text: [0])
    counter.strategy = "pieces"
    counter.check(calls)
    assert counter.strategy == "processor" and "differed from the processor" in counter.name
    request = calls[0]
    assert counter.count(request, None).total == len(counter.exact_ids(request))


def test_from_run_times_the_answer_length_asked_for(tiny_model, tmp_path, capsys):
    """--from-run measures tokens per second on the trial's own conversations, so the time follows
    --answer-tokens (before, it was the trial's seconds per case whatever the answers' length), and
    the trial's own cases at its own answer length take about the trial's time."""
    from chexpercept.eval.run import main as run_main
    from chexpercept.testing import write_fixture_bundle

    root = write_fixture_bundle(tmp_path / "bundle", per_cell=1, image_size=64)
    out = tmp_path / "runs"
    trial = ["--data-dir", str(root), "--model", str(tiny_model), "--backend", "transformers",
             "--max-tokens", "4", "--limit", "4", "--oracle", "implicit"]  # fmt: skip
    assert run_main([*trial, "--output-dir", str(out), "--no-progress", "--no-score"]) == 0
    capsys.readouterr()
    folder = out / "tiny-vlm" / "oracle_implicit"
    took = json.loads((folder / "run.json").read_text())["last_session"]["seconds_main_process"]
    estimates = {}
    for answer in (4, 400):
        args = ["estimate", "--data-dir", str(root), "--model", str(tiny_model), "--backend", "transformers",
                "--oracle", "implicit", "--limit", "4", "--from-run", str(folder), "--answer-tokens", str(answer),
                "--format", "json"]  # fmt: skip
        assert cli(args) == 0
        estimates[answer] = json.loads(capsys.readouterr().out)
    short, long = (estimates[a]["estimates"]["implicit"] for a in (4, 400))

    def processed(e: dict) -> int:
        return e["input_tokens"] - e["cached_input_tokens"] + e["output_tokens"]

    # one rate for both lengths: the time grows with the tokens counted (seconds are rounded to 0.1)
    rate = processed(long["max"]) / long["max"]["seconds"]
    for bound in ("min", "max"):
        assert long[bound]["seconds"] == pytest.approx(processed(long[bound]) / rate, abs=0.1, rel=0.01)
        assert short[bound]["seconds"] == pytest.approx(processed(short[bound]) / rate, abs=0.1)
    assert long["min"]["seconds"] > 5 * short["max"]["seconds"]
    assert 0.5 * short["min"]["seconds"] <= took <= 2 * short["max"]["seconds"]
    assert any(n.startswith("time from ") for n in estimates[4]["notes"])
    assert not any("far from --answer-tokens" in n for n in estimates[4]["notes"])
    assert any("far from --answer-tokens 400" in n for n in estimates[400]["notes"])
    # a trial run on another bundle (the same key ids, other questions) times nothing (red team, stop 44)
    other = tmp_path / "other"
    shutil.copytree(root, other)
    index = other / "chexpercept.json"
    index.write_text(index.read_text().replace("Is any finding", "Is there any finding", 3))
    args = ["estimate", "--data-dir", str(other), "--model", str(tiny_model), "--backend", "transformers",
            "--oracle", "implicit", "--limit", "4", "--from-run", str(folder)]  # fmt: skip
    assert cli(args) == 2
    assert "the trial was run on another bundle" in capsys.readouterr().err


def test_a_trial_runs_json_with_a_time_that_is_not_one_is_refused(tmp_path):
    """A run.json whose session time was NaN, true or 1e-320 gave "nan tokens per second" or an
    infinite rate (red team, stop 42): the time is read within its domain, naming the field."""
    from chexpercept.eval.estimate.command import timed_session

    for seconds in ("NaN", "true", "1e-320", "-4", '"12"'):
        (tmp_path / "run.json").write_text(
            f'{{"model_id": "m", "backend": "vllm", "last_session": {{"seconds_main_process": {seconds}, "cases": 4}}}}'
        )
        with pytest.raises(ValueError, match="no timed session|ran no case"):
            timed_session(str(tmp_path), "m")


def test_a_trial_whose_server_reported_no_output_tokens_times_nothing(bundle, tmp_path, capsys):
    """A trial against a server that reported no usage: estimate --from-run took each unknown answer
    as the estimator's 1,000 tokens and printed the rate and "its answers 1,000 output tokens on
    average" as measured (red team, stop 43). What a server did not say is unknown: no rate is made
    of it."""
    from fake_openai import FakeServer

    from chexpercept.eval.run import main as run_main

    out = tmp_path / "runs"
    with FakeServer(usage=lambda body: None) as server:
        assert run_main(["--data-dir", str(bundle.root), "--model", "m", "--backend", "openai", "--base-url",
                         server.url, "--output-dir", str(out), "--no-progress", "--no-score", "--limit", "3",
                         "--oracle", "implicit"]) == 0  # fmt: skip
    capsys.readouterr()
    args = ["estimate", "--data-dir", str(bundle.root), "--model", "m", "--backend", "openai",
            "--oracle", "implicit", "--limit", "3", "--from-run", str(out / "m" / "oracle_implicit")]  # fmt: skip
    assert cli(args) == 2
    err = capsys.readouterr().err
    assert "answers have no output token count" in err and "throughput cannot be measured" in err, err
