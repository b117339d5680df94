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
from pathlib import Path

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
FRESH = (
    "import sys\nfrom datasets import load_dataset\n"
    "assert load_dataset('chexpercept', data_dir=sys.argv[1], cache_dir=sys.argv[2] + '/c')['train'].num_rows\n"
)
SCORE = (
    "import sys\n"
    "from chexpercept.metrics import render_table, score_path\n"
    "render_table(2, {'m': score_path(sys.argv[1])})\n"
)


def measure(
    code: str, repeats: int, *args: str, env_extra: dict[str, str] | None = None
) -> tuple[float, list[str]]:
    """Median wall seconds of ``python -c code args`` and the heavy modules it imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env_extra or {})}
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


def hook_line_cost(repeats: int = 2000) -> float | None:
    """Seconds to run the start-up hook's .pth line once, in this process (None: not installed)."""
    import site
    import timeit

    found = [
        Path(d) / "chexpercept-startup.pth"
        for d in site.getsitepackages()
        if (Path(d) / "chexpercept-startup.pth").is_file()
    ]
    if not found:
        return None
    line = found[0].read_text(encoding="utf-8")
    hooks_before = list(sys.meta_path)

    def once() -> None:
        exec(line, {})
        sys.meta_path[:] = hooks_before  # the hook installs itself once per run: take it away again

    return min(timeit.repeat(once, number=repeats // 10, repeat=10)) / (repeats // 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = phantom_run(tmp)
        bundle = os.path.join(tmp, "bundle")
        rows = [
            ("`chexpercept --help`", *measure(HELP, args.repeats)),
            ("baseline: `--help` after importing datasets and registering", *measure(EAGER, args.repeats)),
            ("`import chexpercept.metrics`", *measure(METRICS, args.repeats)),
            ("score a phantom run (load, score, Table 2)", *measure(SCORE, args.repeats, run_dir)),
            ("interpreter start-up, `python -c pass`, with the start-up hook", *measure("", args.repeats)),
            (
                "interpreter start-up, hook off (`CHEXPERCEPT_NO_STARTUP_HOOK=1`)",
                *measure("", args.repeats, env_extra={"CHEXPERCEPT_NO_STARTUP_HOOK": "1"}),
            ),
            (
                "`load_dataset('chexpercept', ...)` with nothing imported first",
                *measure(FRESH, args.repeats, bundle, tmp),
            ),
        ]
        hook = hook_line_cost()
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
        "",
        "The start-up hook (`chexpercept-startup.pth`, chexpercept/startup.py) runs in every interpreter of "
        "the environment: its line takes "
        + (f"{hook * 1e6:.0f} µs in process (timeit)" if hook is not None else "nothing (not installed)")
        + "; the two `python -c pass` rows above differ by that plus noise (the environment's other .pth "
        "files, such as the editable install's finder, cost the rest). With it, `load_dataset` works "
        "in a fresh interpreter with nothing imported (the last row; it imports datasets, so it is slow "
        "for that reason alone).",
        "",
        "Before lazy registration (commit 6a165fd), `chexpercept --help` through the console script took "
        "0.95 - 1.04 s here (the issue measured 2.6 - 3.5 s on a busier machine); the baseline row above "
        "reproduces that path in the same run.",
    ]
    print("\n".join(lines))
    write_section("## Start-up", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
