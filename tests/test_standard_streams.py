"""A program's standard stream that cannot be written (chexpercept/stdio.py: ``guard_standard_streams``).

The class: a write to standard output or standard error fails, or would block (its reader went
away: ``| head``, ``--help | true``, a pager quit, ``tee`` ended at logout; its disk is full:
``> /dev/full``; a descriptor another process left non-blocking), or cannot encode a character.

The rule, in one place: every program's ``sys.stdout`` and ``sys.stderr`` are guarded from its
first line. A failed write puts the descriptor on /dev/null and the command goes on to its end (a
run's product is its files); standard output's loss is then one line naming its cause and exit
status 2 (``run_program``, which also does the last flush), where the command would have ended well.
A write that would block waits for the reader; an unencodable character is escaped.

Members found, each a case below. With Python's stdout buffered, as in a user's shell (the suite
drops PYTHONUNBUFFERED, tests/conftest.py), each exited 120 with "Exception ignored ...", except:
``--help`` and ``--version`` on a full disk (a traceback), ``run --help`` (argparse ignores the
error: status 0, nothing said), and several named the output folder as full when the full disk was
standard output's. A run whose log's reader went away stopped at its first progress line, before
any case; once that was mended, at its first setting's summary line, before the next setting. A
non-blocking stdout ended in ``BlockingIOError`` (status 120, the output cut at 64 KiB); an ASCII
stdout in ``UnicodeEncodeError``. And ``--output`` to a device or pipe (``/dev/null``,
``/dev/stdout``, a FIFO) replaced it with a file (tests below with a FIFO and a link to one).
"""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import threading
import time
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


def saved(out: Path, name: str = "m", oracle: str = "implicit") -> int:
    return len(list(iter_results(out / name / f"oracle_{oracle}" / "results.jsonl")))


#: program -> (its name in its line, its arguments given the bundle and the runs folder)
PROGRAMS = {
    "--help": ("chexpercept", lambda b, r: [*CLI, "--help"]),
    "--version": ("chexpercept", lambda b, r: [*CLI, "--version"]),
    "run --help": ("chexpercept run", lambda b, r: [*CLI, "run", "--help"]),
    "run --list-models": ("chexpercept run", lambda b, r: [*CLI, "run", "--list-models"]),
    "validate": ("chexpercept validate", lambda b, r: [*CLI, "validate", str(b)]),
    "score": ("chexpercept score", lambda b, r: [*CLI, "score", str(r / "m"), "--details"]),
    # a finished run resumed: nothing to do, then its summary and scores on stdout
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
        assert "this command's output (/dev/full) could not be written (No space left" in line, line
        assert str(runs) not in line, line
    assert "the command went on to its end" in line and line.endswith("reads it all."), line
    assert saved(runs) == 21  # the run's files are whole


@pytest.mark.parametrize("both", [False, True], ids=["stderr alone", "stderr and stdout"])
def test_a_run_whose_log_reader_went_away_finishes_every_setting(fixture_bundle, tmp_path, both):
    """``nohup eval/run.py ... 2>&1 | tee run.log``, ``tee`` ended at logout: the run stopped at its
    first progress line, no case done (status 120), and then at its first setting's summary line.
    It now runs every setting; with stdout on the same pipe its summary and scores are lost, which
    its status says (2)."""
    pipe = closed_pipe()
    argv = [*RUN_PY, *run_options(fixture_bundle, tmp_path), "--oracle", "none", "implicit"]
    proc = subprocess.run(argv, stdout=pipe if both else subprocess.DEVNULL, stderr=pipe, timeout=300)
    os.close(pipe)
    assert proc.returncode == (2 if both else 0)
    assert saved(tmp_path, oracle="none") == saved(tmp_path, oracle="implicit") == 21


def test_a_non_blocking_stdout_is_waited_for(finished):
    """A pipe another process left non-blocking (``O_NONBLOCK`` is shared by every process that
    holds it), its reader slow: every byte arrives, status 0 (it was BlockingIOError, status 120)."""
    _, runs = finished
    argv = [*CLI, "score", str(runs / "m"), "--details", "--cases"]
    whole = subprocess.run(argv, capture_output=True, timeout=180)
    assert whole.returncode == 0 and len(whole.stdout) > 16384, whole.stderr[-2000:]
    read, write = os.pipe()
    fcntl.fcntl(write, 1031, 4096)  # F_SETPIPE_SZ: the smallest pipe, so that a write would block
    fcntl.fcntl(write, fcntl.F_SETFL, fcntl.fcntl(write, fcntl.F_GETFL) | os.O_NONBLOCK)
    proc = subprocess.Popen(argv, stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    got = bytearray()
    with os.fdopen(read, "rb", buffering=0) as reader:
        while chunk := reader.read(4096):
            got += chunk
            time.sleep(0.002)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err[-3000:]
    assert bytes(got) == whole.stdout


def test_a_character_the_output_cannot_encode_is_escaped(finished):
    """``PYTHONIOENCODING=ascii`` (or a C locale without UTF-8): Table 2's legend has an en dash."""
    _, runs = finished
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    proc = subprocess.run(
        [*CLI, "score", str(runs / "m"), "--table", "2"], capture_output=True, text=True, env=env, timeout=180
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "\\u2013" in proc.stdout


@pytest.mark.parametrize("through", ["the FIFO", "a link to it", "-"])
def test_output_to_a_pipe_is_written_into_it_not_replaced(finished, tmp_path, through):
    """``score --output /dev/stdout`` (a link to a pipe) or ``--output /dev/null`` replaced the
    pipe or device with a file (as root, the system's /dev/null); ``-`` wrote a file named '-'."""
    _, runs = finished
    argv = [*CLI, "score", str(runs / "m"), "--details"]
    expected = subprocess.run(argv, capture_output=True, timeout=180).stdout
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = {"the FIFO": fifo, "a link to it": tmp_path / "link", "-": Path("-")}[through]
    if through == "a link to it":
        target.symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = subprocess.run([*argv, "--output", str(target)], capture_output=True, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if through == "-":
        assert proc.stdout == expected and not (tmp_path / "-").exists()
        fifo.write_bytes(b"")  # the reader's end
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    if through != "-":
        assert got == [expected] and proc.stdout == b""
    if through == "a link to it":
        assert target.is_symlink()


@pytest.mark.parametrize("link_to", ["standard output", "a file", "a folder"])
def test_output_through_a_link_writes_what_it_names_and_keeps_the_link(finished, tmp_path, link_to):
    """``--output /dev/stdout > f`` (a link to /proc/self/fd/1, a regular file) replaced the link
    with a file (as root, /dev/stdout itself) and left f empty; a link to a file or to a folder
    was replaced too. A link is now followed as a shell's ``>`` follows it."""
    _, runs = finished
    argv = [*CLI, "score", str(runs / "m"), "--details"]
    expected = subprocess.run(argv, capture_output=True, timeout=180).stdout
    link, captured = tmp_path / "link", tmp_path / "captured.txt"
    named = {"standard output": Path("/proc/self/fd/1"), "a file": tmp_path / "real.json"}
    named["a folder"] = tmp_path / "folder"
    named["a folder"].mkdir()
    named["a file"].write_text("old")
    link.symlink_to(named[link_to])
    with captured.open("wb") as out:
        proc = subprocess.run([*argv, "--output", str(link)], stdout=out, stderr=subprocess.PIPE, timeout=180)
    err = proc.stderr.decode()
    assert link.is_symlink() and os.readlink(link) == str(named[link_to]), err
    if link_to == "a folder":
        assert proc.returncode == 2 and "is a folder" in err and "Traceback" not in err, err
        assert not any(named["a folder"].iterdir()) and captured.read_bytes() == b""
    else:
        assert proc.returncode == 0, err
        written = captured if link_to == "standard output" else named["a file"]
        assert written.read_bytes() == expected


def test_a_name_that_is_not_utf8_prints_under_a_strict_utf8_output(fixture_bundle, tmp_path):
    """A bundle folder named in bytes that are not UTF-8 (``bund_\\xff``) under ``LANG=en_US.UTF-8``
    (Python's stdout strict): ``validate`` printed a UnicodeEncodeError traceback."""
    import shutil

    odd = Path(os.fsdecode(bytes(tmp_path) + b"/bund_\xff"))
    shutil.copytree(fixture_bundle, odd)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([*CLI, "validate", str(odd)], capture_output=True, env=env, timeout=180)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert b"bund_\\udcff" in proc.stdout + proc.stderr
