"""Confidence intervals and paired model comparison, vectorised over the case x metric matrix.

Bootstrap: cases are resampled with replacement within each (lesion, path) cell, so every replicate
keeps the benchmark's composition. A replicate is a row of per-case multiplicities ``W`` (drawn per
cell from a multinomial); every metric of every replicate is then ``(W @ values) / (W @ applies)``,
one matrix product for all metrics at once. Intervals are percentile intervals.

Paired comparison of two models on the same cases: the difference of each metric over the cases
both models answered, a paired bootstrap interval (the same resampled cases for both models) and a
two-sided p-value from a paired permutation test (each case's two results swapped at random).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .columns import ALIASES, DERIVED, FLAT_KEYS, ColumnMatrix

if TYPE_CHECKING:  # annotations only: model_scores imports this module
    from .model_scores import ModelScores


def stratified_weights(strata: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, n) multiplicities: each stratum's cases resampled with replacement."""
    n = len(strata)
    weights = np.zeros((n_resamples, n))
    for s in np.unique(strata):
        idx = np.flatnonzero(strata == s)
        m = len(idx)
        weights[:, idx] = rng.multinomial(m, np.full(m, 1.0 / m), size=n_resamples)
    return weights


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def replicates(matrix: ColumnMatrix, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric (base, derived and aliases) under each resample: name -> (n_resamples,)."""
    num = weights @ matrix.weighted
    den = weights @ matrix.applies.astype(float)
    reps = _ratio(num, den)
    out = {name: reps[:, i] for i, name in enumerate(matrix.names)}
    return _with_derived(out)


def _with_derived(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    for name, (a, b) in DERIVED.items():
        if a in values and b in values:
            values[name] = values[a] - values[b]
    for name, target in ALIASES.items():
        if target in values:
            values[name] = values[target]
    return values


def _interval(samples: np.ndarray, level: float) -> tuple[float, float] | None:
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return None
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_intervals(
    report: ModelScores, *, n_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> dict[str, tuple[float, float] | None]:
    """Percentile intervals of every metric of the report (None where the metric is N/A)."""
    rng = np.random.default_rng(seed)
    weights = stratified_weights(report.matrix.strata, n_resamples, rng)
    reps = replicates(report.matrix, weights)
    return {
        name: (_interval(samples, level) if report.values.get(name) is not None else None)
        for name, samples in reps.items()
    }


def _aligned(report: ModelScores, keys: list[str], names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    row = {k: i for i, k in enumerate(report.matrix.key_ids)}
    rows = np.array([row[k] for k in keys], dtype=np.int64)
    col = report.matrix.index()
    cols = np.array([col[n] for n in names], dtype=np.int64)
    weighted = report.matrix.weighted[np.ix_(rows, cols)]
    applies = report.matrix.applies[np.ix_(rows, cols)]
    return weighted, applies


def compare_reports(
    a: ModelScores,
    b: ModelScores,
    *,
    keys: Sequence[str] | None = None,
    n_resamples: int = 1000,
    n_permutations: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, dict[str, Any]]:
    """Paired comparison of two models on the cases both were scored on.

    Returns, per metric (default: the flat keys plus gains), ``a`` and ``b`` (on the common cases),
    ``difference`` (a - b), ``interval`` (paired stratified bootstrap), ``p_value`` (two-sided paired
    permutation test) and ``n`` (cases the metric applies to in both). None where N/A.
    """
    if a.fingerprint and b.fingerprint and a.fingerprint != b.fingerprint:
        raise ValueError(
            f"{a.name} and {b.name} were run on different bundles; a paired comparison needs the same cases"
        )
    common = sorted(set(a.matrix.key_ids) & set(b.matrix.key_ids))
    if not common:
        raise ValueError(f"{a.name} and {b.name} share no cases")
    names = [n for n in a.matrix.names if n in set(b.matrix.names)]
    wa, aa = _aligned(a, common, names)
    wb, ab = _aligned(b, common, names)
    row_a = {k: i for i, k in enumerate(a.matrix.key_ids)}
    row_b = {k: i for i, k in enumerate(b.matrix.key_ids)}
    strata_a = a.matrix.strata[[row_a[k] for k in common]]
    strata_b = b.matrix.strata[[row_b[k] for k in common]]
    if (strata_a != strata_b).any():
        key = common[int(np.argmax(strata_a != strata_b))]
        raise ValueError(f"case {key}: lesion or path differs between {a.name} and {b.name}")
    joint = (aa & ab).astype(float)
    va, vb = wa * joint, wb * joint
    n_joint = joint.sum(axis=0)

    def means(w: np.ndarray | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        if w is None:
            ma, mb = _ratio(va.sum(0)[None], n_joint[None]), _ratio(vb.sum(0)[None], n_joint[None])
        else:
            den = w @ joint
            ma, mb = _ratio(w @ va, den), _ratio(w @ vb, den)
        return (
            _with_derived({n: ma[:, i] for i, n in enumerate(names)}),
            _with_derived({n: mb[:, i] for i, n in enumerate(names)}),
        )

    obs_a, obs_b = means(None)
    rng = np.random.default_rng(seed)
    boot_a, boot_b = means(stratified_weights(strata_a, n_resamples, rng))
    # permutation: swap the two models' results on a random half of the cases
    flips = rng.integers(0, 2, size=(n_permutations, len(common))).astype(float)
    shift = _ratio(flips @ (vb - va), n_joint[None])
    perm_a = _with_derived({n: obs_a[n][0] + shift[:, i] for i, n in enumerate(names)})
    perm_b = _with_derived({n: obs_b[n][0] - shift[:, i] for i, n in enumerate(names)})

    wanted = list(keys) if keys is not None else [*FLAT_KEYS, *(k for k in DERIVED if k.startswith("gain/"))]
    col = {n: i for i, n in enumerate(names)}
    out: dict[str, dict[str, Any]] = {}
    for key in wanted:
        if key not in obs_a:
            raise KeyError(f"unknown metric {key!r}")
        va_obs, vb_obs = float(obs_a[key][0]), float(obs_b[key][0])
        if not (np.isfinite(va_obs) and np.isfinite(vb_obs)):
            out[key] = {"a": None, "b": None, "difference": None, "interval": None, "p_value": None, "n": 0}
            continue
        diff = va_obs - vb_obs
        perm = perm_a[key] - perm_b[key]
        perm = perm[np.isfinite(perm)]
        p = float((1 + np.sum(np.abs(perm) >= abs(diff) - 1e-12)) / (len(perm) + 1))
        ci = _interval(boot_a[key] - boot_b[key], level)
        base = key if key in col else DERIVED.get(key, (ALIASES.get(key, key),))[0]
        out[key] = {
            "a": va_obs,
            "b": vb_obs,
            "difference": diff,
            "interval": list(ci) if ci else None,
            "p_value": min(p, 1.0),
            "n": int(n_joint[col[base]]) if base in col else None,
        }
    return out
