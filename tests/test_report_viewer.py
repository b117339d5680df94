"""Case viewer data, run discovery and markdown-to-HTML of the report (no browser needed)."""

from __future__ import annotations

import json

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.metrics.discovery import discover_runs
from chexpercept.metrics.report.cases import (
    ViewerRun,
    case_file_name,
    first_failing_stage,
    write_viewer_data,
)
from chexpercept.metrics.report.page import markdown_to_html
from chexpercept.metrics.report.simulate import simulate_case, simulate_run
from chexpercept.results import iter_results


def _js_payload(path, fn):
    text = path.read_text()
    assert text.startswith(fn + "(") and text.endswith(");\n")
    return json.loads("[" + text[len(fn) + 1 : -3] + "]")


@pytest.fixture
def bundle(fixture_bundle):
    return read_bundle(fixture_bundle, check_images="none")


def _viewer_runs(root):
    return [
        ViewerRun(f"r{i}", r.label, r.model, r.oracle, {c.key_id: c for c in iter_results(r.results_file)})
        for i, r in enumerate(discover_runs(root))
    ]


def test_first_failing_stage_follows_the_turns(bundle):
    rr = next(c for c in bundle.cases if c.path.value == "RR" and c.lesion == "edema")
    assert first_failing_stage(simulate_case(rr, accuracy=1.0)) == 0
    wrong_at_contraction = {"detection": 1.0, "contour_eval": 1.0, "expansion": 1.0, "contraction": 0.0}
    assert first_failing_stage(simulate_case(rr, accuracy=wrong_at_contraction)) == 3
    assert first_failing_stage(simulate_case(rr, accuracy=0.0)) == 1


def test_viewer_data_links_bundle_images_and_keeps_raw_answers(bundle, tmp_path):
    simulate_run(bundle, tmp_path / "runs", "oracle", accuracy=1.0)
    simulate_run(bundle, tmp_path / "runs", "weak", accuracy=0.3, unparsed_rate=0.5, oracle="none")
    runs = _viewer_runs(tmp_path / "runs")
    summary = write_viewer_data(tmp_path / "report", runs, bundle)
    assert summary == {"cases": 21, "images_copied": 0}
    (index,) = _js_payload(tmp_path / "report/data/index.js", "CHX.index")
    assert [r["label"] for r in index["runs"]] == ["oracle · implicit", "weak · none"]
    assert len(index["cases"]) == 21 and index["fail"]["r0"] == [0] * 21
    assert index["cases"][0][:3] == ["atelectasis_s50000000_positive_0", "atelectasis", "RR"]
    assert index["images"] == {"mode": "linked", "root": str(bundle.root), "found": True}

    key, _, _, file_name = index["cases"][0]
    got_key, case = _js_payload(tmp_path / "report/data/cases" / file_name, "CHX.case")
    assert got_key == key
    assert [t["task"] for t in case["turns"]][:3] == ["detection", "contour_eval", "expansion"]
    det = case["turns"][0]
    assert det["images"] == [
        {
            "name": f"chexpercept/{key}/detection_qa/xray.png",
            "src": (bundle.root / f"chexpercept/{key}/detection_qa/xray.png").resolve().as_uri(),
        }
    ]
    assert det["gold"] == [1] and det["gold_text"] == "Yes" and det["options"] == ["Yes", "No"]
    weak = runs[1].records[key]
    for turn in weak.turns:
        shown = case["runs"]["r1"]["turns"][turn.task]
        assert shown["response"] == turn.response and shown["correct"] == turn.correct
        assert shown["user_text"] is None  # the model saw the bundle's text
    assert case["runs"]["r1"]["first_fail"] == first_failing_stage(weak)
    assert index["fail"]["r1"][0] == first_failing_stage(weak)


def test_embed_images_copies_only_the_images_shown(bundle, tmp_path):
    simulate_run(bundle, tmp_path / "runs", "oracle", accuracy=1.0)
    write_viewer_data(tmp_path / "report", _viewer_runs(tmp_path / "runs"), bundle, embed_images=True)
    copied = sorted(
        p.relative_to(tmp_path / "report/images") for p in (tmp_path / "report/images").rglob("*.png")
    )
    needed = sorted({p for c in bundle.cases for t in c.turns for p in t.images})
    assert [str(p) for p in copied] == needed
    (index,) = _js_payload(tmp_path / "report/data/index.js", "CHX.index")
    _, case = _js_payload(tmp_path / "report/data/cases" / index["cases"][0][3], "CHX.case")
    assert case["turns"][0]["images"][0]["src"].startswith("images/chexpercept/")


def test_without_bundle_the_viewer_uses_the_recorded_conversation(bundle, tmp_path):
    simulate_run(bundle, tmp_path / "runs", "oracle", accuracy=1.0)
    write_viewer_data(tmp_path / "report", _viewer_runs(tmp_path / "runs"), None)
    (index,) = _js_payload(tmp_path / "report/data/index.js", "CHX.index")
    assert index["images"]["found"] is False
    _, case = _js_payload(tmp_path / "report/data/cases" / index["cases"][0][3], "CHX.case")
    assert case["turns"][0]["text"].startswith("Is any finding suggestive of atelectasis")
    assert case["turns"][0]["images"][0]["src"] is None


def test_runs_of_another_bundle_are_refused(bundle, tmp_path, fresh_bundle):
    simulate_run(bundle, tmp_path / "runs", "oracle", accuracy=1.0)
    other = read_bundle(fresh_bundle, check_images="none", lesions=["edema"])
    with pytest.raises(ValueError, match="not in the bundle .* Pass the right --data-dir"):
        write_viewer_data(tmp_path / "report", _viewer_runs(tmp_path / "runs"), other)


def test_case_file_names_are_safe_and_distinct():
    assert case_file_name("edema_s1_positive_0") == "edema_s1_positive_0.js"
    odd = [case_file_name("a/b"), case_file_name("a:b"), case_file_name("a_b")]
    assert len(set(odd)) == 3 and all("/" not in n and ":" not in n for n in odd)


def test_discovery_reads_both_layouts_and_refuses_duplicates(bundle, tmp_path):
    simulate_run(bundle, tmp_path / "runs", "tiny", accuracy=0.5, oracle="none")
    ref = tmp_path / "runs" / "opensource_qwen3.6-27b_no_thinking" / "oracle_implicit"
    ref.mkdir(parents=True)
    (ref / "all_results.json").write_text("{}")
    runs = discover_runs(tmp_path / "runs")
    assert [(r.model, r.oracle, r.layout) for r in runs] == [
        ("qwen3.6-27b_no_thinking", "implicit", "reference"),
        ("tiny", "none", "chexpercept"),
    ]
    assert discover_runs(tmp_path / "runs" / "tiny" / "oracle_none")[0].model == "tiny"
    copy = tmp_path / "runs" / "again" / "oracle_none"
    copy.mkdir(parents=True)
    for name in ("results.jsonl", "run.json"):
        (copy / name).write_bytes((tmp_path / "runs/tiny/oracle_none" / name).read_bytes())
    with pytest.raises(ValueError, match="two runs of model 'tiny' with oracle 'none'"):
        discover_runs(tmp_path / "runs")
    with pytest.raises(FileNotFoundError, match="no runs found under"):
        discover_runs(bundle.root)


def test_markdown_tables_become_html_with_na_cells_and_escaping():
    md = (
        "## Table 2\n\nValues in %, **95% CI** in brackets.\n\n"
        "| Model | S1 | S3 |\n| --- | ---: | --- |\n| Proprietary |  |  |\n"
        "| <b>x</b> | 84.3 [80.1, 88.0] | N/A |\n\n- one\n- two\n"
    )
    out = markdown_to_html(md)
    assert "<h4>Table 2</h4>" in out
    assert "<strong>95% CI</strong>" in out
    assert '<tr class="group"><td>Proprietary</td>' in out
    assert (
        '<td>&lt;b&gt;x&lt;/b&gt;</td><td class="num">84.3 <span class="ci">[80.1, 88.0]</span></td>'
        '<td class="na">N/A</td>'
    ) in out
    assert "<ul><li>one</li><li>two</li></ul>" in out
