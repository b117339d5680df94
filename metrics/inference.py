"""Intervals, paired tests, multiplicity and power: one design-based method for every number.

**Unit and strata.** The release draws a fixed number of cases (100) in each of its 21 (lesion, path)
cells, and every number is the mean of one value per case over the cases it applies to (a stage
passed, a depth, a sub-task's verdict: ``columns``). So the case is the unit: its turns are folded
into its per-case values before any statistic, and 10,400 turns never count as 10,400 independent
observations (there are 2,100 images). The cells are the strata: their sizes are the design's, not
chance's, so no statistic lets them vary.

**Variance.** A metric is a ratio of two per-case totals, ``θ = Σ a_i y_i / Σ a_i`` (``a_i``: the
metric applies to case i). Its linearised value per case is ``z_i = a_i (y_i - θ) / Σ a``, and its
variance over draws of cases with the release's cell sizes is estimated by the stratified
with-replacement estimator ``V = Σ_h n_h / (n_h - 1) Σ_{i in h} (z_i - mean_h z)²``: survey
statistics' Taylor-linearisation estimator with cases as primary units (what R's ``survey`` and
Stata's ``svy`` compute with these strata, and what a rescaled stratified bootstrap approximates
without Monte Carlo noise). A cell of fewer than ``MIN_CELL_CASES`` cases (a subset, the demo) cannot
estimate its own variance (two cases that agree would claim none), so such cells are pooled with the
other lesions of their path (``design_strata``); a stratum that still holds one case is compared with
the overall mean (``survey``'s ``lonely.psu = "adjust"``), which errs wide. Degrees of freedom: the
cases minus the strata, over the strata the metric applies to.

**Intervals.** A share (a mean of 0/1 values) gets the Korn-Graubard interval: Clopper-Pearson at
the effective number of cases ``p (1 - p) / V``, scaled for the degrees of freedom; it stays inside
[0, 1] and keeps a width at 0% and 100% (0 of 700 gives [0, 0.5%]); so does a gain of
Oracle-Passed over End-to-End whose every case is 0 or 1 (the share of cases that pass only with the
oracle: always so when both come from one oracle run). Depth, point counts and
differences get ``θ ± t_df · sqrt(V)``, kept within the values a case can have; a depth at its
lowest or highest possible value, or a difference of shares with no case differing, keeps a width
from the Clopper-Pearson bound of the share of cases that could be elsewhere.

**Paired differences.** Two models on the same cases: the difference of their linearised values per
case carries the pairing (how often both pass or fail the same case), so the same estimator gives the
standard error of ``θ_A - θ_B``. The test is the t test with that standard error and the interval is
the same t inverted: the interval leaves out 0 exactly when ``p < 1 - level``.

**Multiplicity.** p-values of a family of tests are adjusted together: Holm by default (strong
control of the family-wise error rate under any dependence; the stages of one model are strongly
dependent), Benjamini-Hochberg on request (false discovery rate, for screening many cells).

**Power.** The smallest true difference a two-sided test at level ``alpha`` detects with probability
``power`` is ``(t_{1-alpha/2} + t_{power}) · SE``; with ``SE = sd / sqrt(n)`` (``sd``: the per-case
standard deviation of the paired difference within cells) the cases needed for a difference ``d`` are
``((t_{1-alpha/2} + t_{power}) · sd / d)²``.

**No variation.** When every case of each cell has the same value, ``V = 0``: no draw of cases with the
release's cells can change the number, and its interval has zero width. For a constant answer to
Stage 1 or Stage 2 this is exact (their gold answer is the same for every case of a path, paper
Table 5); otherwise it says the cells are too small to show any variation. ``Estimate.varies`` is
False then; the tables mark such intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from chexpercept.domains import COUNT, FAMILY, LEVEL, NON_NEGATIVE, POWER, SHARE
from chexpercept.vocab import PATHS

from .columns import ALIASES, DERIVED, ColumnMatrix, is_share, value_range

#: multiplicity adjustments: Holm (family-wise error), Benjamini-Hochberg (false discovery rate), none
ADJUSTMENTS: tuple[str, ...] = ("holm", "bh", "none")
DEFAULT_LEVEL = 0.95
DEFAULT_POWER = 0.8
#: cells with fewer cases than this are pooled with the other lesions of their path (``design_strata``)
MIN_CELL_CASES = 10
#: how the intervals are made, in a few words (``--details``, the legends)
INTERVAL_METHOD = (
    "design-based: cases the unit, lesion x path cells the strata (Taylor linearisation); "
    "Korn-Graubard for shares, t otherwise"
)


@dataclass(frozen=True)
class Estimate:
    """One number with its design-based standard error.

    value: the metric (a fraction, stages, or a difference of them); se: its standard error, 0 when
    no cell shows variation; df: degrees of freedom (cases minus cells); n: cases it applies to;
    share: the per-case values are 0/1 (an accuracy or a rate).
    """

    value: float
    se: float
    df: int
    n: int
    share: bool = False
    #: for a difference of shares, the largest |value| one case can have (1; 2 for the paired
    #: difference of two models' gains): the interval stays within ±limit
    limit: float | None = None
    #: for a depth, the lowest and highest value one case can have: the interval stays within them
    bounds: tuple[float, float] | None = None

    @property
    def varies(self) -> bool:
        """False when every case of each cell has the same value (zero-width interval)."""
        return self.se > 0

    def interval(self, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
        """Korn-Graubard for a share, ``difference_interval`` for a difference of shares,
        ``bounded_interval`` for a depth, t otherwise (see the module docstring)."""
        if self.share:
            return share_interval(self, level)
        if self.limit is not None:
            return difference_interval(self, level)
        if self.bounds is not None:
            return bounded_interval(self, level)
        return t_interval(self, level)

    def p_value(self) -> float:
        """Two-sided t test of value = 0 (for a paired difference: no difference). Without variation:
        1 at 0; for a difference of shares where every case differs the same way, the sign test's
        ``2 · 0.5^n`` (what ``difference_interval`` inverts); otherwise 0."""
        if self.se <= 0:
            if self.value == 0:
                return 1.0
            if self.limit is not None and abs(self.value) == self.limit:
                return min(1.0, 2 * 0.5**self.n)
            return 0.0
        return 2 * _t_cdf(-abs(self.value) / self.se, self.df)

    def detectable(
        self, level: float = DEFAULT_LEVEL, power: float = DEFAULT_POWER, tests: int = 1
    ) -> float | None:
        """The smallest true value this estimate's test detects with ``power`` (None without variation)."""
        if self.se <= 0:
            return None
        return detectable_difference(self.se, self.df, level=level, power=power, tests=tests)


def _t_quantile(q: float, df: float) -> float:
    """Quantile of Student's t (scipy imported on first use: scoring without intervals stays light)."""
    from scipy.special import stdtrit

    return float(stdtrit(df, q))


def _t_cdf(x: float, df: float) -> float:
    from scipy.special import stdtr

    return float(stdtr(df, x))


def _beta_quantile(q: float, a: float, b: float) -> float:
    from scipy.special import betaincinv

    return float(betaincinv(a, b, q))


def _check_level(level: float) -> float:
    LEVEL.require(level, "level")
    return level


def t_interval(est: Estimate, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """``value ± t_df(1 - (1 - level)/2) · se``, within ``±limit`` where the value is bounded."""
    half = _t_quantile(1 - (1 - _check_level(level)) / 2, est.df) * est.se
    lo, hi = est.value - half, est.value + half
    if est.limit is not None:
        lo, hi = max(lo, -est.limit), min(hi, est.limit)
    return lo, hi


def difference_interval(est: Estimate, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Interval of a difference of shares (two models', or a gain): the t interval within ±limit;
    when no case differs at all, ±limit times the upper bound of the share of cases that differ, 0 of
    n (``share_interval``): a difference cannot exceed that share, and 0 of n does not prove it is 0.
    When every case differs by the whole limit the same way (one model right on every case, the
    other wrong), the cases that could differ less are at most Clopper-Pearson's ``1 - (α/2)^(1/n)``
    of them, each at worst -limit: the interval leaves out 0 exactly when the sign test's p does."""
    limit = est.limit or 1.0
    if est.se <= 0 and est.value == 0:
        bound = share_interval(Estimate(0.0, 0.0, est.df, est.n, share=True), level)[1]
        return -limit * bound, limit * bound
    if est.se <= 0 and abs(est.value) == limit:
        rest = 1 - ((1 - _check_level(level)) / 2) ** (1 / est.n)
        near = limit * (1 - 2 * rest)
        return (near, limit) if est.value > 0 else (-limit, -near)
    return t_interval(est, level)


def bounded_interval(est: Estimate, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Interval of a mean of values between ``bounds`` (a depth): the t interval within them; when
    every case sits at one bound, from it to the bound's value moved by the upper bound of the share
    of cases that could be elsewhere, 0 of n (``share_interval``) times the range (a perfect depth of
    4.00 over 42 cases is not known to be exactly 4.00)."""
    low, high = est.bounds or (-math.inf, math.inf)
    if est.se <= 0 and est.value in (low, high):
        share = share_interval(Estimate(0.0, 0.0, est.df, est.n, share=True), level)[1]
        step = share * (high - low)
        return (low, low + step) if est.value == low else (high - step, high)
    lo, hi = t_interval(est, level)
    return max(lo, low), min(hi, high)


def share_interval(est: Estimate, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """Korn-Graubard interval of a share: Clopper-Pearson at the effective number of cases
    ``p (1 - p) / se²`` (the cases themselves at 0% or 100%), scaled by ``(t_{n-1} / t_df)²``."""
    alpha = 1 - _check_level(level)
    p = min(max(est.value, 0.0), 1.0)
    if est.se > 0:
        n_eff = p * (1 - p) / est.se**2
    elif p in (0.0, 1.0):
        n_eff = float(est.n)
    else:
        return p, p
    if est.n > 1 and est.df < est.n - 1:
        n_eff *= (_t_quantile(1 - alpha / 2, est.n - 1) / _t_quantile(1 - alpha / 2, est.df)) ** 2
    x = p * n_eff
    lo = 0.0 if x <= 0 else _beta_quantile(alpha / 2, x, n_eff - x + 1)
    hi = 1.0 if x >= n_eff else _beta_quantile(1 - alpha / 2, x + 1, n_eff - x)
    return lo, hi


# ------------------------------------------------------------------------------------ the design
def design_strata(strata: np.ndarray, min_cases: int = MIN_CELL_CASES) -> np.ndarray:
    """The strata the variance uses: each (lesion, path) cell (``lesion * 3 + path``, as
    ``ColumnMatrix.strata``), except that cells with fewer than ``min_cases`` cases are pooled per path
    (collapsed strata): a cell of a few cases cannot estimate its own variance (two cases that agree
    would claim none)."""
    strata = np.asarray(strata, dtype=np.int64)
    _, index, sizes = np.unique(strata, return_inverse=True, return_counts=True)
    small = sizes[index] < min_cases
    return np.where(small, -1 - strata % len(PATHS), strata)


class _Cells:
    """The strata of a set of cases: each case's cell, the cells' sizes, a cell-by-case indicator."""

    def __init__(self, strata: np.ndarray):
        labels, self.index = np.unique(np.asarray(strata), return_inverse=True)
        self.sizes = np.bincount(self.index, minlength=len(labels))
        self.onehot = (self.index[None, :] == np.arange(len(labels))[:, None]).astype(float)
        self.order = np.argsort(self.index, kind="stable")
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    def variance(self, z: np.ndarray, applies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(variance, degrees of freedom) per column of the linearised values ``z`` (n, K)."""
        sizes = self.sizes[:, None].astype(float)
        multi = self.sizes >= 2
        if z.shape[0] == 0:
            return np.zeros(z.shape[1]), np.ones(z.shape[1], dtype=np.int64)
        mean = (self.onehot @ z) / sizes
        squares = self.onehot @ (z - mean[self.index]) ** 2
        ordered = z[self.order]
        constant = np.maximum.reduceat(ordered, self.starts, axis=0) == np.minimum.reduceat(
            ordered, self.starts, axis=0
        )
        squares = np.where(constant, 0.0, squares)  # exactly 0 where a cell shows no variation
        scale = np.where(multi, self.sizes / np.maximum(self.sizes - 1, 1), 0.0)[:, None]
        lonely = np.where(multi[:, None], 0.0, self.onehot @ z**2)  # one case: against the overall mean
        variance = (squares * scale + lonely).sum(axis=0)
        present = (self.onehot @ applies.astype(float)) > 0
        cases = (sizes * present).sum(axis=0)
        used = (present & multi[:, None]).sum(axis=0) + (present & ~multi[:, None]).any(axis=0)
        return variance, np.maximum(cases - used, 1).astype(np.int64)


def _linearised(weighted: np.ndarray, applies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value (K,), linearised values z (n, K)) of ratio means; value NaN where nothing applies."""
    count = applies.sum(axis=0).astype(float)
    safe = np.where(count > 0, count, 1.0)
    value = np.where(count > 0, weighted.sum(axis=0) / safe, np.nan)
    z = (weighted - applies * np.nan_to_num(value)) / safe
    return value, z


def _with_derived(
    names: Sequence[str], value: np.ndarray, z: np.ndarray, applies: np.ndarray
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Append DERIVED (differences) and ALIASES columns: their values, linearised values, applies."""
    names = list(names)
    col = {name: i for i, name in enumerate(names)}
    extra: list[tuple[str, float, np.ndarray, np.ndarray]] = []
    for name, (a, b) in DERIVED.items():
        if a in col and b in col:
            i, j = col[a], col[b]
            both = applies[:, i] | applies[:, j]
            if np.isnan(value[i]) or np.isnan(value[j]):  # one part is N/A: so is the difference
                both = np.zeros_like(both)
            extra.append((name, value[i] - value[j], z[:, i] - z[:, j], both))
    for name, target in ALIASES.items():
        if target in col:
            i = col[target]
            extra.append((name, value[i], z[:, i], applies[:, i]))
    if not extra:
        return names, value, z, applies
    return (
        names + [e[0] for e in extra],
        np.concatenate([value, [e[1] for e in extra]]),
        np.column_stack([z, *(e[2] for e in extra)]),
        np.column_stack([applies, *(e[3] for e in extra)]),
    )


def _estimates(
    names: Sequence[str],
    value: np.ndarray,
    se: np.ndarray,
    df: np.ndarray,
    applies: np.ndarray,
    *,
    limits: bool = False,
) -> dict[str, Estimate | None]:
    """Estimate objects; ``limits``: the values are paired differences of two models (not shares).
    A difference of two shares (a paired difference, or a DERIVED one such as a gain) lies within ±1
    and gets ``difference_interval``."""
    n = applies.sum(axis=0)
    out: dict[str, Estimate | None] = {}
    for k, name in enumerate(names):
        if n[k] == 0:
            out[name] = None
            continue
        share = is_share(name)
        parts = DERIVED.get(ALIASES.get(name, name))
        derived = parts is not None and all(is_share(p) for p in parts)  # a gain, Table 10's delta
        est = Estimate(float(value[k]), float(se[k]), int(df[k]), int(n[k]), share and not limits)
        if (limits and share) or derived:
            est = replace(est, limit=2.0 if limits and derived else 1.0)
        elif not limits and not share and (bounds := value_range(name)) is not None:
            est = replace(est, bounds=bounds)
        out[name] = est
    return out


def estimate_columns(
    weighted: np.ndarray,
    applies: np.ndarray,
    strata: np.ndarray,
    names: Sequence[str],
    *,
    min_cases: int = MIN_CELL_CASES,
) -> dict[str, Estimate | None]:
    """Every metric of a case x metric matrix with its standard error, DERIVED and ALIASES included.

    weighted: (n, K) per-case values, 0 where the metric does not apply; applies: (n, K) bool;
    strata: (n,) cell of each case (``lesion * 3 + path``); names: the K metric names; min_cases: see
    ``design_strata``. None where a metric applies to no case.
    """
    value, z = _linearised(weighted, applies)
    shares = _gains_of_cases(weighted, applies, names)
    names, value, z, applies = _with_derived(names, value, z, applies)
    variance, df = _Cells(design_strata(strata, min_cases)).variance(z, applies)
    out = _estimates(names, value, np.sqrt(variance), df, applies)
    for name in shares:
        if (est := out.get(name)) is not None:
            out[name] = replace(est, share=True, limit=None)
    return out


def _gains_of_cases(weighted: np.ndarray, applies: np.ndarray, names: Sequence[str]) -> list[str]:
    """DERIVED differences of two shares over the same cases whose every case is 0 or 1 (a gain of
    Oracle-Passed over End-to-End: always so when both come from one oracle run): a share of cases,
    whose interval is then the share's (Korn-Graubard), not the t interval of a rare difference."""
    col = {name: i for i, name in enumerate(names)}
    out = []
    for name, (a, b) in DERIVED.items():
        if a in col and b in col and is_share(a) and is_share(b):
            i, j = col[a], col[b]
            if (applies[:, i] == applies[:, j]).all() and (weighted[:, i] >= weighted[:, j]).all():
                out.append(name)
    return out


def estimates(matrix: ColumnMatrix) -> dict[str, Estimate | None]:
    """``estimate_columns`` of one model's matrix (``ModelScores.matrix``)."""
    return estimate_columns(matrix.weighted, matrix.applies, matrix.strata, matrix.names)


def intervals(matrix: ColumnMatrix, *, level: float = DEFAULT_LEVEL) -> dict[str, tuple[float, float] | None]:
    """The interval of every metric of one model (None where it does not apply)."""
    return {name: (est.interval(level) if est else None) for name, est in estimates(matrix).items()}


@dataclass(frozen=True)
class Paired:
    """One metric of two models on the same cases: each model's estimate and their difference (a - b)."""

    a: Estimate
    b: Estimate
    difference: Estimate


def paired_columns(
    weighted_a: np.ndarray,
    weighted_b: np.ndarray,
    applies: np.ndarray,
    strata: np.ndarray,
    names: Sequence[str],
    *,
    min_cases: int = MIN_CELL_CASES,
) -> dict[str, Paired | None]:
    """Paired estimates of two models on the same cases (rows aligned), DERIVED and ALIASES included.

    weighted_a, weighted_b: (n, K) per-case values of each model; applies: (n, K) where the metric
    applies to both; strata: (n,) cells (``lesion * 3 + path``); names: the K metric names;
    min_cases: see ``design_strata``. None where nothing applies.
    """
    va, za = _linearised(weighted_a * applies, applies)
    vb, zb = _linearised(weighted_b * applies, applies)
    names_a, va, za, joint = _with_derived(names, va, za, applies)
    _, vb, zb, _ = _with_derived(names, vb, zb, applies)
    k = len(names_a)
    cells = _Cells(design_strata(strata, min_cases))
    variance, df = cells.variance(np.column_stack([za, zb, za - zb]), np.tile(joint, 3))
    se = np.sqrt(variance)
    a = _estimates(names_a, va, se[:k], df[:k], joint)
    b = _estimates(names_a, vb, se[k : 2 * k], df[k : 2 * k], joint)
    d = _estimates(names_a, va - vb, se[2 * k :], df[2 * k :], joint, limits=True)
    return {
        name: (Paired(a[name], b[name], d[name]) if d[name] is not None else None)  # type: ignore[arg-type]
        for name in names_a
    }


# ------------------------------------------------------------------------------------ multiplicity
def adjust(p_values: Sequence[float], method: str = "holm") -> list[float]:
    """p-values adjusted for the family they form: ``holm`` (Holm's step-down; family-wise error
    under any dependence), ``bh`` (Benjamini-Hochberg; false discovery rate) or ``none``."""
    p = np.asarray(p_values, dtype=float)
    if method not in ADJUSTMENTS:
        raise ValueError(f"unknown adjustment {method!r}; expected one of {', '.join(ADJUSTMENTS)}")
    if p.size == 0 or method == "none":
        return p.tolist()
    if method == "bh":
        from scipy.stats import false_discovery_control

        return false_discovery_control(p, method="bh").tolist()
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out.tolist()


# ------------------------------------------------------------------------------------ power
def _quantiles(df: float, level: float, power: float, tests: int) -> float:
    POWER.require(power, "power")
    FAMILY.require(tests, "tests")
    if not df > 0:  # inf: the normal quantiles
        raise ValueError(f"df must be above 0, got {df!r}")
    alpha = (1 - _check_level(level)) / tests
    return _t_quantile(1 - alpha / 2, df) + _t_quantile(power, df)


def detectable_difference(
    se: float, df: float, *, level: float = DEFAULT_LEVEL, power: float = DEFAULT_POWER, tests: int = 1
) -> float:
    """Minimum detectable difference: ``(t_{1-alpha/2} + t_{power}) · se`` with ``alpha = (1 -
    level) / tests`` (Bonferroni's level, the first and strictest step of Holm's for ``tests`` tests)."""
    NON_NEGATIVE.require(se, "se")
    return _quantiles(df, level, power, tests) * se


def cases_needed(
    sd: float,
    difference: float,
    *,
    cells: int = 1,
    level: float = DEFAULT_LEVEL,
    power: float = DEFAULT_POWER,
    tests: int = 1,
) -> int:
    """Cases a paired comparison needs to detect ``difference`` with ``power``.

    sd: per-case standard deviation of the paired difference within cells (``se · sqrt(n)`` of a run;
    ``sqrt(discordance)`` for a 0/1 metric under stated assumptions); cells: the cells the cases are
    spread over (degrees of freedom = cases - cells). Raises ValueError for a difference <= 0.
    """
    SHARE.require(difference, "the difference to detect")
    NON_NEGATIVE.require(sd, "sd")
    COUNT.require(cells, "cells")
    if sd == 0:
        return max(cells, 2)
    n = max(math.ceil((_quantiles(math.inf, level, power, tests) * sd / difference) ** 2), cells + 1)
    for _ in range(20):  # t quantiles depend on n through the degrees of freedom
        m = max(
            math.ceil((_quantiles(max(n - cells, 1), level, power, tests) * sd / difference) ** 2), cells + 1
        )
        if m == n:
            break
        n = m
    return n
