"""``chexpercept report`` end to end: runs on disk -> tables, leaderboard, CSVs, figures, HTML."""

from __future__ import annotations

import csv
import json

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.cli import main
from chexpercept.metrics.report.build import write_report
from chexpercept.metrics.report.simulate import simulate_run, write_simulated_runs
from chexpercept.results import iter_results
from chexpercept.testing import write_fixture_bundle
from chexpercept.vocab import Path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_build")
    bundle = read_bundle(
        write_fixture_bundle(root / "bundle", per_cell=2, image_size=32), check_images="none"
    )
    write_simulated_runs(bundle, root / "runs")
    simulate_run(bundle, root / "runs", "steady", accuracy=0.75, oracle="none", seed=3)
    return root, bundle


@pytest.fixture(scope="module")
def report(workspace):
    root, _ = workspace
    return write_report(root / "runs", root / "report", n_resamples=50)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _md_rows(text):
    """Rows of the markdown tables in text, as lists of cells (header and rule lines included)."""
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def test_oracle_baseline_scores_100_and_na_where_a_stage_does_not_apply(tmp_path):
    bundle = read_bundle(
        write_fixture_bundle(tmp_path / "bundle", per_cell=2, lesions=("cardiomegaly", "edema")),
        check_images="none",
    )
    simulate_run(bundle, tmp_path / "runs", "oracle", accuracy=1.0)
    out = write_report(tmp_path / "runs", tmp_path / "report", n_resamples=0, plots=False, html=False)
    table2 = (out.out / "tables" / "table2.md").read_text()
    header, _, row = _md_rows(table2)
    assert header[0] == "Model" and row[0] == "oracle"
    assert row[1:8] == ["100.0"] * 4 + ["100.0 (+0.0)"] * 3
    assert row[8:] == ["4.00", "3.00", "1.00"]
    # an oracle over cardiomegaly only: Stage 4 is never asked, so its cells do not apply
    only_cardio = read_bundle(
        write_fixture_bundle(tmp_path / "cardio", per_cell=2, lesions=("cardiomegaly",)), check_images="none"
    )
    simulate_run(only_cardio, tmp_path / "runs_cardio", "oracle", accuracy=1.0)
    out = write_report(
        tmp_path / "runs_cardio", tmp_path / "report_cardio", n_resamples=0, plots=False, html=False
    )
    _, _, row = _md_rows((out.out / "tables" / "table2.md").read_text())
    assert row[1:4] == ["100.0"] * 3 and row[4] == "–"
    assert row[5:7] == ["100.0 (+0.0)"] * 2 and row[7] == "–"
    table8 = _md_rows((tmp_path / "report" / "tables" / "table8.md").read_text())
    lf = next(r for r in table8 if r[1] == "LF")
    assert lf[2] == "100.0" and lf[3:] == ["–"] * 6
    rf = next(r for r in table8 if r[1] == "RF")
    assert rf[4] == "–" and rf[7] == "–"  # no Stage 3 on RF


def test_reference_csvs_per_run_and_across_models(report):
    out = report.out
    for model, oracle in (
        ("oracle", "implicit"),
        ("steady", "implicit"),
        ("steady", "none"),
        ("guesser", "implicit"),
    ):
        folder = out / model / f"oracle_{oracle}"
        assert sorted(p.name for p in folder.glob("*.csv")) == [
            "model_performance_detail_attribute_extraction.csv",
            "model_performance_detail_contour_revision.csv",
            "model_performance_summary.csv",
        ]
    rows = _rows(out / "oracle" / "oracle_implicit" / "model_performance_summary.csv")
    assert list(rows[0]) == [
        "path",
        "model",
        "setting",
        "acc(stage1)",
        "acc(stage2)",
        "acc(stage3)",
        "acc(stage4)",
        "depth",
    ]
    rr_op = next(r for r in rows if r["path"] == "revision_required" and r["setting"] == "oracle_passed")
    assert [float(rr_op[f"acc(stage{k})"]) for k in (1, 2, 3, 4)] == [1.0] * 4 and float(
        rr_op["depth"]
    ) == 4.0
    lf = next(r for r in rows if r["path"] == "lesion_free" and r["setting"] == "end_to_end")
    assert lf["acc(stage1)"] == "1.0" and lf["acc(stage2)"] == lf["acc(stage3)"] == lf["acc(stage4)"] == ""
    for setting in ("implicit", "none"):
        folder = out / f"all_models_oracle_{setting}"
        assert (folder / "all_models_summary.csv").is_file()
        assert (folder / "all_models_contour_revision_detail.csv").is_file()
        assert (folder / "all_models_attribute_extraction_detail.csv").is_file()
        for png in ("plot_stage_accuracy.png", "plot_contour_revision_detail.png", "plot_attribute_extraction_detail.png", "plot_depth_heatmap.png", "plot_lesion_heatmap.png"):  # fmt: skip
            assert (folder / png).stat().st_size > 10_000
    models = [
        r["model"]
        for r in _rows(out / "all_models_oracle_implicit" / "all_models_contour_revision_detail.csv")
    ]
    assert models == ["guesser", "oracle", "steady"]
    # a none run measures no Oracle-Passed numbers: those cells are empty, not invented
    none_rows = _rows(out / "steady" / "oracle_none" / "model_performance_summary.csv")
    rr_op = next(r for r in none_rows if r["path"] == "revision_required" and r["setting"] == "oracle_passed")
    assert rr_op["acc(stage2)"] == "" and rr_op["acc(stage1)"] != ""


def test_tables_have_intervals_and_the_leaderboard_ranks_models(report):
    table2 = _md_rows((report.out / "tables" / "table2.md").read_text())
    oracle = next(r for r in table2 if r[0] == "oracle")
    # 42 of 42: an estimate, not a certainty (Clopper-Pearson at the boundary, not [100.0, 100.0])
    assert oracle[1].startswith("100.0 [9") and oracle[1].endswith(", 100.0]")
    tables_md = (report.out / "tables.md").read_text()
    assert (
        "brackets: 95% intervals (design-based: cases the unit, lesion x path cells the strata" in tables_md
    )
    steady = next(r for r in table2 if r[0] == "steady")
    assert "[" in steady[2] and steady[2] != "–"
    for tid in ("2", "3", "8", "9", "10", "11"):
        assert (report.out / "tables" / f"table{tid}.md").read_text().strip()
        with open(report.out / "tables" / f"table{tid}.csv", newline="") as f:
            table = list(csv.reader(f))
        assert len(table) >= 1 + 3 and {row[0] for row in table[1:]} == {"guesser", "oracle", "steady"}
    board = _md_rows(report.leaderboard_md.read_text())
    e2e = [r for r in board if r[0].isdigit()][:3]
    op = [r for r in board if r[0].isdigit()][3:]
    assert [r[1] for r in e2e] == ["oracle", "steady", "guesser"]
    assert [r[1] for r in op] == ["oracle", "steady", "guesser"]
    assert e2e[0][2] == "100.0"
    with open(report.out / "leaderboard.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["setting"], r["rank"], r["model"]) for r in rows][:3] == [
        ("e2e", "1", "oracle"),
        ("e2e", "2", "steady"),
        ("e2e", "3", "guesser"),
    ]
    data = json.loads((report.out / "metrics.json").read_text())
    assert data["models"]["oracle"]["flat"]["e2e/stage1/all"] == 1.0
    assert data["runs"]["steady/oracle_none"]["op/stage2/all"] is None


def test_html_report_links_everything_and_keeps_images_out(report, workspace):
    _, bundle = workspace
    page = report.index_html.read_text()
    assert "Phantom data." in page
    # and every markdown file of numbers says so too (new user: it was in the HTML page only)
    for md in ("tables.md", "leaderboard.md", "tables/table2.md"):
        assert "**Phantom data.**" in (report.out / md).read_text(), md
    for fig in (
        "figures/plot_stage_accuracy.png",
        "figures/plot_lesion_heatmap.png",
        "tables/table2.md",
        "leaderboard.csv",
    ):
        assert fig in page and (report.out / fig).is_file()
    assert "http://" not in page and "https://" not in page  # nothing fetched from anywhere
    assert not (report.out / "images").exists()
    index = (report.out / "data" / "index.js").read_text()
    assert '"mode":"linked"' in index
    assert len(list((report.out / "data" / "cases").glob("*.js"))) == len(bundle.cases) == report.cases


def test_viewer_verdicts_follow_the_report_parse_mode(workspace, tmp_path):
    """Re-scored in strict mode, a response only the reference parser reads becomes wrong in the viewer."""
    root, bundle = workspace
    case = next(c for c in bundle.cases if c.path is Path.LF)
    records = list(iter_results(root / "runs" / "oracle" / "oracle_implicit" / "results.jsonl"))
    rec = next(r for r in records if r.key_id == case.key_id)
    rec.turns[0].response = "The answer is probably 2 I think"
    run_dir = tmp_path / "runs" / "loose" / "oracle_implicit"
    run_dir.mkdir(parents=True)
    (run_dir / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    meta = json.loads((root / "runs" / "oracle" / "oracle_implicit" / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "model": "loose"}))
    for mode, correct in (("reference", True), ("strict", False)):
        out = write_report(
            tmp_path / "runs", tmp_path / f"report_{mode}", mode=mode, n_resamples=0, plots=False
        )
        text = next((out.out / "data" / "cases").glob(f"{case.key_id}.js")).read_text()
        payload = json.loads("[" + text[len("CHX.case(") : -3] + "]")[1]
        assert payload["runs"]["r0"]["turns"]["detection"]["correct"] is correct
        assert payload["runs"]["r0"]["first_fail"] == (0 if correct else 1)


def test_embed_images_copies_them_into_the_report(workspace, tmp_path):
    root, bundle = workspace
    out = write_report(root / "runs", tmp_path / "report", embed_images=True, n_resamples=0, plots=False)
    images = list((out.out / "images").rglob("*.png"))
    needed = {p for c in bundle.cases for t in c.turns for p in t.images}
    assert len(images) == len(needed)
    assert "credentialed images" in out.index_html.read_text()


def test_reference_results_layout_is_read(workspace, tmp_path):
    """A reference all_results.json under <provider>_<model>/oracle_<setting>/ is found and scored."""
    root, bundle = workspace
    records = list(iter_results(root / "runs" / "steady" / "oracle_implicit" / "results.jsonl"))
    folder = tmp_path / "results" / "opensource_steady-ref" / "oracle_implicit"
    folder.mkdir(parents=True)
    (folder / "all_results.json").write_text(json.dumps({r.key_id: _reference_entry(r) for r in records}))
    with pytest.raises(ValueError, match="pass the bundle"):
        write_report(tmp_path / "results", tmp_path / "nobundle", n_resamples=0, plots=False)
    out = write_report(
        tmp_path / "results", tmp_path / "report", bundle=bundle.root, n_resamples=0, plots=False
    )
    assert out.models == ["steady-ref"]
    ours = write_report(
        root / "runs" / "steady" / "oracle_implicit",
        tmp_path / "ours",
        n_resamples=0,
        plots=False,
        html=False,
    )
    theirs = _rows(out.out / "steady-ref" / "oracle_implicit" / "model_performance_summary.csv")
    mine = _rows(ours.out / "steady" / "oracle_implicit" / "model_performance_summary.csv")
    assert [r["acc(stage2)"] for r in theirs if r["setting"] == "oracle_passed"] == [
        r["acc(stage2)"] for r in mine if r["setting"] == "oracle_passed"
    ]


def _reference_entry(rec):
    """A record in the reference's all_results.json schema (spec 3.8)."""
    by = {t.task: t for t in rec.turns}
    path = {"RR": "revision_required", "RF": "revision_free", "LF": "lesion_free"}[rec.path]

    def single(t):
        return t.gold[0]

    entry = {
        "key_id": rec.key_id,
        "qa_path": path,
        "detection_qa": {"response": by["detection"].response, "ground_truth": 1 if rec.path != "LF" else 2, "correct": by["detection"].correct},
        "contour_evaluation_qa": {},
        "contour_revision_qa": {},
        "attribute_extraction_qa": {},
        "chat_history": [],
    }  # fmt: skip
    if "contour_eval" in by:
        t = by["contour_eval"]
        entry["contour_evaluation_qa"] = {
            "responses": t.response,
            "ground_truth": single(t),
            "correct": t.correct,
        }
    if "expansion" in by:
        ts = [by[k] for k in ("expansion", "contraction", "revision_result")]
        entry["contour_revision_qa"] = {
            "ground_truth": {
                "expansion": ts[0].gold,
                "contraction": ts[1].gold,
                "revision_result": single(ts[2]),
            },
            "responses": {k: t.response for k, t in zip(("expansion", "contraction", "revision_result"), ts)},
            "correct": all(t.correct for t in ts),
            **{
                k: {"correct": t.correct} for k, t in zip(("expansion", "contraction", "revision_result"), ts)
            },
        }
    if "distribution" in by:
        names = {
            "distribution": "distribution",
            "location": "location",
            "severity": "severity/measurement",
            "comparison": "comparison",
        }
        entry["attribute_extraction_qa"] = {
            "responses": {names[k]: by[k].response for k in names},
            "ground_truth": {names[k]: (by[k].gold if k == "location" else single(by[k])) for k in names},
            "correct": all(by[k].correct for k in names),
            **{names[k]: {"correct": by[k].correct} for k in names},
        }  # fmt: skip
    return entry


def test_command_line(workspace, tmp_path, capsys):
    root, _ = workspace
    code = main(
        [
            "report",
            "--results",
            str(root / "runs"),
            "--output-dir",
            str(tmp_path / "r"),
            "--bootstrap",
            "0",
            "--no-plots",
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0
    assert "Table 2" in printed and "| oracle | 100.0 |" in printed
    assert f"Open {(tmp_path / 'r' / 'index.html').resolve().as_uri()}" in printed
    assert main(["report", "--results", str(tmp_path / "nothing"), "--output-dir", str(tmp_path / "x")]) == 2
    assert "nothing: no such folder" in capsys.readouterr().err


def test_model_names_with_slashes_get_one_folder(workspace, tmp_path):
    root, _ = workspace
    src = root / "runs" / "oracle" / "oracle_implicit"
    run_dir = tmp_path / "runs" / "google__medgemma-x" / "oracle_implicit"
    run_dir.mkdir(parents=True)
    (run_dir / "results.jsonl").write_bytes((src / "results.jsonl").read_bytes())
    meta = json.loads((src / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "model": "google/medgemma-x"}))
    out = write_report(tmp_path / "runs", tmp_path / "report", n_resamples=0, plots=False, html=False)
    assert out.models == ["google/medgemma-x"]
    rows = _rows(
        tmp_path / "report" / "google__medgemma-x" / "oracle_implicit" / "model_performance_summary.csv"
    )
    assert {r["model"] for r in rows} == {"google/medgemma-x"}


def test_the_report_compares_neighbours_on_the_leaderboard(report):
    md = (report.out / "comparisons.md").read_text()
    assert "**Paired comparison: oracle - steady** on the 42 cases both were scored on" in md
    assert "**Paired comparison: steady - guesser**" in md and "oracle - guesser" not in md
    assert "**Table 2: stage-level accuracy (%) and depth**: 10 tests, Holm" in md
    assert "| Metric | oracle | steady | A - B | CI | p | p adj. | n | MDE |" in md
    rows = _rows(report.out / "comparisons.csv")
    assert {(r["model_a"], r["model_b"]) for r in rows} == {("oracle", "steady"), ("steady", "guesser")}
    assert {r["family"] for r in rows} >= {"2", "3", "8", "9", "gains", "cells"}
    page = report.index_html.read_text()
    assert 'id="comparisons"' in page and "Paired comparison: oracle - steady" in page


def test_the_page_says_each_note_once(workspace, tmp_path):
    import shutil

    root, _ = workspace
    shutil.copytree(root / "runs", tmp_path / "runs")
    for meta in (tmp_path / "runs").rglob("run.json"):
        meta.unlink()  # every run: the same note
    out = write_report(tmp_path / "runs", tmp_path / "report", n_resamples=0, plots=False)
    page = out.index_html.read_text()
    banners = [b for b in page.split('<div class="banner">')[1:] if "run.json is missing" in b]
    assert len(banners) == 1 and "oracle · implicit" in banners[0] and "steady · none" in banners[0]
    assert sum("run.json is missing" in n for n in out.notes) == 1
    assert sum("no run.json; oracle setting taken from the records" in n for n in out.notes) == 1


def test_the_comparisons_say_how_to_read_them_once(report):
    md = (report.out / "comparisons.md").read_text()
    assert md.count("**Paired comparison:") == 2 and md.count("the interval leaves out 0 exactly when") == 1
