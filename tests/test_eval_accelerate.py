"""accelerate launch with 2 CPU processes gives the same results file as one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

from chexpercept.cli import main as cli
from chexpercept.eval.run import main

RUN_SCRIPT = Path(__file__).resolve().parents[1] / "eval" / "run.py"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
LAUNCH += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def launch_two(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([*LAUNCH, str(RUN_SCRIPT), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_two_processes_equal_one_process(fixture_bundle, tmp_path):
    common = ["--data-dir", str(fixture_bundle), "--model", "baseline:random", "--batch-size", "3"]
    assert main([*common, "--output-dir", str(tmp_path / "one"), "--no-progress"]) == 0
    proc = launch_two(*common, "--output-dir", str(tmp_path / "two"))
    one = tmp_path / "one" / "baseline-random" / "oracle_implicit"
    two = tmp_path / "two" / "baseline-random" / "oracle_implicit"
    assert (two / "results.jsonl").read_bytes() == (one / "results.jsonl").read_bytes()
    info = json.loads((two / "run.json").read_text())
    assert info["num_processes"] == 2 and info["finished"] and info["n_results"] == 21
    assert not (two / "run.lock").exists()
    # one progress bar, on the main process, counting the cases of both processes
    assert "21/21" in proc.stderr and "10/10" not in proc.stderr and "11/11" not in proc.stderr
    assert proc.stdout.count("21 cases of baseline-random") == 1


@pytest.mark.slow
def test_two_processes_with_the_tiny_model(fixture_bundle, tmp_path):
    model = tmp_path / "tiny-vlm"
    assert cli(["make-tiny-model", "--output-dir", str(model)]) == 0
    common = ["--data-dir", str(fixture_bundle), "--model", str(model), "--backend", "transformers"]
    common += ["--lesions", "edema", "--max-tokens", "3", "--oracle", "explicit"]
    assert main([*common, "--output-dir", str(tmp_path / "one"), "--no-progress"]) == 0
    launch_two(*common, "--output-dir", str(tmp_path / "two"), "--no-progress")
    one = tmp_path / "one" / "tiny-vlm" / "oracle_explicit" / "results.jsonl"
    two = tmp_path / "two" / "tiny-vlm" / "oracle_explicit" / "results.jsonl"
    assert two.read_bytes() == one.read_bytes()


def test_a_launch_that_runs_fewer_processes_than_asked_is_named():
    from chexpercept.eval.distributed import launch_mismatch

    simple = {"ACCELERATE_MIXED_PRECISION": "no", "MASTER_PORT": "29500"}
    asked_two = ["python", "accelerate", "launch", "--num_processes", "2", "eval/run.py"]
    warning = launch_mismatch(simple, asked_two, {})
    assert "asked for 2 processes but started one" in warning
    assert "accelerate launch --multi_gpu --num_processes N eval/run.py" in warning
    assert "num_processes: 1" in warning
    # the same number from accelerate's config: the launcher set MASTER_PORT, the user did not
    assert "asked for several processes" in launch_mismatch(simple, ["accelerate", "launch", "x.py"], {})
    # what was asked was given, or nothing was asked, or this is no accelerate launch
    assert launch_mismatch({**simple, "WORLD_SIZE": "2"}, asked_two, {}) is None
    assert launch_mismatch({"ACCELERATE_MIXED_PRECISION": "no"}, ["accelerate", "launch", "x.py"], {}) is None
    assert launch_mismatch(simple, ["accelerate", "launch", "x.py"], {"MASTER_PORT": "29500"}) is None
    assert launch_mismatch({"MASTER_PORT": "1"}, asked_two, {}) is None


@pytest.mark.slow
def test_accelerate_launch_num_processes_2_on_a_cpu_warns_at_run_time(fixture_bundle, tmp_path):
    """The README's first launch form on a CPU runs one process: said at run time, and run.json agrees."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"]
    args = ["--data-dir", str(fixture_bundle), "--model", "baseline:prior", "--output-dir", str(tmp_path)]
    proc = subprocess.run([*launch, str(RUN_SCRIPT), *args, "--no-progress", "--no-score"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning: accelerate launch was asked for 2 processes but started one" in proc.stderr
    info = json.loads((tmp_path / "baseline-prior" / "oracle_implicit" / "run.json").read_text())
    assert info["num_processes"] == 1
