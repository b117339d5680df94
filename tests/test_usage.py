"""What a server did not report is unknown, never zero (chexpercept.usage): a reply without a ``usage``
object, one with only some counts, a model without a price. Unknown is null in results.jsonl (each
turn and the case's totals), in run.json's estimate, in ``score --details``, and printed as
"unknown" or "at least X (N of M calls unreported)", never as 0 tokens or $0.00."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from chexpercept.cli import main as cli
from chexpercept.eval.estimate.count import DEFAULT_ANSWER_TOKENS
from chexpercept.eval.estimate.pricing import call_cost
from chexpercept.eval.run import main
from chexpercept.results import iter_results
from chexpercept.usage import sum_usage, total

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import USAGE, FakeServer

TOKENS = ("input_tokens", "cached_input_tokens", "output_tokens", "thinking_tokens", "total_tokens")


def run(bundle: Path, out: Path, server: FakeServer, model: str = "gpt-5.4") -> int:
    argv = ["--data-dir", str(bundle), "--model", model, "--backend", "openai", "--base-url", server.url]
    return main([*argv, "--output-dir", str(out), "--no-progress", "--no-score", "--paths", "RF"])


def details(run_dir: Path, capsys) -> dict:
    capsys.readouterr()
    assert cli(["score", str(run_dir), "--details"]) == 0
    return json.loads(capsys.readouterr().out)["runs"][0]["usage"]


def test_a_reply_without_usage_is_unknown_everywhere_not_zero(fixture_bundle, tmp_path, capsys):
    with FakeServer(usage=lambda body: None) as server:
        assert run(fixture_bundle, tmp_path, server) == 0
    out = capsys.readouterr().out
    folder = tmp_path / "gpt-5.4" / "oracle_implicit"
    records = list(iter_results(folder / "results.jsonl"))
    turn = records[0].turns[0]
    assert all(turn.usage[k] is None for k in (*TOKENS, "cost_usd")), turn.usage
    calls = records[0].usage["num_calls"]
    assert records[0].usage["input_tokens"] is None and records[0].usage["cost_usd"] is None
    assert records[0].usage["unreported_calls"]["output_tokens"] == calls
    estimate = json.loads((folder / "run.json").read_text())["estimate"]
    assert estimate["actual"]["input_tokens"] is None and estimate["actual"]["cost_usd"] is None
    n = estimate["actual"]["calls"]
    assert (
        estimate["unreported_calls"]["input_tokens"] == n and estimate["relative_error"]["cost_usd"] is None
    )
    # the replay's answers: the estimator's assumed length, not 0 tokens
    assert estimate["estimated"]["output_tokens"] == DEFAULT_ANSWER_TOKENS * n
    assert f"no call reported usage ({n} calls): tokens and cost unknown" in out, out  # not "reported for"
    assert "$0.00" not in out
    shown = details(tmp_path / "gpt-5.4", capsys)
    assert shown["actual"]["output_tokens"] is None and shown["unreported_calls"]["output_tokens"] == n


def test_partial_usage_keeps_what_was_said_and_sums_say_at_least(fixture_bundle, tmp_path, capsys):
    partial = {"prompt_tokens": 1000}  # no completion_tokens, no details, no total
    replies = iter([USAGE, partial] * 100)
    with FakeServer(usage=lambda body: next(replies)) as server:
        assert run(fixture_bundle, tmp_path, server) == 0
    out = capsys.readouterr().out
    records = list(iter_results(tmp_path / "gpt-5.4" / "oracle_implicit" / "results.jsonl"))
    turns = [t for r in records for t in r.turns]
    cut = [t for t in turns if t.usage["output_tokens"] is None]
    assert cut and all(t.usage["input_tokens"] == 1000 and t.usage["cost_usd"] is None for t in cut)
    assert all(t.usage["cached_input_tokens"] is None and t.usage["total_tokens"] is None for t in cut)
    mixed = next(
        r for r in records if 0 < sum(t.usage["output_tokens"] is None for t in r.turns) < len(r.turns)
    )
    assert mixed.usage["input_tokens"] == 1000 * len(mixed.turns)  # every call reported it
    assert mixed.usage["output_tokens"] is None and mixed.usage["unreported_calls"]["output_tokens"] > 0
    known = 50 * (len(turns) - len(cut))
    assert f"output tokens at least {known:,} ({len(cut)} of {len(turns)} calls unreported)" in out, out


def test_a_model_without_a_price_has_an_unknown_cost_not_0_usd(fixture_bundle, tmp_path, capsys):
    with FakeServer() as server:
        assert run(fixture_bundle, tmp_path, server, model="local-vlm") == 0
    out = capsys.readouterr().out
    record = next(iter_results(tmp_path / "local-vlm" / "oracle_implicit" / "results.jsonl"))
    assert record.turns[0].usage["cost_usd"] is None and record.usage["cost_usd"] is None
    assert record.turns[0].usage["input_tokens"] == 1000  # the tokens are known
    assert "cost unknown (no price)" in out
    assert call_cost("my-local-model", 10, 0, 10) is None and call_cost("gpt-5.4", 10, None, 10) is None


def test_a_usage_that_contradicts_itself_is_unknown_not_a_negative_cost(fixture_bundle, tmp_path, capsys):
    """Cached input over the prompt (or reasoning over the completion) cannot be: both figures are
    unknown, never a negative uncached input priced into a negative cost."""
    impossible = {
        "prompt_tokens": 100,
        "completion_tokens": 10,
        "total_tokens": 110,
        "prompt_tokens_details": {"cached_tokens": 5000},
        "completion_tokens_details": {"reasoning_tokens": 50},
    }
    with FakeServer(usage=lambda body: impossible) as server:
        assert run(fixture_bundle, tmp_path, server) == 0
    out = capsys.readouterr().out
    records = list(iter_results(tmp_path / "gpt-5.4" / "oracle_implicit" / "results.jsonl"))
    for turn in (t for r in records for t in r.turns):
        assert turn.usage["total_tokens"] == 110  # what does not contradict anything is kept
        assert turn.usage["input_tokens"] is None and turn.usage["cached_input_tokens"] is None
        assert turn.usage["output_tokens"] is None and turn.usage["thinking_tokens"] is None
        assert turn.usage["cost_usd"] is None
    assert all(r.usage["cost_usd"] is None for r in records)
    assert "$-" not in out and "-$" not in out
    assert call_cost("gpt-5.4", 100, 5000, 10) is None and call_cost("gpt-5.4", 100, -1, 10) is None


def test_sums_are_unknown_when_any_part_is():
    assert total([3, 4]).value == 7 and total([3, None]).value is None
    assert total([3, None, 2]).text() == "at least 5 (1 of 3 calls unreported)"
    assert total([None, None]).text() == "unknown" and total([]).text() == "0"
    summed = sum_usage([{"input_tokens": 5, "attempts": 1}, {"input_tokens": None}])
    assert summed == {"input_tokens": None, "unreported_calls": {"input_tokens": 1}}
    assert sum_usage([{"output_tokens": 2}, {}]) == {
        "output_tokens": None,
        "unreported_calls": {"output_tokens": 1},
    }


def test_a_temperature_left_to_the_server_is_not_published_as_0(fixture_bundle, tmp_path):
    """--request-extra '{"temperature": null}' leaves the temperature to the server: the Hub's eval
    results say "server default", never "temperature 0" (which reads as greedy)."""
    import yaml
    from fake_openai import FakeServer

    from chexpercept.metrics.hub.eval_results import stage_eval_results

    with FakeServer() as server:  # a real run whose temperature was left to the server
        args = ["--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai"]
        args += ["--base-url", server.url, "--output-dir", str(tmp_path), "--oracle", "implicit"]
        extra = ["--request-extra", '{"temperature": null}', "--max-tokens", "64"]
        assert main([*args, *extra, "--no-progress", "--no-score", "--limit", "3"]) == 0
    meta = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
    assert meta["sampling"] == {"temperature": None, "top_p": 1.0, "max_tokens": 64, "greedy": False}
    staged = stage_eval_results(
        tmp_path / "local-vlm",
        tmp_path / "staged",
        benchmark="org/chexpercept",
        source_url="https://huggingface.co/datasets/org/chexpercept",
        allow_synthetic=True,
    )
    assert list(staged.verify())  # the guard's schema accepts it
    (path,) = (tmp_path / "staged" / ".eval_results").glob("*.yaml")
    notes = [e["notes"] for e in yaml.safe_load(path.read_text())]
    assert notes and all("sampled (temperature server default, top_p 1.0)" in n for n in notes), notes


def test_inspect_usage_goes_through_the_same_rule():
    """The Inspect harness records a provider's usage by the same rule (chexpercept.usage.call_usage)."""
    from types import SimpleNamespace

    from chexpercept.eval.harnesses.inspect_ai.messages import usage

    said = dict(input_tokens=10, input_tokens_cache_write=None, output_tokens=5, total_tokens=15)
    fine = usage(SimpleNamespace(**said, input_tokens_cache_read=90, reasoning_tokens=None, total_cost=None))
    assert (
        fine["input_tokens"] == 100 and fine["cached_input_tokens"] == 90 and fine["thinking_tokens"] is None
    )
    bad = usage(SimpleNamespace(**said, input_tokens_cache_read=-3, reasoning_tokens=9, total_cost=0.5))
    assert bad["cached_input_tokens"] is None and bad["input_tokens"] is None  # a negative count: unknown
    assert bad["thinking_tokens"] is None and bad["output_tokens"] is None and bad["cost_usd"] == 0.5


def test_a_count_is_ascii_digits_within_reason_or_unknown():
    """Red team: ``"²"`` passed ``str.isdigit`` and ``int()`` then raised, ending the run; 5,000
    digits did too (Python's limit), and ``1e300`` tokens priced a call at $1e294."""
    from chexpercept.usage import MAX_COUNT, call_usage, count

    for bad in ("²", "٣", "1" * 5000, 1e300, float("nan"), -1, "1e3", " ", MAX_COUNT + 1, True):
        assert count(bad) is None, bad
    assert count(" 42 ") == 42 and count(7.0) == 7 and count(MAX_COUNT) == MAX_COUNT
    usage = call_usage({"input_tokens": 100, "output_tokens": 10, "total_tokens": 50})
    assert usage == {"input_tokens": 100, "output_tokens": 10, "total_tokens": None}
