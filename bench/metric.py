# ruff: noqa: E402  (BLAS thread variables must be set before numpy is imported)
"""Benchmark: scoring a full-size run (2,100 cases), its intervals and a paired comparison, on one core.

Targets (issue 4): scoring 2,100 cases < 0.5 s; every metric's interval < 10 s. The intervals are
design-based (metrics/inference.py): one pass over the case x metric matrix. Baselines in the same
run: the stratified bootstrap they replace (1,000 replicates, vectorised: one matrix product per
metric set), re-scoring every replicate from the records (what a naive bootstrap does) and a
per-replicate loop over the metrics with numpy indexing; the last two are timed on a few
replicates and scaled to 1,000. (Whether the intervals are right is bench/intervals.py's question.)

    python bench/metric.py            # print the numbers
    python bench/metric.py --write    # also replace the "## Metrics" section of bench/RESULTS.md

Responses are simulated with realistic variety (bare answers, reasoning paragraphs with stray
numbers, <think> blocks), every one unique so the parser's memo cannot help.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core: set before numpy loads its BLAS

import argparse
import platform
import random
import statistics
import time

import numpy as np
from shared import write_section

from chexpercept.answers import _parse_cached
from chexpercept.metrics import compare, run_from_records, score_model
from chexpercept.metrics.inference import intervals
from chexpercept.metrics.simulate import answer_text, fixture_cases, simulate_records, wrong_indices

SECTION = "## Metrics"


_SENTENCES = (
    "The right costophrenic angle is blunted and the opacity extends into zone {a}.",
    "About 1/3 of the lung is involved, with the upper border near rib {b}.",
    "The overlaid contour at ({x}, {y}) runs outside the lesion boundary.",
    "Option {c} would leave part of the consolidation uncovered.",
    "Compared with the left side, the right lung shows {d} more involved zones.",
)


def _responder(seed: int, p_right: float):
    """Realistic variety: 40% bare answers, 40% a reasoning paragraph, 20% a long <think> block."""
    rnd = random.Random(seed)
    counter = iter(range(10**9))

    def prose(n_sentences: int) -> str:
        return " ".join(
            rnd.choice(_SENTENCES).format(
                a=rnd.randint(1, 6),
                b=rnd.randint(2, 9),
                x=rnd.randint(0, 1023),
                y=rnd.randint(0, 1023),
                c=rnd.randint(1, 4),
                d=rnd.randint(1, 3),
            )
            for _ in range(n_sentences)
        )

    def respond(case, turn):
        picked = list(turn.answer_index) if rnd.random() < p_right else wrong_indices(turn, rnd)
        n = next(counter)
        style = rnd.random()
        if style < 0.4:
            return answer_text(picked) + f"  (ref {n})"
        if style < 0.8:
            return f"Case {n}. {prose(5)}\n\n" + answer_text(picked)
        return f"<think>Case {n}. {prose(30)}</think>\n{prose(2)}\n" + answer_text(picked)

    return respond


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        _parse_cached.cache_clear()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _naive_rescoring_per_replicate(records, strata_of, n_rep: int, seed: int) -> float:
    """Baseline: resample the records per (lesion, path) cell and score them from scratch."""
    rnd = random.Random(seed)
    cells: dict[tuple[str, str], list] = {}
    for r in records:
        cells.setdefault(strata_of(r), []).append(r)
    t0 = time.perf_counter()
    for _ in range(n_rep):
        sample = []
        for members in cells.values():
            for j, r in enumerate(rnd.choices(members, k=len(members))):
                copy = type(r)(**{**r.__dict__, "key_id": f"{r.key_id}#{j}"})
                sample.append(copy)
        _parse_cached.cache_clear()
        score_model([run_from_records(sample, oracle="implicit", greedy=True)])
    return (time.perf_counter() - t0) / n_rep


def _bootstrap(report, n_rep: int, seed: int) -> None:
    """Baseline: the earlier stratified percentile bootstrap, vectorised (weights x matrix)."""
    m = report.matrix
    rng = np.random.default_rng(seed)
    weights = np.zeros((n_rep, len(m.strata)))
    for s in np.unique(m.strata):
        idx = np.flatnonzero(m.strata == s)
        weights[:, idx] = rng.multinomial(len(idx), np.full(len(idx), 1 / len(idx)), size=n_rep)
    cols = m.applies.any(axis=0)  # metrics with no case have no interval
    with np.errstate(invalid="ignore", divide="ignore"):
        reps = (weights @ m.weighted[:, cols]) / (weights @ m.applies[:, cols].astype(float))
    np.nanpercentile(reps, [2.5, 97.5], axis=0)


def _loop_per_replicate(report, n_rep: int, seed: int) -> float:
    """Baseline: per replicate, index the case x metric matrix and average each metric in turn."""
    m = report.matrix
    rng = np.random.default_rng(seed)
    cells = [np.flatnonzero(m.strata == s) for s in np.unique(m.strata)]
    t0 = time.perf_counter()
    for _ in range(n_rep):
        idx = np.concatenate([rng.choice(c, size=len(c)) for c in cells])
        for j in range(len(m.names)):
            applies = m.applies[idx, j]
            if applies.any():
                m.weighted[idx, j][applies].mean()
    return (time.perf_counter() - t0) / n_rep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="update the Metrics section of bench/RESULTS.md")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})

    cases = fixture_cases(per_cell=100, seed=0)
    records = simulate_records(cases, _responder(1, 0.6), oracle="implicit", seed=1)
    other = simulate_records(cases, _responder(2, 0.5), oracle="implicit", seed=2)
    n_turns = sum(len(r.turns) for r in records)
    chars = sum(len(t.response) for r in records for t in r.turns) / n_turns

    def score(mode="reference"):
        return score_model([run_from_records(records, oracle="implicit", greedy=True)], mode=mode)

    t_score = _median_time(score, args.repeat)
    t_score_strict = _median_time(lambda: score("strict"), args.repeat)
    report = score()
    cs = report.scores["implicit"]
    n_metrics = len(report.matrix.names)

    t_intervals = _median_time(lambda: intervals(report.matrix), args.repeat)
    t_boot = _median_time(lambda: _bootstrap(report, 1000, seed=0), args.repeat)
    report_b = score_model([run_from_records(other, oracle="implicit", greedy=True)])
    t_compare = _median_time(lambda: compare(report, report_b), args.repeat)
    t_naive = _naive_rescoring_per_replicate(records, lambda r: (r.lesion, r.path), 3, seed=0)
    t_loop = _loop_per_replicate(report, 50, seed=0)

    rows = [
        ("score 2,100 cases (reference parsing)", f"{t_score:.3f} s", "< 0.5 s", ""),
        ("score 2,100 cases (strict parsing)", f"{t_score_strict:.3f} s", "< 0.5 s", ""),
        ("intervals of every metric (design-based)", f"{t_intervals:.3f} s", "< 10 s", ""),
        (
            "baseline: stratified bootstrap, 1,000 replicates (vectorised)",
            f"{t_boot:.3f} s",
            "",
            f"{t_boot / t_intervals:.1f}x slower",
        ),
        (
            "baseline: re-score every replicate (x1,000, from 3)",
            f"{t_naive * 1000:.0f} s",
            "",
            f"{t_naive * 1000 / t_intervals:.0f}x slower",
        ),
        (
            "baseline: per-replicate loop over metrics (x1,000, from 50)",
            f"{t_loop * 1000:.1f} s",
            "",
            f"{t_loop * 1000 / t_intervals:.0f}x slower",
        ),
        ("paired comparison, every family (tests, intervals, Holm, MDE)", f"{t_compare:.3f} s", "", ""),
    ]
    header = (
        f"{len(cs)} cases, {n_turns} turns ({chars:.0f} characters per response on average, all unique), "
        f"{n_metrics} metrics; one core (BLAS threads 1, CPU affinity 1); "
        f"median of {args.repeat} runs; Python {platform.python_version()}, numpy {np.__version__}, "
        f"{platform.processor() or platform.machine()}; load average {os.getloadavg()[0]:.1f} at the start."
    )
    table = ["| what | time | target | vs design-based intervals |", "| --- | --- | --- | --- |"]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    text = "\n".join([SECTION, "", "`python bench/metric.py` (bench/metric.py).", "", header, "", *table, ""])
    print(text)
    if args.write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
