"""Lines printed by processes that share one stderr arrive whole (chexpercept/stdio.py).

The class: CPython's stderr writes ``print``'s text and its newline separately, so under
``accelerate launch`` one process's line could end inside another's (CI saw
``... to resume.chexpercept run: process 0 of 2: ...``). Members: eval/run.py run as a script (what
accelerate launches), the ``chexpercept`` command (``chexpercept run`` under accelerate), the
builder's worker pools (builder/workers.py, builder/synth_sources.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRITER = """
import sys
from chexpercept.stdio import guard_standard_streams
guard_standard_streams()
for i in range(1500):
    print("x" * 300 + f" line {i} of process {sys.argv[1]}", file=sys.stderr)
    print("y" * 300 + f" line {i} of process {sys.argv[1]}")
"""


def test_lines_of_processes_writing_to_one_pipe_arrive_whole():
    """Three processes print 1,500 long lines each to a shared stderr pipe and a shared stdout pipe:
    every line arrives whole (without it about one stderr line in ten was split)."""
    err_r, err_w = os.pipe()
    out_r, out_w = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(k)], stderr=err_w, stdout=out_w) for k in range(3)
    ]
    os.close(err_w)
    os.close(out_w)

    got: dict[str, bytes] = {}

    def read(name: str, fd: int) -> None:
        with open(fd, "rb") as f:
            got[name] = f.read()

    readers = [threading.Thread(target=read, args=a) for a in (("err", err_r), ("out", out_r))]
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=120)
    assert all(p.wait(timeout=60) == 0 for p in procs)
    for name, char in (("err", "x"), ("out", "y")):
        lines = got[name].decode().split("\n")
        assert lines.pop() == ""
        torn = [
            x[:80] + "..." + x[-40:]
            for x in lines
            if not (x.startswith(char * 300) and x.count(" line ") == 1)
        ]
        assert len(lines) == 4500 and torn == [], torn[:3]


PROBE = "import sys; print('streams', sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stderr.write_through)"


def test_the_commands_a_launcher_starts_write_whole_lines():
    """``chexpercept`` and eval/run.py run as a script (the two forms accelerate launches) set both
    streams to whole lines before anything is printed."""
    cli = (
        "import sys; sys.argv = ['chexpercept', '--version']\nfrom chexpercept.cli import main; main(); "
        + PROBE
    )
    script = (
        "import runpy, sys; sys.argv = ['eval/run.py', '--help']\n"
        "try:\n    runpy.run_path('eval/run.py', run_name='__main__')\nexcept SystemExit:\n    pass\n" + PROBE
    )
    for code in (cli, script):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.splitlines()[-1] == "streams True True False", proc.stdout[-500:]
