"""Baselines through the whole runner: oracle scores 100%, random lands at chance, seeding per case."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.baselines import BaselineBackend, random_answer
from chexpercept.eval.run import main
from chexpercept.results import iter_results
from chexpercept.testing import write_fixture_bundle
from chexpercept.vocab import TASKS


@pytest.fixture(scope="module")
def big_bundle(tmp_path_factory):
    """10 cases per (lesion, path) cell: 210 cases, enough for chance-level statistics."""
    return write_fixture_bundle(tmp_path_factory.mktemp("big"), per_cell=10, seed=3, image_size=8)


def run_baseline(bundle, out, model, *extra):
    rc = main(
        ["--data-dir", str(bundle), "--model", model, "--output-dir", str(out), "--no-progress", *extra]
    )
    assert rc == 0
    folder = out / model.replace(":", "-")
    setting = extra[extra.index("--oracle") + 1] if "--oracle" in extra else "implicit"
    return list(iter_results(folder / f"oracle_{setting}" / "results.jsonl"))


def stage_pass(record, stage):
    turns = [t for t in record.turns if t.stage == stage]
    return all(t.correct for t in turns) if turns else None


@pytest.mark.parametrize("setting", ["none", "implicit", "explicit"])
def test_oracle_baseline_scores_100_percent_on_every_stage(fixture_bundle, tmp_path, setting):
    records = run_baseline(fixture_bundle, tmp_path, "baseline:oracle", "--oracle", setting)
    cases = read_bundle(fixture_bundle).cases
    assert sorted(r.key_id for r in records) == sorted(c.key_id for c in cases)
    asked = Counter()
    for r in records:
        for stage in (1, 2, 3, 4):
            passed = stage_pass(r, stage)
            if passed is not None:
                asked[stage] += 1
                assert passed, (r.key_id, stage)
        # and nothing was injected, since nothing was ever wrong
        assert all(t.oracle_text is None and t.patched_to is None for t in r.turns)
    assert asked == {1: 21, 2: 14, 3: 7, 4: 12}  # every route and stage was exercised


def test_random_baseline_lands_within_chance_intervals(big_bundle, tmp_path):
    records = run_baseline(big_bundle, tmp_path, "baseline:random", "--oracle", "none")
    by_task: dict[str, list[tuple[float, bool]]] = {}
    for r in records:
        for t in r.turns:
            n_real = t.n_options - (1 if t.none_index else 0)
            chance = 1 / 2**n_real if t.multi_select else 1 / t.n_options
            by_task.setdefault(t.task, []).append((chance, t.correct))
    assert set(by_task) == set(TASKS)
    for task, rows in by_task.items():
        expected = sum(p for p, _ in rows)
        sd = math.sqrt(sum(p * (1 - p) for p, _ in rows))
        observed = sum(ok for _, ok in rows)
        assert abs(observed - expected) <= 4 * sd + 1, (task, observed, expected, sd)
    # detection over 210 cases: near one half, not 0 or 1
    detection = [ok for _, ok in by_task["detection"]]
    assert 0.35 < sum(detection) / len(detection) < 0.65


def test_random_answers_are_valid_and_cover_the_answer_space(fixture_bundle):
    import random

    case = next(c for c in read_bundle(fixture_bundle).cases if c.path.value == "RR")
    turn = case.turn("expansion")
    rng = random.Random(0)
    seen = {tuple(random_answer(turn, rng)) for _ in range(4000)}
    n_real = len(turn.options) - 1
    assert len(seen) == 2**n_real  # None alone, or any non-empty set of the real options
    assert (turn.none_index,) in seen
    assert all(turn.none_index not in s for s in seen if len(s) > 1)


def test_random_baseline_does_not_depend_on_batching_order_or_selection(fixture_bundle, tmp_path):
    full = run_baseline(fixture_bundle, tmp_path / "a", "baseline:random", "--batch-size", "1")
    part = run_baseline(
        fixture_bundle, tmp_path / "b", "baseline:random", "--batch-size", "7", "--paths", "RR"
    )
    responses = {r.key_id: [t.response for t in r.turns] for r in full}
    assert part and all(responses[r.key_id] == [t.response for t in r.turns] for r in part)
    other_seed = run_baseline(fixture_bundle, tmp_path / "c", "baseline:random", "--seed", "1")
    assert {r.key_id: [t.response for t in r.turns] for r in other_seed} != responses


def test_constant_and_prior_baselines(big_bundle, tmp_path):
    records = run_baseline(big_bundle, tmp_path, "baseline:constant:2", "--oracle", "none")
    assert {t.response for r in records for t in r.turns} == {"Answer: 2"}
    detection = [r.turn("detection").correct for r in records]
    assert sum(detection) == sum(r.path == "LF" for r in records)  # "No" is right exactly on LF

    cases = read_bundle(big_bundle).cases
    gold: dict[str, Counter] = {}
    for c in cases:
        for t in c.turns:
            key = (
                "None"
                if t.none_index and list(t.answer_index) == [t.none_index]
                else tuple(sorted(t.answer_index))
            )
            gold.setdefault(t.task, Counter())[key] += 1
    records = run_baseline(big_bundle, tmp_path, "baseline:prior", "--oracle", "none")
    for r in records:
        for t in r.turns:
            top = max(gold[t.task].values())
            accepted = [k for k, v in gold[t.task].items() if v == top]
            answer = "None" if t.none_index and t.parsed == [t.none_index] else tuple(t.parsed)
            assert answer in accepted, (t.task, answer, accepted)
    run_json = json.loads((tmp_path / "baseline-prior" / "oracle_none" / "run.json").read_text())
    assert run_json["backend_settings"]["prior"]["detection"] == [1]  # 2/3 of cases are positive


@pytest.mark.parametrize(
    "bad", ["baseline:best", "baseline:constant", "baseline:constant:0", "baseline:oracle:1"]
)
def test_bad_baseline_names_are_refused(bad):
    with pytest.raises(ValueError, match="baseline"):
        BaselineBackend(bad)


def test_run_json_records_what_the_scorer_needs(fixture_bundle, tmp_path):
    run_baseline(fixture_bundle, tmp_path, "baseline:oracle", "--per-cell", "1")
    info = json.loads((tmp_path / "baseline-oracle" / "oracle_implicit" / "run.json").read_text())
    for key in (
        "model",
        "backend",
        "oracle",
        "parse_mode",
        "seed",
        "versions",
        "git_commit",
        "started",
        "finished",
    ):
        assert key in info
    assert info["sampling"] == {"temperature": 0.0, "top_p": 1.0, "max_tokens": 0, "greedy": True}
    assert info["bundle"]["synthetic"] is True and len(info["bundle"]["fingerprint"]) == 64
    assert info["bundle"]["path"] == str(fixture_bundle.resolve())
    assert (
        info["oracle"] == "implicit" and info["parse_mode"] == "reference" and info["backend"] == "baseline"
    )
    assert info["finished"] is not None and info["n_results"] == 21


def test_baseline_run_imports_no_torch(fixture_bundle, tmp_path):
    """Baselines need neither torch nor accelerate: backends import them only when used."""
    code = (
        "import sys\n"
        "from chexpercept.eval.run import main\n"
        f"assert main(['--data-dir', {str(fixture_bundle)!r}, '--model', 'baseline:prior',"
        f" '--output-dir', {str(tmp_path)!r}, '--no-progress']) == 0\n"
        "print(sorted(m for m in ('torch', 'accelerate', 'transformers', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_run_ends_with_the_models_table2_row(fixture_bundle, tmp_path, capsys):
    """Item 7: the finished run is scored with the metric library; both oracle runs of a model combine."""
    run_baseline(fixture_bundle, tmp_path, "baseline:oracle", "--oracle", "none")
    first = capsys.readouterr().out
    assert "| baseline-oracle | 100.0 | 100.0 | 100.0 | 100.0 | – | – | – | 4.00 | 3.00 | 1.00 |" in first
    assert "E2E from: oracle none run" in first and "OP from: no run measures it yet (N/A)" in first
    run_baseline(fixture_bundle, tmp_path, "baseline:oracle", "--oracle", "implicit")
    second = capsys.readouterr().out
    assert (
        "| baseline-oracle | 100.0 | 100.0 | 100.0 | 100.0 | 100.0 (+0.0) | 100.0 (+0.0) | 100.0 (+0.0) |"
        in second
    )
    assert "OP from: oracle implicit run" in second
    rc = main(
        [
            "--data-dir",
            str(fixture_bundle),
            "--model",
            "baseline:prior",
            "--output-dir",
            str(tmp_path),
            "--no-progress",
            "--no-score",
        ]
    )
    assert rc == 0 and "Table 2" not in capsys.readouterr().out
