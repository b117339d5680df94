"""The commands a new user runs first, against the way they worked before (issue 23), in one run.

    python bench/commands.py --bundle DIR        # a 2,100-case phantom release (chexpercept synth --per-cell 100)
    python bench/commands.py                     # synthesizes one first (about 12 minutes on 2 cores)

Every measurement is a fresh process bound to one core (wall time, interpreter start-up and
imports included; median of ``--repeats``):

- ``chexpercept inspect DIR``: now (the bundle reader: chexpercept.json streamed and validated, every
  image checked to exist, nothing decoded) against before (``load_dataset`` of both configs into a
  fresh cache, then the composition counted from the rows, which decodes every image);
- ``chexpercept install-metric``: now (the module cache found without importing evaluate) against
  before (``import evaluate`` for ``init_dynamic_modules()``, then the copy);
- ``chexpercept estimate`` of a local model (the tiny random Gemma 3 of ``make-tiny-model``): now
  (template and image tokens once per shape) against before (every call through the processor on
  the real images) on ``--subset`` cases per (lesion, path) cell, both giving the same numbers
  (checked here); then now on the whole release, all three oracle settings.

Targets: inspect and install-metric under 2 s on the release; the release's local estimate under
60 s on one core.
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

OLD_INSPECT = """
import sys
from collections import Counter
import datasets
import chexpercept
datasets.disable_progress_bars()
ds = datasets.load_dataset("chexpercept", data_dir=sys.argv[1], cache_dir=sys.argv[2])["train"]
items = datasets.load_dataset("chexpercept", "items", data_dir=sys.argv[1], cache_dir=sys.argv[2])["train"]
cells = Counter()
for lesion, path, turns in zip(ds["lesion"], ds["path"], ds["turns"]):
    cells[(lesion, path)] += len(turns)
print(ds.num_rows, items.num_rows, sum(cells.values()))
"""

OLD_INSTALL_METRIC = """
import sys
from evaluate.loading import init_dynamic_modules
from chexpercept.metrics.evaluate_support import install_metric
install_metric(str(__import__("pathlib").Path(init_dynamic_modules()).parent))
"""

ESTIMATE = """
import json, sys
from chexpercept.bundle import read_bundle
from chexpercept.eval.estimate.count import estimate_bounds, sample_calls
from chexpercept.eval.estimate.local_tokens import ProcessorCounter
from chexpercept.eval.runner.selection import select_cases
from chexpercept.results import ORACLE_SETTINGS
root, model, per_cell, strategy = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
bundle = read_bundle(root, check_images="exists")
cases = select_cases(bundle.cases, per_cell=per_cell or None, limit=None)
counter = ProcessorCounter(bundle.root, model, answer_tokens=1000, strategy=strategy)
if strategy != "processor":
    counter.check(sample_calls(cases, ORACLE_SETTINGS))
out = {"cases": len(cases), "strategy": counter.strategy, "estimates": {}}
for oracle in ORACLE_SETTINGS:
    lo, hi = estimate_bounds(cases, oracle, counter, model_id=model, answer_tokens=1000)
    out["estimates"][oracle] = [{k: v for k, v in e.as_dict().items() if k != "counter"} for e in (lo, hi)]
print(json.dumps(out))
"""


def one_core() -> None:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=one_core)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def median(argv: list[str], env: dict[str, str], repeats: int) -> tuple[float, str]:
    runs = [timed(argv, env) for _ in range(repeats)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, help="a phantom release (default: synthesize 2,100 cases)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--subset", type=int, default=2, help="cases per cell for the old-vs-new estimate")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "HF_EVALUATE_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        cli = [sys.executable, "-m", "chexpercept.cli"]
        bundle = args.bundle
        if bundle is None:
            bundle = tmp / "release"
            subprocess.run([*cli, "synth", "--output-dir", str(bundle), "--per-cell", "100", "--num-proc",
                            str(len(os.sched_getaffinity(0))), "--no-progress"], check=True, env=env)  # fmt: skip
        model = tmp / "tiny-vlm"
        subprocess.run([*cli, "make-tiny-model", "--output-dir", str(model)], check=True, env=env,
                       capture_output=True)  # fmt: skip
        load = os.getloadavg()
        rows = []

        new_inspect, out = median([*cli, "inspect", str(bundle)], env, args.repeats)
        cases = out.split(" gives ")[1].split(" cases")[0]
        old_runs = [timed([sys.executable, "-c", OLD_INSPECT, str(bundle), str(tmp / f"c{i}")], env)
                    for i in range(args.repeats)]  # fmt: skip
        old_inspect = statistics.median(t for t, _ in old_runs)
        old_counts = old_runs[-1][1].split()
        assert old_counts[0] == cases, (old_counts, cases)
        rows.append(("`chexpercept inspect` (release)", old_inspect, new_inspect, "< 2 s"))

        new_metric, _ = median([*cli, "install-metric"], env, args.repeats)
        old_metric, _ = median([sys.executable, "-c", OLD_INSTALL_METRIC], env, args.repeats)
        rows.append(("`chexpercept install-metric`", old_metric, new_metric, "< 2 s"))

        est = [sys.executable, "-c", ESTIMATE, str(bundle), str(model), str(args.subset)]
        old_est, old_out = timed([*est, "processor"], env)
        new_est, new_out = median([*est, "pieces"], env, args.repeats)
        old_data, new_data = json.loads(old_out), json.loads(new_out)
        same = old_data["estimates"] == new_data["estimates"]
        subset = old_data["cases"]
        rows.append(
            (f"local-model estimate, {subset} cases, 3 oracle settings", old_est, new_est, "same numbers")
        )
        full_est, full_out = median([*est[:-1], "0", "pieces"], env, 1)
        full = json.loads(full_out)

    lines = [
        "## First commands (bench/commands.py)",
        "",
        f"A phantom release made with `chexpercept synth --per-cell 100` ({cases} cases); the tiny random "
        f"Gemma 3 of `make-tiny-model`. Each command a fresh process bound to one core (wall time, start-up "
        f"and imports included; median of {args.repeats}). Load average at the start "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on 2 cores shared with other engineers' jobs.",
        "",
        "| command | before | now | speed-up | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, old, new, target in rows:
        lines.append(f"| {name} | {old:.2f} s | {new:.2f} s | {old / new:.0f}x | {target} |")
    lines.append(
        f"| local-model estimate, the release ({full['cases']:,} cases), 3 oracle settings | "
        f"(about {old_est / subset * full['cases'] / 60:.0f} min, extrapolated) | {full_est:.1f} s | | < 60 s |"
    )
    lines += [
        "",
        f"Before and now give the same estimate on the {subset} cases: {'yes' if same else 'NO'} (all three "
        f"oracle settings, both scenarios, every field); the fast count used: {new_data['strategy']} "
        "(template and image tokens once per image size, text once per piece, checked against the processor "
        "on sample calls first).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    write_section("## First commands (bench/commands.py)", text)


if __name__ == "__main__":
    main()
