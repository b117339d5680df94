"""A program's standard stream that cannot be written (chexpercept/stdio.py: ``guard_standard_streams``).

The class: a write to standard output or standard error fails (its reader went away: ``| head``,
``--help | true``, a pager quit, ``tee`` ended at logout; its disk is full: ``> /dev/full``).

The rule, in one place: every program's ``sys.stdout`` and ``sys.stderr`` are guarded from its first
line. Standard output, the command's product, ends the command with one line naming it, exit
status 2 (``OutputLost``, said by ``run_program``, which also does the last flush). Standard error,
progress and diagnostics, is dropped and the command goes on.

Members found, each a case below. With Python's stdout buffered, as in a user's shell (the suite
drops PYTHONUNBUFFERED, tests/conftest.py), each exited 120 with "Exception ignored ...", except:
``--help`` and ``--version`` on a full disk (a traceback), ``run --help`` (argparse ignores the error:
status 0, nothing said), and several named the output folder as full when the full disk was standard
output's. A run whose stderr's reader went away stopped at its first progress line, before any case.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chexpercept.eval.run import main
from chexpercept.results import iter_results

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "chexpercept.cli"]
RUN_PY = [sys.executable, str(ROOT / "eval" / "run.py")]


@pytest.fixture(scope="module")
def finished(fixture_bundle, tmp_path_factory) -> tuple[Path, Path]:
    """(the bundle, a folder of runs holding run ``m``: every case of the bundle done)."""
    out = tmp_path_factory.mktemp("runs")
    assert main(run_options(fixture_bundle, out)) == 0
    return fixture_bundle, out


def run_options(bundle: Path, out: Path, name: str = "m") -> list[str]:
    return [
        *("--data-dir", str(bundle), "--output-dir", str(out), "--run-name", name),
        *("--model", "baseline:random", "--batch-size", "2"),
    ]


def saved(out: Path, name: str = "m") -> int:
    return len(list(iter_results(out / name / "oracle_implicit" / "results.jsonl")))


#: program -> (its name in its line, its arguments given the bundle and the runs folder)
PROGRAMS = {
    "--help": ("chexpercept --help", lambda b, r: [*CLI, "--help"]),
    "--version": ("chexpercept --version", lambda b, r: [*CLI, "--version"]),
    "run --help": ("chexpercept run", lambda b, r: [*CLI, "run", "--help"]),
    "run --list-models": ("chexpercept run", lambda b, r: [*CLI, "run", "--list-models"]),
    "validate": ("chexpercept validate", lambda b, r: [*CLI, "validate", str(b)]),
    "score": ("chexpercept score", lambda b, r: [*CLI, "score", str(r / "m"), "--details"]),
    # a finished run resumed: nothing to do, then its scores on stdout
    "eval/run.py": ("chexpercept run", lambda b, r: [*RUN_PY, *run_options(b, r), "--no-progress"]),
    "chexpercept run": ("chexpercept run", lambda b, r: [*CLI, "run", *run_options(b, r), "--no-progress"]),
}


def closed_pipe() -> int:
    """The write end of a pipe whose reader has already gone away."""
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.parametrize("where", ["a reader that went away", "a full disk"])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_standard_output_that_cannot_be_written_is_one_line(finished, program, where):
    prog, argv = PROGRAMS[program]
    bundle, runs = finished
    stdout = closed_pipe() if where == "a reader that went away" else os.open("/dev/full", os.O_WRONLY)
    proc = subprocess.Popen(argv(bundle, runs), stdout=stdout, stderr=subprocess.PIPE, text=True)
    os.close(stdout)
    err = proc.stderr.read()
    assert proc.wait(timeout=180) == 2, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith(f"{prog}: error:")]
    if where == "a reader that went away":
        assert "the program reading this command's output stopped reading" in line, line
    else:  # standard output's device named, not the command's output folder
        assert "this command's output (/dev/full) could not be written: no space" in line, line
        assert str(runs) not in line, line
    assert line.endswith("then rerun the command."), line
    assert saved(runs) == 21  # the run's files are whole


@pytest.mark.parametrize("both", [False, True], ids=["stderr alone", "stderr and stdout"])
def test_a_run_whose_log_reader_went_away_finishes_its_cases(fixture_bundle, tmp_path, both):
    """``nohup eval/run.py ... 2>&1 | tee run.log``, ``tee`` ended at logout: the run stopped at its
    first progress line, no case done (status 120). It now does every case; with stdout on the
    same pipe, its scores cannot be printed: status 2."""
    pipe = closed_pipe()
    argv = [*RUN_PY, *run_options(fixture_bundle, tmp_path)]  # progress: a line at the start and end
    proc = subprocess.run(argv, stdout=pipe if both else subprocess.DEVNULL, stderr=pipe, timeout=180)
    os.close(pipe)
    assert proc.returncode == (2 if both else 0)
    assert saved(tmp_path) == 21
