from chexpercept.results import CaseResult, TurnResult, iter_results


def _record(key="effusion_s1_positive_0"):
    t = TurnResult(
        task="detection",
        stage=1,
        response="Answer: 1",
        parsed=[1],
        parse_status="answer",
        gold=[1],
        correct=True,
        n_options=2,
        multi_select=False,
    )
    return CaseResult(
        key_id=key,
        lesion="effusion",
        path="RR",
        oracle="none",
        turns=[t],
        conversation=[{"role": "user", "text": "q", "images": ["chexpercept/x/detection_qa/xray.png"]}],
    )


def test_round_trip_and_torn_last_line(tmp_path):
    p = tmp_path / "results.jsonl"
    a, b = _record("a_1"), _record("b_2")
    p.write_text(a.to_json() + "\n" + b.to_json() + "\n" + b.to_json()[:20])
    got = list(iter_results(p))
    assert [r.key_id for r in got] == ["a_1", "b_2"]
    assert got[0] == a and got[0].turn("detection").correct


def test_bad_middle_line_raises(tmp_path):
    import pytest

    p = tmp_path / "results.jsonl"
    p.write_text(_record().to_json() + "\n{broken\n" + _record().to_json() + "\n")
    with pytest.raises(ValueError, match="results.jsonl:2"):
        list(iter_results(p))
