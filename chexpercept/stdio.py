"""The standard streams of a process of the toolkit: each line in one write, descriptors 0-2 held.

Each line a process of the toolkit prints reaches stdout or stderr in one write.

CPython's ``sys.stderr`` has no buffer (its text layer writes straight through to the file
descriptor), so ``print(text, file=sys.stderr)`` makes two writes, the text and then its newline.
Under ``accelerate launch`` every process of a run writes to the same stderr, a pipe when the run
is logged, and another process's line can fall between the two:
``... rerun the same command to resume.chexpercept run: process 0 of 2: stopped by SIGTERM ...``
(measured: 2 runs in 30 on 2 busy cores). A write of up to ``PIPE_BUF`` bytes (4,096 on Linux) to a
pipe is never split, so a line written at once arrives whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys


def whole_lines() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` of this process write each line, newline included, in
    one write: text is held until its line ends (or the stream is flushed), then written at once.
    Text without a newline (a progress bar's ``\\r`` update) is written when it is flushed, as
    before. A stream that is not the interpreter's own text file (a test's capture) is left alone."""
    for stream in (sys.stdout, sys.stderr):
        if type(stream) is io.TextIOWrapper:
            with contextlib.suppress(ValueError, io.UnsupportedOperation):  # closed, or detached
                stream.reconfigure(line_buffering=True, write_through=False)


#: the file descriptors of standard input, output and error
STANDARD_FDS = (0, 1, 2)


def hold_standard_fds() -> None:
    """Open ``/dev/null`` on each of descriptors 0, 1 and 2 that is closed (``cmd >&- 2>&-``, a daemon
    that closed them), and give ``sys.stdout``/``sys.stderr`` a writer where the interpreter left
    None. Otherwise the next file the process opens takes the lowest free descriptor, and a line
    meant for stderr (a library's warning, a last-moment ``os.write(2, ...)``) would be written into
    it: a run's results file, say. Open descriptors are left as they are."""
    for fd in STANDARD_FDS:
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # a lower descriptor was free too: it is taken next round in any case
                os.dup2(null, fd)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own stream
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115


def write_now(line: str) -> None:
    """``line`` (and a newline) to stderr's descriptor in one write, from a signal handler or just
    before ``os._exit``: no buffer in between, nothing raised (a closed or full stderr loses it)."""
    try:
        fd = sys.stderr.fileno() if sys.stderr is not None else 2
        os.write(fd, (line + "\n").encode(errors="replace"))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


def to_devnull(*fds: int) -> None:
    """Point the process's descriptors ``fds`` (1, 2) at /dev/null: after a program's last line, or
    once the reader of its output has gone away, so that nothing more fails or speaks."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)
