"""The statistics of metrics/inference.py: design-based variance, intervals, tests, multiplicity, power.

Small, hand-checkable inputs; anything random is seeded.
"""

import math
import random

import numpy as np
import pytest
from scipy import stats

from chexpercept.metrics import run_from_records, score_model
from chexpercept.metrics.inference import (
    Estimate,
    adjust,
    cases_needed,
    design_strata,
    detectable_difference,
    estimate_columns,
    estimates,
    paired_columns,
    share_interval,
)
from chexpercept.metrics.simulate import fixture_cases, simulate_records


def _one(values, strata, name="e2e/stage1/all", applies=None):
    y = np.asarray(values, float)[:, None]
    a = np.ones_like(y, bool) if applies is None else np.asarray(applies)[:, None]
    return estimate_columns(y * a, a, np.asarray(strata), [name], min_cases=1)[name]


def test_the_variance_is_the_stratified_estimator_over_cases():
    # two cells: (1, 0, 1, 1) and (0, 0, 1); the mean is 4/7
    values, strata = [1, 0, 1, 1, 0, 0, 1], [0, 0, 0, 0, 3, 3, 3]
    est = _one(values, strata)
    n = 7
    theta = 4 / 7
    z = (np.array(values) - theta) / n
    by_hand = 0.0
    for cell in (0, 3):
        zc = z[np.array(strata) == cell]
        by_hand += len(zc) / (len(zc) - 1) * ((zc - zc.mean()) ** 2).sum()
    assert est.value == pytest.approx(theta)
    assert est.se == pytest.approx(math.sqrt(by_hand))
    assert (est.df, est.n, est.share) == (7 - 2, 7, True)
    # the same numbers over one cell: a plain sample, se = s / sqrt(n)
    flat = _one(values, [0] * 7)
    assert flat.se == pytest.approx(np.std(values, ddof=1) / math.sqrt(7))


def test_cells_of_few_cases_are_pooled_per_path():
    strata = np.repeat(np.arange(21), 2)  # 2 cases per (lesion, path) cell
    pooled = design_strata(strata, min_cases=10)
    assert set(pooled) == {-1, -2, -3} and (pooled == -1 - strata % 3).all()
    big = np.repeat(np.arange(21), 10)
    assert (design_strata(big, min_cases=10) == big).all()
    # two cases that agree in every cell would otherwise claim no variation at all
    values = np.tile([1.0, 1.0, 0.0, 0.0], 21)[:42]
    y = values[:, None]
    a = np.ones_like(y, bool)
    alone = estimate_columns(y, a, strata, ["e2e/stage1/all"], min_cases=1)["e2e/stage1/all"]
    assert alone.se == 0.0
    assert estimate_columns(y, a, strata, ["e2e/stage1/all"])["e2e/stage1/all"].se > 0


def test_korn_graubard_is_clopper_pearson_for_a_plain_sample_and_keeps_width_at_zero():
    n, x = 50, 15
    p = x / n
    est = Estimate(p, math.sqrt(p * (1 - p) / n), n - 1, n, share=True)
    lo, hi = est.interval(0.95)
    assert lo == pytest.approx(stats.beta.ppf(0.025, x, n - x + 1))
    assert hi == pytest.approx(stats.beta.ppf(0.975, x + 1, n - x))
    # 0 of 700: not [0, 0] but Clopper-Pearson's [0, 1 - 0.025^(1/700)] = [0, 0.53%]
    lo, hi = share_interval(Estimate(0.0, 0.0, 699, 700, share=True))
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 700)) and 0.005 < hi < 0.0055
    lo, hi = share_interval(Estimate(1.0, 0.0, 699, 700, share=True))
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 700))


def _constant_answer_scores(per_cell=12):
    """baseline:constant:1 (always option 1) on fixture cases: Stage 1 right on RR and RF, wrong on LF."""
    cases = fixture_cases(per_cell=per_cell, seed=3)
    records = simulate_records(cases, lambda c, t: "Answer: 1", oracle="implicit")
    return score_model([run_from_records(records, oracle="implicit", greedy=True, model="constant")])


def test_a_constant_answer_has_no_sampling_variation_where_the_gold_answer_is_fixed_per_path():
    scores = _constant_answer_scores().with_intervals()
    est = estimates(scores.matrix)
    # Stage 1: gold Yes on every RR and RF case, No on every LF case (paper Table 5), so every
    # resample of cases within the cells gives 2/3: a zero-width interval is exact, and marked so
    s1 = est["e2e/stage1/all"]
    assert s1.value == pytest.approx(2 / 3) and not s1.varies
    assert scores.intervals["e2e/stage1/all"] == pytest.approx((2 / 3, 2 / 3))
    # Stage 3's gold answers vary per case: an observed 0% is an estimate, with an interval above 0
    s3 = est["e2e/stage3/all"]
    lo, hi = scores.intervals["e2e/stage3/all"]
    assert s3.value == 0.0 and lo == 0.0 and hi > 0.03


def test_the_interval_leaves_out_zero_exactly_when_the_test_rejects():
    rng = np.random.default_rng(0)
    strata = np.repeat(np.arange(21), 12)
    names = ["e2e/stage2/all", "depth/RR"]
    agree = 0
    for _ in range(200):
        shift = rng.uniform(-0.3, 0.3)
        a = (rng.random((len(strata), 2)) < 0.5).astype(float)
        b = (rng.random((len(strata), 2)) < 0.5 + shift).astype(float)
        b[:, 1] *= 3  # a depth-like column
        paired = paired_columns(a, b, np.ones_like(a, bool), strata, names)
        for name in names:
            d = paired[name].difference
            lo, hi = d.interval(0.95)
            assert (lo > 0 or hi < 0) == (d.p_value() < 0.05), (name, d)
            agree += 1
    assert agree == 400


def test_the_paired_difference_carries_the_pairing():
    rng = np.random.default_rng(1)
    strata = np.repeat(np.arange(21), 20)
    a = (rng.random(len(strata)) < 0.6).astype(float)
    b = a.copy()
    flip = rng.random(len(strata)) < 0.1  # the models differ on 10% of the cases
    b[flip] = 1 - b[flip]
    y = np.column_stack([a]), np.column_stack([b])
    applies = np.ones((len(strata), 1), bool)
    p = paired_columns(*y, applies, strata, ["e2e/stage2/all"])["e2e/stage2/all"]
    # by hand: the stratified variance of the per-case differences
    d = (a - b) / len(strata)
    var = sum(
        (k := (strata == s).sum()) / (k - 1) * ((d[strata == s] - d[strata == s].mean()) ** 2).sum()
        for s in range(21)
    )
    assert p.difference.se == pytest.approx(math.sqrt(var))
    assert p.difference.se < 0.5 * math.hypot(p.a.se, p.b.se)  # far below two independent samples


def test_two_models_that_never_differ_get_p_one_and_an_interval_wider_than_zero():
    scores = _constant_answer_scores()
    paired = paired_columns(
        scores.matrix.weighted,
        scores.matrix.weighted,
        scores.matrix.applies,
        scores.matrix.strata,
        scores.matrix.names,
    )
    d = paired["op/stage2/all"].difference
    lo, hi = d.interval()
    assert d.value == 0 and d.p_value() == 1.0 and lo < 0 < hi
    assert hi == pytest.approx(share_interval(Estimate(0.0, 0.0, d.df, d.n, share=True))[1])


def test_gains_are_shares_of_cases_and_differences_stay_within_one():
    cases = fixture_cases(per_cell=3, seed=5)
    rnd = random.Random(5)
    implicit = simulate_records(cases, lambda c, t: rnd.random() < 0.4, oracle="implicit")
    one_run = score_model([run_from_records(implicit, oracle="implicit", greedy=True)]).with_intervals()
    # End-to-End from the oracle run itself: a case gains (0 or 1) where OP passed and E2E did not
    gain = estimates(one_run.matrix)["gain/stage2"]
    assert gain.share and 0 < gain.value < 1
    lo, hi = one_run.intervals["gain/stage2"]
    assert 0 <= lo < gain.value < hi <= 1
    # End-to-End from a separate none run: a case can lose too; a difference of shares, within ±1
    none = simulate_records(cases, lambda c, t: rnd.random() < 0.6, oracle="none")
    runs = [run_from_records(none, oracle="none"), run_from_records(implicit, oracle="implicit", greedy=True)]
    two_runs = score_model(runs).with_intervals()
    gain = estimates(two_runs.matrix)["gain/stage2"]
    assert gain.limit == 1.0 and not gain.share
    for key in ("gain/stage2", "bias/stage2/delta"):
        lo, hi = two_runs.intervals[key]
        assert -1 <= lo <= two_runs.values[key] <= hi <= 1, key


def test_holm_and_benjamini_hochberg():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005 x 4, 0.01 x 3, 0.03 x 2, 0.04 x 1, made monotone
    assert adjust(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: p_(i) m / i from the top, made monotone: 0.04, 0.04, 0.04, 0.02
    assert adjust(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust(p, "none") == p and adjust([], "holm") == []
    assert adjust([0.9, 0.8], "holm") == [1.0, 1.0]
    with pytest.raises(ValueError, match="unknown adjustment 'bonferoni'"):
        adjust(p, "bonferoni")


def test_detectable_difference_and_cases_needed_invert_each_other():
    sd, n, cells = math.sqrt(0.5), 700, 7
    mde = detectable_difference(sd / math.sqrt(n), n - cells)
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    assert mde == pytest.approx(z * sd / math.sqrt(n), rel=0.01)  # 7.5 points for 700 cases
    assert round(100 * mde, 1) == 7.5
    assert cases_needed(sd, mde, cells=cells) in (n, n + 1)
    # a family of 10 tests: level 0.005, a larger detectable difference and more cases
    assert detectable_difference(sd / math.sqrt(n), n - cells, tests=10) > 1.3 * mde
    assert cases_needed(sd, 0.05, cells=cells, tests=10) > cases_needed(sd, 0.05, cells=cells)
    with pytest.raises(ValueError, match="above 0"):
        cases_needed(sd, 0.0)


def test_a_difference_with_a_part_that_does_not_apply_does_not_apply():
    cases = fixture_cases(per_cell=2, seed=1)
    records = simulate_records(cases, lambda c, t: True, oracle="none")
    scores = score_model([run_from_records(records, oracle="none")]).with_intervals()  # no oracle run
    assert scores.values["gain/stage2"] is None and scores.intervals["gain/stage2"] is None
    assert estimates(scores.matrix)["gain/stage2"] is None


def test_a_depth_at_its_limit_keeps_a_width_and_intervals_stay_within_the_possible_values():
    from chexpercept.metrics.columns import value_range

    assert value_range("depth/RR") == (0.0, 4.0) and value_range("lesion/cardiomegaly/depth_native/RF") == (
        0,
        2,
    )
    assert value_range("sub/location") == (0.0, 1.0) and value_range("gain/stage2") is None
    cases = fixture_cases(per_cell=2, seed=1)
    records = simulate_records(cases, lambda c, t: True, oracle="implicit")  # the oracle baseline
    scores = score_model([run_from_records(records, oracle="implicit", greedy=True)]).with_intervals()
    lo, hi = scores.intervals["depth/RR"]
    assert scores.values["depth/RR"] == 4.0 and 3.0 < lo < 4.0 and hi == 4.0
    rnd = random.Random(2)
    records = simulate_records(cases, lambda c, t: rnd.random() < 0.1, oracle="implicit")
    scores = score_model([run_from_records(records, oracle="implicit", greedy=True)]).with_intervals()
    for key in ("depth/RR", "depth/RF", "lesion/edema/depth_native/RR"):
        low, high = value_range(key)
        lo, hi = scores.intervals[key]
        assert low <= lo <= scores.values[key] <= hi <= high, key


def test_one_model_right_on_every_case_the_other_wrong_is_a_sign_test():
    strata = np.repeat(np.arange(7) * 3, 2)  # 14 RR cases, 2 per cell
    right, wrong = np.ones((14, 1)), np.zeros((14, 1))
    d = paired_columns(right, wrong, np.ones((14, 1), bool), strata, ["e2e/stage3/RR"])["e2e/stage3/RR"]
    d = d.difference
    lo, hi = d.interval(0.95)
    assert d.value == 1.0 and hi == 1.0 and lo == pytest.approx(1 - 2 * (1 - 0.025 ** (1 / 14)))
    assert d.p_value() == pytest.approx(2 * 0.5**14)  # not 0, not an interval of [1, 1]
    few = paired_columns(right[:4], wrong[:4], np.ones((4, 1), bool), strata[:4], ["e2e/stage3/RR"])
    d = few["e2e/stage3/RR"].difference  # 4 cases: the sign test cannot reject, nor can the interval
    lo, hi = d.interval(0.95)
    assert d.p_value() == 0.125 and lo < 0 < hi
