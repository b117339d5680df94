"""Loud warnings when answers cannot be read (metrics/answer_warnings.py), in score, report and run."""

import json

import pytest

from chexpercept.cli import main
from chexpercept.metrics import run_from_records, score_model
from chexpercept.metrics.answer_warnings import answer_warnings, parse_rate_table, warning_lines
from chexpercept.metrics.simulate import fixture_cases, simulate_records


def _scores(respond, *, oracle="implicit", mode="reference", max_tokens=None, name="m"):
    cases = fixture_cases(per_cell=4, seed=1)
    records = simulate_records(cases, respond, oracle=oracle, mode=mode)
    run = run_from_records(records, oracle=oracle, greedy=True, model=name)
    if max_tokens is not None:
        from chexpercept.run_metadata import SamplingInfo

        run.meta.sampling = SamplingInfo(temperature=0.0, top_p=1.0, max_tokens=max_tokens, greedy=True)
        for rec in records:
            for t in rec.turns:
                t.usage = {"output_tokens": max_tokens}
    return score_model([run], mode=mode, name=name)


def test_a_model_whose_answers_cannot_be_read_gets_a_warning_naming_every_task():
    scores = _scores(lambda case, turn: " a a a a a a a a", max_tokens=8)
    (warning,) = answer_warnings(scores)
    assert warning.kind == "unparsed" and warning.oracle == "implicit"
    assert {t.task for t in warning.tasks} == set(scores.parse["implicit"])
    assert warning.share == 1.0
    assert warning.at_token_limit == warning.count  # every reply used the whole budget
    text = warning.text()
    assert "100% of the answers could not be read" in text and "in every task" in text
    assert "--max-tokens 8" in text and "chat template" in text
    lines = warning_lines(scores)
    assert lines[0].startswith("WARNING: m, oracle implicit run (reference parsing)")
    assert any(line.startswith("  look at:") for line in lines)


def test_replies_that_spend_a_large_budget_are_not_told_to_raise_it():
    """A short budget used up: raise it. A large one used up (8192, the default): the model does not
    stop, and more tokens will not help (a new user was told to lower it before the run and to
    raise it after)."""
    short = answer_warnings(_scores(lambda case, turn: " a a a", max_tokens=8))[0].text()
    large = answer_warnings(_scores(lambda case, turn: " a a a", max_tokens=8192))[0].text()
    assert "raise --max-tokens" in short and "never stopped" not in short
    assert "raise --max-tokens" not in large
    assert "--max-tokens 8192" in large and "never stopped" in large and "stop tokens" in large


def test_unreadable_answers_in_one_task_only_name_that_task():
    def respond(case, turn):
        return "no idea" if turn.task == "severity" else True

    (warning,) = answer_warnings(_scores(respond))
    assert [t.task for t in warning.tasks] == ["severity"]
    assert "in severity" in warning.headline() and "every task" not in warning.headline()
    # no token budget recorded: the cause is still named, without a count
    assert any("--max-tokens" in c for c in warning.causes())


def test_a_share_at_or_under_the_threshold_is_not_warned_about():
    seen = {"n": 0}

    def respond(case, turn):  # one detection answer in ten unreadable
        if turn.task != "detection":
            return True
        seen["n"] += 1
        return "hm" if seen["n"] % 10 == 0 else True

    scores = _scores(respond)
    assert answer_warnings(scores) == []
    assert answer_warnings(scores, threshold=0.05)[0].tasks[0].task == "detection"
    with pytest.raises(ValueError, match="threshold"):
        answer_warnings(scores, threshold=1.5)


def test_refusals_are_their_own_warning_with_their_own_cause():
    cases = fixture_cases(per_cell=2, seed=2)
    records = simulate_records(cases, lambda c, t: True, oracle="none")
    for rec in records:
        for t in rec.turns:
            if t.task == "detection":
                t.refusal = "I cannot help with medical images."
    scores = score_model([run_from_records(records, oracle="none", greedy=True)], name="api")
    kinds = {w.kind: w for w in answer_warnings(scores)}
    assert set(kinds) == {"refused"}  # refusals are not also counted as ordinary unparsed answers
    assert "refusal" in kinds["refused"].causes()[0] and "content filter" in kinds["refused"].causes()[0]


def test_answers_read_from_unfinished_reasoning_are_warned_about_in_reference_mode():
    def respond(case, turn):
        gold = ",".join(map(str, turn.answer_index))
        return f"<think>Looking at the image. Answer: {gold}"  # cut off inside its reasoning

    reference = _scores(respond)
    (warning,) = answer_warnings(reference)
    assert warning.kind == "reasoning" and "reasoning" in warning.headline()
    strict = _scores(respond, mode="strict")
    assert {w.kind for w in answer_warnings(strict)} == {"unparsed"}
    assert any("--parse-mode strict" in c for c in answer_warnings(strict)[0].causes())


def test_details_and_the_parse_rate_table_carry_the_warnings():
    scores = _scores(lambda case, turn: "???", max_tokens=16)
    data = scores.to_dict()
    assert data["warnings"][0]["kind"] == "unparsed" and data["warnings"][0]["max_tokens"] == 16
    table = parse_rate_table([scores])
    row = next(line for line in table.splitlines() if "| detection |" in line)
    assert "| 0% | 100% | 0% | 0% |" in row  # read, unparsed, refused, from reasoning


def _write_run(folder, records, *, max_tokens=8):
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    meta = {
        "model": folder.parent.name,
        "oracle": "implicit",
        "parse_mode": "reference",
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "greedy": True},
        "finished": "2026-11-29T10:00:00",
    }
    (folder / "run.json").write_text(json.dumps(meta))


@pytest.fixture
def unreadable_runs(tmp_path):
    cases = fixture_cases(per_cell=1, seed=3)
    bad = simulate_records(cases, lambda c, t: " a a a a a a a a", oracle="implicit")
    for rec in bad:
        for t in rec.turns:
            t.usage = {"output_tokens": 8}
    _write_run(tmp_path / "runs" / "tiny" / "oracle_implicit", bad)
    good = simulate_records(cases, lambda c, t: True, oracle="implicit")
    _write_run(tmp_path / "runs" / "good" / "oracle_implicit", good)
    return tmp_path / "runs"


def test_score_prints_the_warning_on_stderr_and_in_details(unreadable_runs, capsys):
    assert main(["score", str(unreadable_runs / "tiny")]) == 0
    out, err = capsys.readouterr()
    assert "WARNING: tiny, oracle implicit run" in err and "--max-tokens 8" in err
    assert main(["score", str(unreadable_runs / "good"), "--details"]) == 0
    out, err = capsys.readouterr()
    assert "WARNING" not in err and json.loads(out)["warnings"] == []


def test_the_report_shows_the_warning_and_the_parse_rates(unreadable_runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "report"
    code = main(
        [
            "report",
            "--results",
            str(unreadable_runs),
            "--output-dir",
            str(out_dir),
            "--bootstrap",
            "0",
            "--no-plots",
        ]
    )
    assert code == 0
    _, err = capsys.readouterr()
    assert "WARNING: tiny, oracle implicit run" in err and "WARNING: good" not in err
    page = (out_dir / "index.html").read_text()
    assert "<strong>Unreadable answers.</strong> tiny, oracle implicit run" in page
    assert 'id="answers"' in page and "Answers read" in page
    assert page.count("<td>detection</td>") == 2  # one parse-rate row per model run


def test_the_end_of_a_run_prints_the_warning(unreadable_runs, capsys):
    from chexpercept.metrics.api import print_model_scores as print_scores

    print_scores(unreadable_runs / "tiny", "tiny", "reference")
    out, err = capsys.readouterr()
    assert "Table 2" in out and "WARNING: tiny, oracle implicit run" in err
    assert "(+x): OP minus E2E" in out  # the gain in brackets is explained where it is printed


def test_the_same_finding_in_two_runs_of_a_model_is_said_once(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    cases = fixture_cases(per_cell=1, seed=3)
    for oracle in ("none", "implicit"):
        bad = simulate_records(cases, lambda c, t: " a a a a a a a a", oracle=oracle)
        for rec in bad:
            for t in rec.turns:
                t.usage = {"output_tokens": 8}
        _write_run(tmp_path / "runs" / "tiny" / f"oracle_{oracle}", bad)
        meta = json.loads((tmp_path / "runs" / "tiny" / f"oracle_{oracle}" / "run.json").read_text())
        meta["oracle"] = oracle
        (tmp_path / "runs" / "tiny" / f"oracle_{oracle}" / "run.json").write_text(json.dumps(meta))
    assert main(["score", str(tmp_path / "runs" / "tiny")]) == 0
    _, err = capsys.readouterr()
    assert err.count("WARNING") == 1 and "WARNING: tiny, oracle implicit and none runs" in err
    assert "oracle_implicit/results.jsonl and " in err and "oracle_none/results.jsonl" in err
    out_dir = tmp_path / "report"
    assert main(["report", str(tmp_path / "runs"), "--output-dir", str(out_dir), "--no-plots"]) == 0
    _, err = capsys.readouterr()
    assert err.count("WARNING") == 1
    page = (out_dir / "index.html").read_text()
    assert page.count("<strong>Unreadable answers.</strong>") == 1
