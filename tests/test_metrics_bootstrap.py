"""The earlier names (metrics/bootstrap.py) call the design-based method; the paired comparison's checks."""

import random

import pytest

from chexpercept.metrics import compare_reports, run_from_records, score_model
from chexpercept.metrics.inference import intervals
from chexpercept.metrics.simulate import fixture_cases, simulate_records


@pytest.fixture(scope="module")
def cases():
    return fixture_cases(per_cell=12, seed=3)


def _report(cases, p_right, seed, name="m", oracle="implicit"):
    rnd = random.Random(seed)
    records = simulate_records(cases, lambda c, t: rnd.random() < p_right, oracle=oracle, seed=seed)
    return score_model([run_from_records(records, oracle=oracle, greedy=True, model=name)])


def test_the_earlier_names_warn_and_give_the_design_based_numbers(cases):
    from chexpercept.metrics import bootstrap

    report = _report(cases, 0.6, seed=1)
    with pytest.warns(DeprecationWarning, match="need no resampling"):
        old = bootstrap.bootstrap_intervals(report, n_resamples=300, seed=5)
    assert old == intervals(report.matrix)
    other = _report(cases, 0.4, seed=2, name="other")
    with pytest.warns(DeprecationWarning):
        res = bootstrap.compare_reports(report, other, n_resamples=10, n_permutations=10, seed=1)
    assert res == compare_reports(report, other)


def test_intervals_cover_the_estimate_skip_na_and_say_their_method(cases):
    report = _report(cases, 0.6, seed=1).with_intervals()
    a = report.intervals
    for key in ("e2e/stage1/all", "op/stage3/RR", "depth/RF", "sub/comparison", "bias/stage2/delta"):
        lo, hi = a[key]
        assert lo <= report.values[key] <= hi and lo < hi, key
    assert a["e2e/stage2/LF"] is None and a["op/stage3/RF"] is None
    details = report.to_dict()["intervals"]
    assert details["unit"] == "case" and details["stratified_by"] == ["lesion", "path"]
    assert details["method"].startswith("design-based") and "n_resamples" not in details


def test_comparison_uses_only_common_cases_and_checks_bundles(cases):
    a = _report(cases, 0.7, seed=1, name="a")
    half = cases[: len(cases) // 2]
    b = _report(half, 0.7, seed=1, name="b")
    res = compare_reports(a, b, keys=["e2e/stage1/all"])
    assert res["e2e/stage1/all"]["n"] == len(half)
    a.fingerprint, b.fingerprint = "x" * 64, "y" * 64
    with pytest.raises(ValueError, match="different bundles"):
        compare_reports(a, b)
    other = _report(fixture_cases(per_cell=1, seed=99, lesions=("edema",)), 0.5, seed=0)
    other.matrix.key_ids = [f"zz_{k}" for k in other.matrix.key_ids]
    with pytest.raises(ValueError, match="share no cases"):
        compare_reports(a, other)
