"""``chexpercept score`` and ``chexpercept install-metric`` on runs written to disk."""

import csv
import io
import json
import random

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.cli import main
from chexpercept.metrics import FLAT_KEYS
from chexpercept.metrics.reference import write_reference_results
from chexpercept.metrics.runs import run_from_records
from chexpercept.metrics.simulate import simulate_records


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fixture_bundle):
    """OUT/<model>/oracle_{none,implicit} for two models, and a reference all_results.json."""
    root = tmp_path_factory.mktemp("runs")
    bundle = read_bundle(fixture_bundle, check_images="none")
    for model, p_right in (("good", 0.9), ("poor", 0.3)):
        for oracle in ("none", "implicit"):
            rnd = random.Random(f"{model}{oracle}")
            records = simulate_records(
                bundle.cases, lambda c, t, r=rnd, p=p_right: r.random() < p, oracle=oracle
            )
            folder = root / model / f"oracle_{oracle}"
            folder.mkdir(parents=True)
            (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
            meta = {
                "model": model,
                "oracle": oracle,
                "parse_mode": "reference",
                "sampling": {"temperature": 0.0, "greedy": True},
                "bundle": {"path": str(fixture_bundle), "fingerprint": bundle.fingerprint()},
                "finished": "2026-11-29T10:00:00",
            }
            (folder / "run.json").write_text(json.dumps(meta))
            if model == "good" and oracle == "implicit":
                ref = root / "reference" / "opensource_good" / "oracle_implicit" / "all_results.json"
                write_reference_results(run_from_records(records, oracle=oracle, model="good"), bundle, ref)
    return root


def _score(capsys, *args):
    code = main(["score", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_score_one_run_prints_the_flat_metrics(runs, capsys):
    code, out, err = _score(capsys, runs / "good" / "oracle_none")
    assert code == 0
    flat = json.loads(out)
    assert list(flat) == list(FLAT_KEYS)
    assert flat["e2e/stage2/LF"] is None and 0 < flat["e2e/stage1/all"] <= 1
    assert flat["op/stage2/all"] is None
    assert "[good] End-to-End: oracle none run" in err
    assert "[good] note: Oracle-Passed numbers are N/A" in err


def test_score_a_model_folder_uses_both_runs(runs, capsys):
    code, out, err = _score(capsys, runs / "good", "--parse-mode", "strict")
    assert code == 0
    flat = json.loads(out)
    assert flat["op/stage2/all"] is not None and flat["e2e/stage2/all"] is not None
    assert "End-to-End: oracle none run" in err and "Oracle-Passed: oracle implicit run" in err
    assert (
        "WARNING: oracle implicit" in err
        and "acted on reference parsing; scored here with strict parsing" in err
    )


def test_score_reference_results_needs_the_bundle(runs, fixture_bundle, capsys):
    ref = runs / "reference" / "opensource_good" / "oracle_implicit"
    code, out, err = _score(capsys, ref)
    assert code == 2 and "needs the release bundle" in err and out == ""
    code, out, err = _score(capsys, ref / "all_results.json", "--data-dir", fixture_bundle, "--greedy")
    assert code == 0
    ours = json.loads(_score(capsys, runs / "good" / "oracle_implicit")[1])
    assert json.loads(out) == ours  # the same records through both formats give the same numbers


def test_tables_for_several_models(runs, capsys):
    code, out, _ = _score(capsys, runs / "good", runs / "poor", "--table", "2")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0] == "Values in %, depth in stages. – = does not apply or not measured."  # the legend
    assert lines[2].startswith("**Table 2") and "(+x): OP minus E2E" in lines[4]  # the table's note
    assert lines[6].startswith("| Model | E2E S1")
    assert lines[8].startswith("| good | ") and lines[9].startswith("| poor | ")
    code, out, _ = _score(capsys, runs / "good", "--table", "2", "--intervals")
    assert out.startswith(
        "Values in %, depth in stages; brackets: 95% intervals (design-based: cases the unit"
    )
    # the earlier spelling still gives the intervals, and says that N is not used
    code, old, err = _score(capsys, runs / "good", "--table", "2", "--bootstrap", "20")
    assert code == 0 and old == out and "--bootstrap is deprecated" in err and "N is not used" in err
    code, out, _ = _score(capsys, runs / "good", runs / "poor", "--table", "8", "--format", "csv")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0][:3] == ["Model", "Path", "S1"] and len(rows) == 1 + 2 * 3
    assert rows[3][1] == "LF" and rows[3][3] == ""  # N/A is an empty CSV cell
    code, out, _ = _score(capsys, runs / "good", "--table", "all", "--name", "Good model")
    for n in ("2", "3", "8", "9", "10", "11"):
        assert f"**Table {n}:" in out
    assert "| Good model | Cardiomegaly |" in out


def test_details_with_intervals_and_cases(runs, tmp_path, capsys):
    target = tmp_path / "details.json"
    code, _, err = _score(capsys, runs / "good", "--details", "--intervals", "--cases", "--output", target)
    assert code == 0 and f"wrote {target}" in err
    details = json.loads(target.read_text())
    assert set(details) >= {"flat", "tables", "intervals", "sources", "notes", "parse", "counts", "cases"}
    lo, hi = details["intervals"]["values"]["e2e/stage1/all"]
    assert lo <= details["flat"]["e2e/stage1/all"] <= hi
    assert details["tables"]["table9"]["cardiomegaly"]["e2e"]["S4"] is None
    assert len(details["cases"]["none"]) == 21


def test_compare_two_models(runs, capsys):
    code, out, _ = _score(capsys, runs / "good", runs / "poor", "--compare", "--format", "json")
    assert code == 0
    res = json.loads(out)
    assert (res["a"], res["b"], res["cases"], res["adjust"]) == ("good", "poor", 21, "holm")
    assert list(res["families"]) == ["2", "3", "8"]  # what the terminal shows by default
    s1 = next(r for r in res["families"]["2"]["rows"] if r["metric"] == "e2e/stage1/all")
    assert s1["difference"] > 0 and s1["n"] == 21 and 0 < s1["p_value"] <= s1["p_adjusted"] <= 1
    code, _, err = _score(capsys, runs / "good", "--compare")
    assert code == 2 and "exactly two models, got 1" in err


def test_bad_paths_are_clear_errors(tmp_path, capsys):
    code, _, err = _score(capsys, tmp_path / "missing")
    assert code == 2 and "no such file or folder" in err
    (tmp_path / "x").mkdir()
    code, _, err = _score(capsys, tmp_path / "x")
    assert code == 2 and "found no results" in err


def test_install_metric_command(tmp_path, capsys):
    code = main(["install-metric", "--modules-cache", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "installed chexpercept_metric" in out
    installed = list(
        tmp_path.glob("evaluate_modules/metrics/evaluate-metric--chexpercept_metric/*/chexpercept_metric.py")
    )
    assert len(installed) == 1


def test_reference_style_numbers_from_a_none_run(runs, capsys):
    # README: the reference computes both rows from one run; overriding the setting reproduces that
    code, out, err = _score(capsys, runs / "poor" / "oracle_none", "--oracle", "implicit", "--greedy")
    assert code == 0
    # never without a word: the numbers are not the run's own (a red team's finding, stop 42)
    assert "run with oracle none, scored here as oracle implicit" in err and "not the run's own" in err
    flat = json.loads(out)
    plain = json.loads(_score(capsys, runs / "poor" / "oracle_none")[1])
    assert flat["op/stage2/all"] is not None and plain["op/stage2/all"] is None
    assert {k: v for k, v in flat.items() if k.startswith(("e2e/", "depth/"))} == {
        k: v for k, v in plain.items() if k.startswith(("e2e/", "depth/"))
    }


def test_a_run_json_whose_decoding_differs_from_its_identity_is_refused(fixture_bundle, capsys, tmp_path):
    """Hand-editing run.json's top-level ``sampling.greedy`` turned End-to-End numbers on for a
    sampled run; the run's identity holds ``settings.sampling``, and the two must agree."""
    from chexpercept.eval.run import main as run

    argv = [
        "--data-dir",
        str(fixture_bundle),
        "--model",
        "baseline:random",
        "--oracle",
        "none",
        "--limit",
        "2",
    ]
    assert run([*argv, "--output-dir", str(tmp_path), "--no-progress", "--no-score"]) == 0
    folder = tmp_path / "baseline-random" / "oracle_none"
    info = json.loads((folder / "run.json").read_text())
    assert info["settings"]["sampling"]["greedy"] == info["sampling"]["greedy"]
    info["sampling"]["greedy"] = not info["sampling"]["greedy"]
    (folder / "run.json").write_text(json.dumps(info))
    code, _, err = _score(capsys, folder)
    assert code == 2 and "it was changed after the run" in err, err
