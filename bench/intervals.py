# ruff: noqa: E402  (BLAS thread variables must be set before numpy is imported)
"""Simulation: do the intervals cover and do the tests hold their level? (metrics/inference.py)

Cases are drawn cell by cell as the release draws them (7 lesions x 3 paths, ``--per-cell`` cases
each; stages asked as in the release: LF Stage 1, RF 1-2-4, RR 1-4, cardiomegaly without Stage 4).
Each case has a difficulty ``u ~ N(0, 1)`` shared by both models and all its stages; a model passes
stage k of a case with probability ``Phi(alpha[model, cell, k] - u)``, independently given ``u``. So
the stages of a case and the two models are correlated, as real models are. ``alpha`` is set so
that the stage accuracies look like the paper's (Stage 1 about 85%, Stage 2 50%, Stage 3 about 4%,
Stage 4 20%), with a fixed random lesion effect per cell. The true value of every metric is known
exactly (Gauss-Hermite quadrature over ``u``), so coverage and error rates are measured against the
truth, not against another estimate.

Scenarios: the null (model B has model A's parameters: every true difference is 0) and an effect
(model B 0.25 lower on the probit scale at every stage: known true differences of 3 to 9 points).
Measured over ``--reps`` replicates per design: coverage of the 95% intervals of model A's metrics and
of the paired differences, the rejection rate of each test at the null (false-positive rate) and of
Holm-adjusted Table 2 at the null (family-wise error), and the power the MDE formula predicts
against the power observed. The method before this one is run on the same replicates: the
stratified percentile bootstrap (cases resampled within cells) and the paired permutation test.

    python bench/intervals.py            # print the numbers
    python bench/intervals.py --write    # also replace the "## Statistics" section of bench/RESULTS.md
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import time
from dataclasses import dataclass

import numpy as np
from scipy import stats
from shared import write_section

from chexpercept.metrics.inference import MIN_CELL_CASES, adjust, estimate_columns, paired_columns
from chexpercept.vocab import CARDIOMEGALY, LESIONS, PATHS, route_stages

SECTION = "## Statistics"
LEVEL = 0.95
TARGETS = (0.85, 0.50, 0.04, 0.20)  # stage accuracies on the probit scale's marginal
SHIFT = 0.25  # model B's probit offset in the effect scenario
TABLE2 = (
    "e2e/stage1/all",
    "e2e/stage2/all",
    "e2e/stage3/all",
    "e2e/stage4/all",
    "op/stage2/all",
    "op/stage3/all",
    "op/stage4/all",
    "depth/RR",
    "depth/RF",
    "depth/LF",
)
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


@dataclass(frozen=True)
class Design:
    per_cell: int
    cells: list[tuple[str, str, tuple[int, ...]]]  # (lesion, path, stages asked)
    lesion: np.ndarray  # (n,) lesion name index
    path: np.ndarray  # (n,) path index
    strata: np.ndarray  # (n,) lesion * 3 + path
    asked: np.ndarray  # (n, 4) bool

    @property
    def n(self) -> int:
        return len(self.strata)


def make_design(per_cell: int) -> Design:
    cells, lesion, path, asked = [], [], [], []
    for li, name in enumerate(LESIONS):
        for pi, p in enumerate(PATHS):
            stages = route_stages(name, p)
            cells.append((name, p.value, stages))
            for _ in range(per_cell):
                lesion.append(li)
                path.append(pi)
                asked.append([k in stages for k in (1, 2, 3, 4)])
    lesion_a, path_a = np.array(lesion), np.array(path)
    return Design(per_cell, cells, lesion_a, path_a, lesion_a * len(PATHS) + path_a, np.array(asked))


def parameters(rng: np.random.Generator) -> np.ndarray:
    """alpha (21 cells, 4 stages) of model A on the probit scale (difficulty has variance 1)."""
    base = stats.norm.ppf(TARGETS) * np.sqrt(2.0)  # marginal of Phi(a - u), u ~ N(0,1), is Phi(a/sqrt2)
    return base[None, :] + rng.normal(0, 0.3, size=(len(LESIONS) * len(PATHS), 4))


def _columns(design: Design, passed: np.ndarray) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The metrics of Table 2 and Table 8 from per-case stage passes (n, 4): (names, weighted, applies)."""
    gated = np.cumprod(np.where(design.asked, passed, True), axis=1) & design.asked
    names, values, applies = [], [], []
    paths = {p.value: design.path == i for i, p in enumerate(PATHS)} | {"all": np.ones(design.n, bool)}
    for setting, table in (("e2e", gated), ("op", passed & design.asked)):
        for k in (1, 2, 3, 4):
            if setting == "op" and k == 1:
                continue
            for p, mask in paths.items():
                names.append(f"{setting}/stage{k}/{p}")
                values.append(table[:, k - 1].astype(float))
                applies.append(design.asked[:, k - 1] & mask)
    depth = gated.sum(axis=1).astype(float)
    last = np.where(design.asked[:, 2], 2, 1)  # cardiomegaly: RR asks 1-3, RF 1-2
    cardio = (design.lesion == LESIONS.index(CARDIOMEGALY)) & (design.path != 2)
    depth += cardio & gated[np.arange(design.n), last]
    for i, p in enumerate(PATHS):
        names.append(f"depth/{p.value}")
        values.append(depth)
        applies.append(design.path == i)
    keep = [i for i, a in enumerate(applies) if a.any()]
    applies_a = np.column_stack([applies[i] for i in keep])
    return [names[i] for i in keep], np.column_stack([values[i] for i in keep]) * applies_a, applies_a


def truth(design: Design, alpha: np.ndarray) -> dict[str, float]:
    """Every metric's true value: per cell by quadrature over the difficulty, then the cells' mean."""
    per_cell_e2e, per_cell_op, per_cell_depth = [], [], []
    for h, (name, p, stages) in enumerate(design.cells):
        probs = stats.norm.cdf(alpha[h][:, None] - _NODES[None, :])  # (4, nodes)
        e2e, op, chain = np.zeros(4), np.zeros(4), np.ones_like(_NODES)
        for k in (1, 2, 3, 4):
            if k in stages:
                chain = chain * probs[k - 1]
                e2e[k - 1] = chain @ _WEIGHTS
                op[k - 1] = probs[k - 1] @ _WEIGHTS
        depth = e2e.sum() + (e2e[max(stages) - 1] if name == CARDIOMEGALY and p != "LF" else 0.0)
        per_cell_e2e.append(e2e)
        per_cell_op.append(op)
        per_cell_depth.append(depth)
    out: dict[str, float] = {}
    for setting, table in (("e2e", per_cell_e2e), ("op", per_cell_op)):
        for k in (1, 2, 3, 4):
            for p in (*(q.value for q in PATHS), "all"):
                hs = [h for h, (_, q, st) in enumerate(design.cells) if k in st and p in (q, "all")]
                if hs:
                    out[f"{setting}/stage{k}/{p}"] = float(np.mean([table[h][k - 1] for h in hs]))
    for q in PATHS:
        hs = [h for h, (_, p, _) in enumerate(design.cells) if p == q.value]
        out[f"depth/{q.value}"] = float(np.mean([per_cell_depth[h] for h in hs]))
    for k in (2, 3, 4):
        out[f"gain/stage{k}"] = out[f"op/stage{k}/all"] - out[f"e2e/stage{k}/all"]
    return out


def draw(design: Design, alpha: np.ndarray, u: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    prob = stats.norm.cdf(alpha[design.strata] - u[:, None])
    return rng.random(prob.shape) < prob


# ------------------------------------------------------------------------------------ the old method
def _boot_weights(strata: np.ndarray, reps: int, rng: np.random.Generator) -> np.ndarray:
    w = np.zeros((reps, len(strata)))
    for s in np.unique(strata):
        idx = np.flatnonzero(strata == s)
        w[:, idx] = rng.multinomial(len(idx), np.full(len(idx), 1 / len(idx)), size=reps)
    return w


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den


def old_method(design, wa, wb, applies, reps, rng):
    """Stratified percentile bootstrap intervals (A; A - B) and paired permutation p-values."""
    w = _boot_weights(design.strata, reps, rng)
    den = w @ applies
    boot_a, boot_b = _ratio(w @ wa, den), _ratio(w @ wb, den)
    tail = (1 - LEVEL) / 2 * 100
    ci_a = np.nanpercentile(boot_a, [tail, 100 - tail], axis=0)
    ci_d = np.nanpercentile(boot_a - boot_b, [tail, 100 - tail], axis=0)
    n = applies.sum(axis=0)
    diff = (wa - wb).sum(axis=0) / n
    flips = rng.integers(0, 2, size=(reps, design.n)).astype(float)
    perm = diff[None, :] - 2 * (flips @ (wa - wb)) / n  # swap the two results on the flipped cases
    p = (1 + (np.abs(perm) >= np.abs(diff) - 1e-12).sum(axis=0)) / (reps + 1)
    return ci_a, ci_d, p


# ------------------------------------------------------------------------------------ the run
def run_design(per_cell: int, reps: int, boot: int, seed: int, min_cases: int | None = None) -> dict:
    rng = np.random.default_rng(seed)
    design = make_design(per_cell)
    alpha_a = parameters(np.random.default_rng(1234))
    kw = {} if min_cases is None else {"min_cases": min_cases}
    out: dict = {"per_cell": per_cell, "n": design.n}
    for scenario, alpha_b in (("null", alpha_a), ("effect", alpha_a - SHIFT)):
        true_a, true_b = truth(design, alpha_a), truth(design, alpha_b)
        cover_a: dict[str, list[bool]] = {}
        cover_d: dict[str, list[bool]] = {}
        reject: dict[str, list[bool]] = {}
        predicted: dict[str, list[float]] = {}
        old_a: dict[str, list[bool]] = {}
        old_d: dict[str, list[bool]] = {}
        old_reject: dict[str, list[bool]] = {}
        family_error: list[bool] = []
        for r in range(reps):
            u = rng.normal(size=design.n)
            names, wa, applies = _columns(design, draw(design, alpha_a, u, rng))
            _, wb, _ = _columns(design, draw(design, alpha_b, u, rng))
            single = estimate_columns(wa, applies, design.strata, names, **kw)
            paired = paired_columns(wa, wb, applies, design.strata, names, **kw)
            p_table2 = []
            for name, est in single.items():
                if est is None or name not in true_a:
                    continue
                lo, hi = est.interval(LEVEL)
                cover_a.setdefault(name, []).append(lo <= true_a[name] <= hi)
                d = paired[name].difference
                lo, hi = d.interval(LEVEL)
                delta = true_a[name] - true_b[name]
                cover_d.setdefault(name, []).append(lo <= delta <= hi)
                p = d.p_value()
                reject.setdefault(name, []).append(p < 1 - LEVEL)
                if d.se > 0:  # the power this SE predicts for the true difference
                    shift = abs(delta) / d.se
                    crit = stats.t.ppf(1 - (1 - LEVEL) / 2, d.df)
                    predicted.setdefault(name, []).append(
                        float(stats.t.sf(crit - shift, d.df) + stats.t.cdf(-crit - shift, d.df))
                    )
                if name in TABLE2:
                    p_table2.append(p)
            family_error.append(min(adjust(p_table2, "holm")) < 1 - LEVEL)
            if boot and r < reps:
                col = {n: i for i, n in enumerate(names)}
                ci_a, ci_d, p_perm = old_method(design, wa, wb, applies.astype(float), boot, rng)
                for name in (n for n in cover_a if n in col):
                    i = col[name]
                    delta = true_a[name] - true_b[name]
                    old_a.setdefault(name, []).append(ci_a[0, i] <= true_a[name] <= ci_a[1, i])
                    old_d.setdefault(name, []).append(ci_d[0, i] <= delta <= ci_d[1, i])
                    old_reject.setdefault(name, []).append(p_perm[i] < 1 - LEVEL)
        out[scenario] = {
            "cover_a": {k: float(np.mean(v)) for k, v in cover_a.items()},
            "cover_d": {k: float(np.mean(v)) for k, v in cover_d.items()},
            "reject": {k: float(np.mean(v)) for k, v in reject.items()},
            "predicted_power": {k: float(np.mean(v)) for k, v in predicted.items()},
            "family_error": float(np.mean(family_error)),
            "old_cover_a": {k: float(np.mean(v)) for k, v in old_a.items()},
            "old_cover_d": {k: float(np.mean(v)) for k, v in old_d.items()},
            "old_reject": {k: float(np.mean(v)) for k, v in old_reject.items()},
            "delta": {k: true_a[k] - true_b[k] for k in cover_a},
            "true_a": {k: true_a[k] for k in cover_a},
        }
    return out


def _summary(values: dict[str, float]) -> str:
    if not values:
        return "–"
    v = np.array(list(values.values()))
    return f"{v.mean():.3f} [{v.min():.3f}, {v.max():.3f}]"


def report(results: list[dict], reps: int, boot: int, seconds: float) -> str:
    lines = [
        SECTION,
        "",
        "`python bench/intervals.py` (bench/intervals.py): intervals and tests of metrics/inference.py "
        "against simulated runs whose true values are known exactly (setup in the script's docstring: "
        "7 x 3 cells as the release, a case difficulty shared by the stages and the two models, stage "
        "accuracies near 85 / 50 / 4 / 20%). "
        f"{reps} replicates per design and scenario; the earlier method (stratified percentile "
        f"bootstrap, {boot} resamples; paired permutation test, {boot} permutations) on the same "
        f"replicates. Level 95%. Over the {len(results[0]['null']['cover_a'])} metrics of Tables 2 and 8 "
        "(shown: mean [min, max] over metrics); Monte Carlo error of one coverage about "
        f"±{1.96 * np.sqrt(0.95 * 0.05 / reps):.3f}. {seconds:.0f} s on one core.",
        "",
        "| cases per cell (cases) | strata | coverage of A's intervals | coverage of A - B (effect) | "
        "false positives per test (null) | Holm family-wise error, Table 2 (null) | earlier: bootstrap "
        "coverage of A - B (effect) | earlier: permutation false positives (null) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for res in results:
        if res["per_cell"] >= res["min_cases"]:
            strata = "cells" if res["min_cases"] == MIN_CELL_CASES else "cells (not pooled)"
        else:
            strata = "paths (cells pooled)"
        lines.append(
            f"| {res['per_cell']} ({res['n']:,}) | {strata} | {_summary(res['effect']['cover_a'])} | "
            f"{_summary(res['effect']['cover_d'])} | {_summary(res['null']['reject'])} | "
            f"{res['null']['family_error']:.3f} | {_summary(res['effect']['old_cover_d'])} | "
            f"{_summary(res['null']['old_reject'])} |"
        )
    lines += [
        "",
        "Power: the power each replicate's standard error predicts for the true difference "
        "(mean over replicates) against the share of replicates that rejected (effect scenario), "
        "for Table 2's stage accuracies:",
        "",
    ]
    lines += [
        "| cases per cell | metric | true A | true A - B | predicted power | observed power |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for res in (r for r in results if r["min_cases"] == MIN_CELL_CASES):
        eff = res["effect"]
        for name in TABLE2[:7]:
            if name in eff["predicted_power"]:
                lines.append(
                    f"| {res['per_cell']} | {name} | {eff['true_a'][name]:.3f} | {eff['delta'][name]:+.3f} | "
                    f"{eff['predicted_power'][name]:.3f} | {eff['reject'][name]:.3f} |"
                )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-cell", type=int, nargs="+", default=[100, 10, 5, 2])
    parser.add_argument("--reps", type=int, default=1000)
    parser.add_argument(
        "--boot", type=int, default=400, help="bootstrap resamples / permutations (earlier method)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    results = []
    for m in args.per_cell:
        # small cells are pooled per path; the same replicates without pooling show why
        for min_cases in (None, 1) if m < MIN_CELL_CASES else (None,):
            res = run_design(m, args.reps, args.boot, args.seed + m, min_cases)
            res["min_cases"] = MIN_CELL_CASES if min_cases is None else min_cases
            results.append(res)
            print(f"per cell {m}: done after {time.perf_counter() - start:.0f} s", flush=True)
    for res in results:  # the metrics furthest from the nominal level, for the record
        for key in ("cover_a", "cover_d", "old_cover_d"):
            worst = sorted(res["effect"][key].items(), key=lambda kv: kv[1])[:3]
            print(res["per_cell"], key, ", ".join(f"{k} {v:.3f}" for k, v in worst))
        worst = sorted(res["null"]["reject"].items(), key=lambda kv: -kv[1])[:3]
        print(res["per_cell"], "reject", ", ".join(f"{k} {v:.3f}" for k, v in worst))
    text = report(results, args.reps, args.boot, time.perf_counter() - start)
    print(text)
    if args.write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
