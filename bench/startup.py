"""Start-up cost of the command line and the light packages, against eager builder registration.

    python bench/startup.py [--repeats 7]

Each measurement is a fresh ``python -c`` process (wall time, interpreter start-up included; median of
``--repeats``), so the numbers are what a user waits for:

- ``chexpercept --help`` as it is now (the builder is registered when datasets is imported);
- the baseline, in the same run: the same ``--help`` after ``import datasets`` and the registration,
  which is what every command paid before registration became lazy;
- ``import chexpercept.metrics`` and scoring a phantom run (load + score + Table 2), with the modules
  each leaves in ``sys.modules`` (datasets, pyarrow, pandas, torch must stay out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from shared import write_section

HEAVY = ("datasets", "pyarrow", "pandas", "torch", "transformers", "vllm")
REPORT = "import json, sys; print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))"

HELP = (
    "import contextlib, io\n"
    "from chexpercept.cli import main\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    main(['--help'])\n"
)
EAGER = "import datasets\nfrom chexpercept.registration import register\nregister()\n" + HELP
METRICS = "import chexpercept.metrics\n"
SCORE = (
    "import sys\n"
    "from chexpercept.metrics import render_table, score_path\n"
    "render_table(2, {'m': score_path(sys.argv[1])})\n"
)


def measure(code: str, repeats: int, *args: str) -> tuple[float, list[str]]:
    """Median wall seconds of ``python -c code args`` and the heavy modules it imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    full = code + REPORT.format(heavy=HEAVY)
    times, loaded = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", full, *args], capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - start)
        if out.returncode:
            raise SystemExit(f"child failed:\n{out.stderr[-2000:]}")
        loaded = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(times), loaded


def phantom_run(folder: str) -> str:
    """A baseline run on a small phantom bundle (the scorer's input)."""
    from chexpercept.testing import write_fixture_bundle

    bundle = os.path.join(folder, "bundle")
    write_fixture_bundle(bundle, per_cell=4)
    subprocess.run(
        [sys.executable, "-m", "chexpercept.cli", "run", "--data-dir", bundle, "--model", "baseline:prior",
         "--oracle", "none", "--output-dir", os.path.join(folder, "runs"), "--no-progress", "--no-score"],
        check=True, capture_output=True,
    )  # fmt: skip
    return os.path.join(folder, "runs", "baseline-prior")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = phantom_run(tmp)
        rows = [
            ("`chexpercept --help`", *measure(HELP, args.repeats)),
            ("baseline: `--help` after importing datasets and registering", *measure(EAGER, args.repeats)),
            ("`import chexpercept.metrics`", *measure(METRICS, args.repeats)),
            ("score a phantom run (load, score, Table 2)", *measure(SCORE, args.repeats, run_dir)),
        ]
    ratio = rows[1][1] / rows[0][1]
    load = os.getloadavg()[0]
    lines = [
        "## Start-up",
        "",
        "`python bench/startup.py` (bench/startup.py): wall time of a fresh `python -c` process "
        f"(interpreter start-up included), median of {args.repeats}; Python "
        f"{sys.version.split()[0]}; load average {load:.1f} at the end.",
        "",
        "| what | time | heavy modules imported |",
        "| --- | --- | --- |",
        *(f"| {what} | {t:.3f} s | {', '.join(mods) or 'none'} |" for what, t, mods in rows),
        f"| **`--help` speed-up over eager registration** | **{ratio:.1f}x** | |",
        "",
        "Targets: `chexpercept --help` under 0.5 s; `import chexpercept.metrics` without datasets.",
    ]
    print("\n".join(lines))
    write_section("## Start-up", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
