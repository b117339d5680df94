"""Stratified bootstrap intervals and the paired comparison of two models."""

import random

import numpy as np
import pytest

from chexpercept.metrics import bootstrap_intervals, compare_reports, run_from_records, score_model
from chexpercept.metrics.bootstrap import replicates, stratified_weights
from chexpercept.metrics.simulate import fixture_cases, simulate_records


@pytest.fixture(scope="module")
def cases():
    return fixture_cases(per_cell=12, seed=3)


def _report(cases, p_right, seed, name="m", oracle="implicit"):
    rnd = random.Random(seed)
    records = simulate_records(cases, lambda c, t: rnd.random() < p_right, oracle=oracle, seed=seed)
    return score_model([run_from_records(records, oracle=oracle, greedy=True, model=name)])


def test_weights_resample_within_each_cell():
    strata = np.array([0, 0, 0, 1, 1, 2, 5, 5, 5, 5])
    w = stratified_weights(strata, 200, np.random.default_rng(0))
    assert w.shape == (200, 10)
    for s in np.unique(strata):
        assert (w[:, strata == s].sum(axis=1) == (strata == s).sum()).all()
    assert w[:, 5].min() == 1  # a cell of one case always keeps it
    assert w.std() > 0


def test_vectorised_replicates_equal_a_naive_recomputation(cases):
    report = _report(cases, 0.6, seed=1)
    m = report.matrix
    w = stratified_weights(m.strata, 5, np.random.default_rng(7))
    reps = replicates(m, w)
    for b in range(5):
        idx = np.repeat(np.arange(len(m.key_ids)), w[b].astype(int))  # the resampled cases, listed
        for name in (
            "e2e/stage2/all",
            "op/stage4/RF",
            "depth/RR",
            "lesion/edema/e2e/stage1/all",
            "sub/location",
        ):
            j = m.names.index(name)
            applies = m.applies[idx, j]
            naive = m.weighted[idx, j][applies].mean()
            assert reps[name][b] == pytest.approx(naive)
    gain = reps["gain/stage2"]
    assert np.allclose(gain, reps["op/stage2/all"] - reps["e2e/stage2/all"])


def test_intervals_are_seeded_cover_the_estimate_and_skip_na(cases):
    report = _report(cases, 0.6, seed=1)
    a = bootstrap_intervals(report, n_resamples=300, seed=5)
    b = bootstrap_intervals(report, n_resamples=300, seed=5)
    c = bootstrap_intervals(report, n_resamples=300, seed=6)
    assert a == b and a != c
    for key in ("e2e/stage1/all", "op/stage3/RR", "depth/RF", "sub/comparison", "bias/stage2/delta"):
        lo, hi = a[key]
        assert lo <= report.values[key] <= hi and lo < hi, key
    assert a["e2e/stage2/LF"] is None and a["op/stage3/RF"] is None
    assert a["depth/RR"][1] <= 4.0


def test_degenerate_intervals_and_details():
    cases = fixture_cases(per_cell=3)
    records = simulate_records(cases, lambda c, t: True, oracle="none")
    report = score_model([run_from_records(records, oracle="none")]).with_intervals(100)
    assert report.intervals["e2e/stage4/all"] == (1.0, 1.0)
    assert report.intervals["op/stage2/all"] is None  # no oracle run: N/A, no interval
    details = report.to_dict()["intervals"]
    assert details["n_resamples"] == 100 and details["stratified_by"] == ["lesion", "path"]
    assert details["values"]["depth/RR"] == [4.0, 4.0]


def test_paired_comparison(cases):
    strong = _report(cases, 0.8, seed=1, name="strong")
    weak = _report(cases, 0.5, seed=2, name="weak")
    res = compare_reports(strong, weak, n_resamples=400, n_permutations=400, seed=0)
    s1 = res["e2e/stage1/all"]
    assert s1["difference"] == pytest.approx(strong.values["e2e/stage1/all"] - weak.values["e2e/stage1/all"])
    assert s1["interval"][0] > 0 and s1["p_value"] < 0.01 and s1["n"] == len(cases)
    assert res["e2e/stage2/LF"]["difference"] is None
    same = compare_reports(strong, strong, n_resamples=100, n_permutations=100)
    assert same["op/stage2/all"]["difference"] == 0.0 and same["op/stage2/all"]["p_value"] == 1.0
    # two noisy runs of the same model: mostly no evidence of a difference
    again = _report(cases, 0.8, seed=9, name="strong again")
    res2 = compare_reports(strong, again, n_resamples=200, n_permutations=400, seed=1)
    p_values = [r["p_value"] for r in res2.values() if r["p_value"] is not None]
    assert np.median(p_values) > 0.2


def test_comparison_uses_only_common_cases_and_checks_bundles(cases):
    a = _report(cases, 0.7, seed=1, name="a")
    half = cases[: len(cases) // 2]
    b = _report(half, 0.7, seed=1, name="b")
    res = compare_reports(a, b, keys=["e2e/stage1/all"], n_resamples=50, n_permutations=50)
    assert res["e2e/stage1/all"]["n"] == len(half)
    a.fingerprint, b.fingerprint = "x" * 64, "y" * 64
    with pytest.raises(ValueError, match="different bundles"):
        compare_reports(a, b)
    other = _report(fixture_cases(per_cell=1, seed=99, lesions=("edema",)), 0.5, seed=0)
    other.matrix.key_ids = [f"zz_{k}" for k in other.matrix.key_ids]
    with pytest.raises(ValueError, match="share no cases"):
        compare_reports(a, other)
