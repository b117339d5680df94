"""Paired comparisons (metrics/comparisons.py) in the terminal, as CSV and JSON, and ``chexpercept power``."""

import csv
import io
import json
import math
import random

import pytest

from chexpercept.cli import main
from chexpercept.metrics import cmd_score
from chexpercept.metrics.comparisons import FAMILIES, FORMATS, compare, compare_reports, render_comparison
from chexpercept.metrics.inference import ADJUSTMENTS, adjust
from chexpercept.metrics.simulate import fixture_cases, simulate_records


def _write(folder, records, model, oracle):
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    meta = {"model": model, "oracle": oracle, "sampling": {"temperature": 0.0, "greedy": True}}
    (folder / "run.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two models on the same 84 cases (4 per cell): 'strong' right 80% of the time, 'weak' 50%."""
    root = tmp_path_factory.mktemp("compare")
    cases = fixture_cases(per_cell=4, seed=2)
    for model, p in (("strong", 0.8), ("weak", 0.5)):
        rnd = random.Random(model)
        records = simulate_records(cases, lambda c, t, r=rnd, p=p: r.random() < p, oracle="implicit")
        _write(root / model / "oracle_implicit", records, model, "implicit")
    return root


def _cli(capsys, *args):
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _scores(runs):
    from chexpercept.metrics import score_path

    return score_path(runs / "strong"), score_path(runs / "weak")


def test_compare_prints_a_readable_table_in_the_terminal(runs, capsys):
    code, out, _ = _cli(capsys, "score", runs / "strong", runs / "weak", "--compare")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "**Paired comparison: strong - weak** on the 84 cases both were scored on"
    assert "the interval leaves out 0 exactly when p < 0.05" in lines[2] and "Holm" in lines[2]
    assert "**Table 2: stage-level accuracy (%) and depth**: 10 tests, Holm" in out
    assert "**Table 3: Stage 3 and Stage 4 sub-task accuracy (%), Oracle-Passed**: 7 tests, Holm" in out
    assert "**Table 8: per-path stage accuracy (%)**: 13 tests, Holm" in out
    assert "| Metric | strong | weak | A - B | CI | p | p adj. | n | MDE |" in out
    row = next(line for line in lines if line.startswith("| E2E S1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3].startswith("+") and cells[4].startswith("[") and cells[7] == "84"
    assert not out.lstrip().startswith("{")  # not the JSON it printed before


def test_the_markdown_numbers_are_the_comparisons(runs):
    a, b = _scores(runs)
    comparison = compare(a, b)
    row = next(r for r in comparison.family("2").rows if r.row.key == "e2e/stage2/all")
    d = row.paired.difference
    assert d.value == pytest.approx(a.values["e2e/stage2/all"] - b.values["e2e/stage2/all"])
    lo, hi = row.interval
    line = f"| E2E S2 | {100 * a.values['e2e/stage2/all']:.1f} | {100 * b.values['e2e/stage2/all']:.1f} | "
    line += f"{100 * d.value:+.1f} | [{100 * lo:+.1f}, {100 * hi:+.1f}] |"
    assert line in render_comparison(comparison)


def test_p_values_are_adjusted_within_each_whole_family(runs, capsys):
    code, out, _ = _cli(capsys, "score", runs / "strong", runs / "weak", "--compare", "--format", "json")
    data = json.loads(code == 0 and out)
    for fid in ("2", "3", "8"):
        rows = data["families"][fid]["rows"]
        assert [r["p_adjusted"] for r in rows] == pytest.approx(adjust([r["p_value"] for r in rows], "holm"))
        for r in rows:  # the interval and the unadjusted test agree
            assert (r["interval"][0] > 0 or r["interval"][1] < 0) == (r["p_value"] < 0.05)
    # a family shown alone is adjusted over all its tests, not over what is shown
    code, out, _ = _cli(
        capsys, "score", runs / "strong", runs / "weak", "--compare", "--format", "json", "--family", "cells"
    )
    cells = json.loads(out)["families"]["cells"]
    assert list(json.loads(out)["families"]) == ["cells"]
    assert cells["tests"] == 7 * 8 + 7 * 5 - 4  # E2E and OP cells; cardiomegaly asks no Stage 4
    assert cells["rows"][0]["label"] == "Atelectasis RR E2E S1"
    code, out, _ = _cli(
        capsys, "score", runs / "strong", runs / "weak", "--compare", "--format", "json", "--adjust", "bh"
    )
    rows = json.loads(out)["families"]["2"]["rows"]
    assert [r["p_adjusted"] for r in rows] == pytest.approx(adjust([r["p_value"] for r in rows], "bh"))


def test_compare_as_csv_has_one_row_per_test(runs, capsys):
    code, out, _ = _cli(
        capsys, "score", runs / "strong", runs / "weak", "--compare", "--format", "csv", "--family", "all"
    )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and {r["family"] for r in rows} == set(FAMILIES)
    s1 = next(r for r in rows if r["metric"] == "e2e/stage1/all" and r["family"] == "2")
    assert float(s1["lo"]) <= float(s1["difference"]) <= float(s1["hi"]) and s1["n"] == "84"


def test_the_detectable_difference_of_a_comparison(runs):
    a, b = _scores(runs)
    row = next(r for r in compare(a, b).family("2").rows if r.row.key == "e2e/stage1/all")
    d = row.paired.difference
    # 80% power at Holm's strictest level for Table 2's 10 tests
    assert row.detectable == pytest.approx(d.detectable(0.95, 0.8, tests=10))
    assert row.detectable > (1.96 + 0.84) * d.se


def test_compare_reports_is_the_unadjusted_view(runs):
    a, b = _scores(runs)
    res = compare_reports(a, b)
    s1 = res["e2e/stage1/all"]
    assert s1["n"] == 84 and s1["interval"][0] <= s1["difference"] <= s1["interval"][1]
    assert res["e2e/stage2/LF"]["difference"] is None and res["e2e/stage2/LF"]["n"] == 0
    with pytest.raises(KeyError, match="unknown metric"):
        compare_reports(a, b, keys=["nope"])


def test_the_command_line_names_match_the_library():
    # spelled in cmd_score so that --help imports no numpy
    assert tuple(FAMILIES) == cmd_score.FAMILY_IDS
    assert cmd_score.FORMATS == FORMATS and cmd_score.ADJUSTMENTS == ADJUSTMENTS


def test_formats_that_would_be_ignored_are_refused_or_said(runs, capsys):
    code, _, err = _cli(capsys, "score", runs / "strong", "--table", "2", "--format", "json")
    assert code == 2 and "--format json is for --compare" in err
    code, out, err = _cli(capsys, "score", runs / "strong", "--format", "csv")
    assert code == 0 and "note: --format csv applies to --table and --compare" in err and json.loads(out)


def test_score_says_what_several_models_share_once(runs, capsys):
    code, _, err = _cli(capsys, "score", runs / "strong", runs / "weak")
    assert code == 0
    assert err.count("End-to-End: oracle implicit run with greedy decoding") == 1
    assert "[strong, weak] End-to-End: oracle implicit run with greedy decoding" in err


def test_power_for_the_release_under_stated_assumptions(capsys):
    code, out, _ = _cli(capsys, "power")
    assert code == 0
    assert "100 cases per lesion x path cell" in out and "differ on 50% of the cases" in out
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| S")}
    assert set(rows) == {
        f"S{k} {p}"
        for k, p in (
            (1, "RR"),
            (1, "RF"),
            (1, "LF"),
            (1, "all"),
            (2, "RR"),
            (2, "RF"),
            (2, "all"),
            (3, "RR"),
            (4, "RR"),
            (4, "RF"),
            (4, "all"),
        )
    }
    z = 1.959964 + 0.841621
    s1 = [c.strip() for c in rows["S1 all"].strip("|").split("|")]
    assert s1[1:4] == ["21", "2,100", f"{100 * z * math.sqrt(0.5 / 2100):.1f}"]  # 4.3 points
    need = int(s1[4].replace(",", "").rstrip("*"))
    assert need == pytest.approx((z * math.sqrt(0.5) / 0.05) ** 2, rel=0.01)  # cases for 5 points
    s4 = [c.strip() for c in rows["S4 RR"].strip("|").split("|")]
    assert s4[1:3] == ["6", "600"]  # cardiomegaly asks no Stage 4
    code, out, _ = _cli(capsys, "power", "--format", "json", "--tests", "10", "--discordance", "0.2")
    data = json.loads(out)
    assert data["settings"]["tests"] == 10 and data["settings"]["discordance"] == 0.2
    s1 = next(r for r in data["rows"] if r["metric"] == "e2e/stage1/all")
    assert s1["sd"] == pytest.approx(math.sqrt(0.2)) and s1["cases_needed"] > 0


def test_power_from_two_runs_uses_their_own_differences(runs, capsys):
    code, out, _ = _cli(capsys, "power", runs / "strong", runs / "weak", "--format", "json")
    assert code == 0
    data = json.loads(out)
    a, b = _scores(runs)
    s2 = next(r for r in data["rows"] if r["metric"] == "op/stage2/all")
    d = next(r for r in compare(a, b).family("2").rows if r.row.key == "op/stage2/all").paired.difference
    assert s2["sd"] == pytest.approx(d.se * math.sqrt(d.n)) and s2["run_cases"] == d.n
    assert 0 < s2["discordance"] <= 1 and s2["design_cases"] == 1400
    code, out, _ = _cli(capsys, "power", runs / "strong", runs / "weak")
    assert "From the runs: strong vs weak" in out and "| Metric | Discordance | Cases (runs) |" in out
    code, _, err = _cli(capsys, "power", runs / "strong")
    assert code == 2 and "give two runs of the same cases (or none), got 1" in err


def test_zero_width_intervals_are_marked_and_explained(runs, tmp_path, capsys):
    cases = fixture_cases(per_cell=4, seed=2)
    records = simulate_records(cases, lambda c, t: "Answer: 1", oracle="implicit")  # baseline:constant:1
    _write(tmp_path / "constant" / "oracle_implicit", records, "constant", "implicit")
    code, out, _ = _cli(capsys, "score", tmp_path / "constant", "--table", "2", "--intervals")
    assert code == 0 and "| constant | 66.7 [66.7, 66.7]† |" in out
    legend = out.splitlines()[0]
    assert "† zero width: every case of each stratum" in legend and "gold answer is fixed per path" in legend
    code, out, _ = _cli(capsys, "score", runs / "strong", "--table", "2", "--intervals")
    assert "†" not in out  # nothing to explain
