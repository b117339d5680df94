"""Loading runs: our runner's folders (run.json + results.jsonl) and the reference's all_results.json."""

import json
import random

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.metrics import detect, load_run, load_runs, score_model, score_path
from chexpercept.metrics.reference import read_reference_results, write_reference_results
from chexpercept.metrics.runs import run_from_records
from chexpercept.metrics.simulate import simulate_records
from chexpercept.run_metadata import BundleInfo

RUN_META = {
    "model": "tiny",
    "backend": "transformers",
    "parse_mode": "reference",
    "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64, "greedy": True},
    "seed": 0,
    "started": "2026-11-29T10:00:00",
    "finished": "2026-11-29T10:05:00",
    "bundle": {"path": "/data/bundle", "fingerprint": "0" * 64, "synthetic": True},
}


@pytest.fixture(scope="module")
def bundle(fixture_bundle):
    return read_bundle(fixture_bundle, check_images="none")


def _write_run(folder, records, meta):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    if meta is not None:
        (folder / "run.json").write_text(json.dumps(meta))
    return folder


def _records(bundle, oracle, p_right=0.7, seed=0):
    rnd = random.Random(seed)
    return simulate_records(bundle.cases, lambda c, t: rnd.random() < p_right, oracle=oracle, seed=seed)


def test_detect_every_kind_of_path(tmp_path, bundle):
    run = _write_run(tmp_path / "m" / "oracle_none", _records(bundle, "none"), {**RUN_META, "oracle": "none"})
    assert detect(run) == ("chexpercept", run)
    assert detect(run / "results.jsonl") == ("chexpercept", run)
    assert detect(run / "run.json") == ("chexpercept", run)
    assert detect(tmp_path / "m") == ("model", tmp_path / "m")
    ref = tmp_path / "opensource_x" / "oracle_implicit"
    ref.mkdir(parents=True)
    (ref / "all_results.json").write_text("{}")
    assert detect(ref) == ("reference", ref / "all_results.json")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        detect(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="found no results: expected results.jsonl"):
        detect(tmp_path / "empty")


def test_run_metadata_and_notes(tmp_path, bundle):
    records = _records(bundle, "implicit")
    full = load_run(
        _write_run(tmp_path / "a" / "oracle_implicit", records, {**RUN_META, "oracle": "implicit"})
    )
    assert (full.oracle, full.greedy, full.model, full.parse_mode) == ("implicit", True, "tiny", "reference")
    # the bundle run.json names is not on this disk: its answer key cannot be checked, and that is said
    (unchecked,) = full.notes
    assert "its answer key (each line's gold) is not checked against a bundle" in unchecked
    meta = {"oracle": "implicit", "sampling": {"temperature": 0.7}, "model": "x", "parse_mode": "reference"}
    sampled = load_run(_write_run(tmp_path / "b" / "oracle_implicit", records, meta))
    assert sampled.greedy is False
    assert any("no sampling.greedy; taken from temperature=0.7" in n for n in sampled.notes)
    assert any("has not finished" in n for n in sampled.notes)
    bare = load_run(_write_run(tmp_path / "c" / "oracle_implicit", records, None))
    assert bare.greedy is None and bare.oracle == "implicit" and bare.model == "c"
    assert any("no run.json" in n for n in bare.notes)
    report = score_model([bare])
    assert report.flat["e2e/stage1/all"] is None and report.flat["op/stage2/all"] is not None
    assert any("unknown decoding" in n for n in report.notes)
    with pytest.raises(ValueError, match="says oracle 'none' but the cases were run with 'implicit'"):
        load_run(_write_run(tmp_path / "d" / "oracle_none", records, {**RUN_META, "oracle": "none"}))


def test_model_folder_takes_e2e_from_none_and_op_from_implicit(tmp_path, bundle):
    model = tmp_path / "tiny"
    # the none run answers everything right, the implicit run everything wrong: each number must
    # come from the run that measures it
    _write_run(model / "oracle_none", _records(bundle, "none", 1.0), {**RUN_META, "oracle": "none"})
    _write_run(
        model / "oracle_implicit", _records(bundle, "implicit", 0.0), {**RUN_META, "oracle": "implicit"}
    )
    runs = load_runs(model)
    assert sorted(r.oracle for r in runs) == ["implicit", "none"]
    report = score_model(runs)
    assert report.flat["e2e/stage4/all"] == 1.0 and report.flat["depth/RR"] == 4.0
    assert report.flat["op/stage2/all"] == 0.0 and report.flat["sub/location"] == 0.0
    assert report.sources["e2e"].oracle == "none" and report.sources["op"].oracle == "implicit"
    assert report.source_lines() == ["End-to-End: oracle none run", "Oracle-Passed: oracle implicit run"]
    with pytest.raises(ValueError, match="two oracle none runs"):
        score_model([runs[0], runs[0]] if runs[0].oracle == "none" else [runs[1], runs[1]])


def test_sources_for_every_combination(bundle):
    recs = {s: _records(bundle, s) for s in ("none", "implicit", "explicit")}

    def report(*runs):
        return score_model([run_from_records(recs[s], oracle=s, greedy=g) for s, g in runs])

    explicit = report(("explicit", True))
    assert explicit.sources["op"].oracle == "explicit" and explicit.sources["e2e"].oracle == "explicit"
    sampled = report(("implicit", False))
    assert sampled.sources["e2e"] is None and any("was sampled" in n for n in sampled.notes)
    both = report(("implicit", True), ("explicit", True))
    assert both.sources["op"].oracle == "implicit" and any("implicit one" in n for n in both.notes)
    none_only = report(("none", True))
    assert none_only.sources["op"] is None and none_only.flat["sub/expansion"] is None
    with pytest.raises(ValueError, match="different bundles"):
        a = run_from_records(recs["none"], oracle="none")
        b = run_from_records(recs["implicit"], oracle="implicit")
        a.meta.bundle, b.meta.bundle = BundleInfo(fingerprint="a"), BundleInfo(fingerprint="b")
        score_model([a, b])


def test_score_path_checks_runs_against_the_bundle(tmp_path, bundle, fixture_bundle):
    records = _records(bundle, "none")
    folder = _write_run(tmp_path / "m" / "oracle_none", records[:-2], {**RUN_META, "oracle": "none"})
    report = score_path(folder, bundle=fixture_bundle)
    assert any("2 of the bundle's 21 cases have no result" in n for n in report.notes)
    assert any("fingerprint differs from the bundle's" in n for n in report.notes)
    records[0].turns[0].gold = [2] if records[0].turns[0].gold == [1] else [1]
    bad = _write_run(tmp_path / "n" / "oracle_none", records, {**RUN_META, "oracle": "none"})
    with pytest.raises(ValueError, match=f"case {records[0].key_id}, detection: gold"):
        score_path(bad, bundle=fixture_bundle)


def _reference_folder(tmp_path, bundle, oracle="implicit", model="opensource_tiny", seed=0, records=None):
    records = records or _records(bundle, oracle, seed=seed)
    for rec in records:  # an implicit oracle patches wrong answers in the history
        for t in rec.turns:
            if oracle == "implicit" and not t.correct:
                t.patched_to = "Answer: " + ",".join(map(str, sorted(t.gold)))
    path = tmp_path / model / f"oracle_{oracle}" / "all_results.json"
    write_reference_results(run_from_records(records, oracle=oracle, model=model), bundle, path)
    return path, records


def test_reference_results_round_trip(tmp_path, bundle):
    path, records = _reference_folder(tmp_path, bundle)
    data = json.loads(path.read_text())
    entry = data[records[0].key_id]
    assert set(entry) >= {"key_id", "qa_path", "detection_qa", "_chat_history_idx", "chat_history"}
    run = read_reference_results(path, bundle)
    # one naming rule with `chexpercept report`: the model is the folder name after the first underscore
    assert run.kind == "reference" and run.oracle == "implicit" and run.model == "tiny"
    assert run.meta.provider == "opensource"
    assert [r.key_id for r in run.records] == [r.key_id for r in records]
    # the raw (pre-patch) text is what gets re-parsed, so verdicts match the stored ones
    for ours, theirs in zip(run.records, records):
        assert [t.response for t in ours.turns] == [t.response for t in theirs.turns]
    report = score_model([run])
    assert report.runs[0]["verdict_agreement"] == 1.0
    direct = score_model([run_from_records(records, oracle="implicit")])
    assert report.values["op/stage2/all"] == direct.values["op/stage2/all"]
    assert report.flat == direct.flat | {k: None for k in report.flat if k.startswith(("e2e/", "depth/"))}
    assert any("unknown decoding" in n for n in report.notes)
    greedy = score_model([read_reference_results(path, bundle, greedy=True)])
    assert greedy.flat == direct.flat


def test_reference_reader_errors(tmp_path, bundle, fixture_bundle):
    path, records = _reference_folder(tmp_path, bundle)
    with pytest.raises(ValueError, match="needs the release bundle"):
        load_run(path)
    data = json.loads(path.read_text())
    key = records[0].key_id
    data[key]["detection_qa"]["ground_truth"] = 2 if data[key]["detection_qa"]["ground_truth"] == 1 else 1
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"case {key}, detection: stored ground truth"):
        load_run(path, bundle=fixture_bundle)
    data = {"flu_s1_positive_0": {"qa_path": "revision_free"}}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="flu_s1_positive_0 is not in the bundle"):
        load_run(path, bundle=bundle)
    odd = tmp_path / "elsewhere.json"
    odd.write_text("{}")
    with pytest.raises(ValueError, match="pass --oracle"):
        load_run(odd, bundle=bundle)
    assert load_run(odd, bundle=bundle, oracle="none").records == []


def test_reference_unscored_turns_wrong_or_skipped(tmp_path, bundle):
    records = _records(bundle, "none", p_right=1.0)
    rf = next(r for r in records if r.path == "RF" and r.lesion != "cardiomegaly")
    rf.turns[0].response = "<think>truncated before the answer</think>"  # pass-1 string is empty
    rf.turns[1].response = "<think>again</think>"
    path, _ = _reference_folder(tmp_path, bundle, oracle="none", records=records)
    assert json.loads(path.read_text())[rf.key_id]["detection_qa"] == {}
    wrong = score_model([load_run(path, bundle=bundle)])
    skip = score_model([load_run(path, bundle=bundle, missing="skip")])
    i = wrong.scores["none"].key_ids.index(rf.key_id)
    assert wrong.scores["none"].e2e[i].tolist() == [False, False, False, False]
    # reference: detection counted wrong but the chain goes on; Stage 2 dropped
    assert skip.scores["none"].e2e[i].tolist() == [False, False, False, True]
    assert skip.scores["none"].stage_asked[i].tolist() == [True, False, False, True]
    assert skip.flat["e2e/stage1/RF"] == wrong.flat["e2e/stage1/RF"]
    assert skip.flat["e2e/stage4/RF"] == 1.0 and wrong.flat["e2e/stage4/RF"] < 1.0
    assert any("left out as the reference analysis does" in n for n in skip.notes)


def test_glm_answer_box_is_unwrapped_for_glm_folders(tmp_path, bundle):
    records = _records(bundle, "none", p_right=1.0)
    for rec in records:
        for t in rec.turns:
            t.response = "<|begin_of_box|>" + ",".join(map(str, t.gold)) + "<|end_of_box|>"
    glm, _ = _reference_folder(tmp_path, bundle, oracle="none", model="opensource_glm-4v", records=records)
    other, _ = _reference_folder(tmp_path, bundle, oracle="none", model="opensource_qwen", records=records)
    boxed = score_model([load_run(glm, bundle=bundle)])
    assert boxed.flat["e2e/stage4/all"] == 1.0
    assert boxed.parse["none"]["detection"]["statuses"] == {"bare": 1.0}
    # other models: the box is not unwrapped; the any-digit fallback still finds the numbers
    assert score_model([load_run(other, bundle=bundle)]).parse["none"]["detection"]["statuses"] == {
        "loose": 1.0
    }


def test_score_and_report_name_a_reference_run_alike(tmp_path, bundle):
    from chexpercept.metrics.discovery import discover_runs

    path, _ = _reference_folder(tmp_path, bundle)
    [found] = discover_runs(tmp_path)
    [run] = load_runs(path.parent.parent, bundle=bundle)
    assert found.model == run.model == "tiny"
    assert found.meta.provider == run.meta.provider == "opensource"
