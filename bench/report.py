"""Benchmark: ``chexpercept report`` for 3 simulated models over a 2,100-case phantom bundle.

Target (issue 6): the whole report (scores, 95% bootstrap intervals, six tables, leaderboard, CSVs,
figures, the HTML case viewer) in seconds, not minutes. Each measurement runs in a fresh subprocess
so that wall time (imports included) and peak RSS are those of one command. Measured in the same run
as a floor: reading the three runs' results.jsonl files and nothing else, which any report must do.

The bundle has the release's format and 1024x1024 radiograph-like PNGs hard-linked from a pool of 16
(quick to write; the report never decodes an image, it links to them).

    python bench/report.py                    # 2,100 cases, 3 models, 1,000 bootstrap replicates
    python bench/report.py --per-cell 10      # a quick look
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

from shared import PEAK, run_child

REPORT = PEAK + textwrap.dedent(
    """
    import json, sys, time
    t0 = time.perf_counter()
    from chexpercept.metrics.report.build import write_report
    out = write_report(sys.argv[1], sys.argv[2], n_resamples=int(sys.argv[3]), embed_images=sys.argv[4] == "1")
    print(json.dumps({"seconds": time.perf_counter() - t0, "inside": out.seconds, "timings": out.timings,
                      "cases": out.cases, "files": len(out.files), "peak_rss_mib": peak_mib()}))
    """
)

FLOOR = PEAK + textwrap.dedent(
    """
    import json, pathlib, sys, time
    t0 = time.perf_counter()
    from chexpercept.results import iter_results
    n = sum(1 for p in sorted(pathlib.Path(sys.argv[1]).rglob("results.jsonl")) for _ in iter_results(p))
    print(json.dumps({"seconds": time.perf_counter() - t0, "records": n, "peak_rss_mib": peak_mib()}))
    """
)


def _size_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--per-cell", type=int, default=100, help="cases per (lesion, path) cell (default 100)"
    )
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates (default 1000)")
    parser.add_argument(
        "--workdir", help="keep the bundle, runs and report here (default: a temporary folder)"
    )
    args = parser.parse_args()

    from chexpercept.bundle import read_bundle
    from chexpercept.metrics.report.simulate import write_simulated_runs
    from chexpercept.testing import write_fixture_bundle

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-report-"))
    t0 = time.perf_counter()
    bundle = read_bundle(
        write_fixture_bundle(
            work / "bundle", per_cell=args.per_cell, image_size=1024, image_style="smooth", image_pool=16
        ),
        check_images="none",
    )
    t1 = time.perf_counter()
    write_simulated_runs(bundle, work / "runs")
    t2 = time.perf_counter()
    print(f"bundle: {len(bundle.cases)} cases in {t1 - t0:.1f} s; 3 simulated runs in {t2 - t1:.1f} s")

    floor = run_child(FLOOR, str(work / "runs"))
    report = run_child(REPORT, str(work / "runs"), str(work / "report"), str(args.bootstrap), "0")
    no_ci = run_child(REPORT, str(work / "runs"), str(work / "report_no_ci"), "0", "0")
    embedded = run_child(REPORT, str(work / "runs"), str(work / "report_embedded"), "0", "1")

    phases = ", ".join(f"{k} {v:.2f}" for k, v in report["timings"].items())
    lines = [
        f"- Report of 3 models x {report['cases']} cases, {args.bootstrap} bootstrap replicates: "
        f"**{report['wall']:.1f} s** wall in a fresh process (imports included; {report['inside']:.1f} s "
        f"inside write_report; peak RSS {report['peak_rss_mib']:.0f} MiB; {report['files']} files listed, "
        f"{_size_mib(work / 'report'):.1f} MiB on disk).",
        f"- Phases (s): {phases}.",
        f"- Without intervals (--bootstrap 0): {no_ci['wall']:.1f} s. With --embed-images (hard links): "
        f"{embedded['wall']:.1f} s.",
        f"- Floor, same run: reading the 3 results.jsonl ({floor['records']} records) takes {floor['wall']:.1f} s "
        f"wall ({floor['seconds']:.2f} s after start); the report costs {report['wall'] / floor['wall']:.1f}x that.",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
