"""The standard streams of a process of the toolkit: each line in one write, descriptors 0-2 held.

Each line a process of the toolkit prints reaches stdout or stderr in one write
(``guard_standard_streams``).

CPython's ``sys.stderr`` has no buffer (its text layer writes straight through to the file
descriptor), so ``print(text, file=sys.stderr)`` makes two writes, the text and then its newline.
Under ``accelerate launch`` every process of a run writes to the same stderr, a pipe when the run
is logged, and another process's line can fall between the two:
``... rerun the same command to resume.chexpercept run: process 0 of 2: stopped by SIGTERM ...``
(measured: 2 runs in 30 on 2 busy cores). A write of up to ``PIPE_BUF`` bytes (4,096 on Linux) to a
pipe is never split, so a line written at once arrives whole.

Standard output that cannot be written (its reader went away: ``| head``, a closed pager; its disk
is full) is one event of a program, not an ``OSError`` of whatever file a command was writing: the
write that fails raises ``OutputLost`` once, naming standard output, and the descriptor goes to
/dev/null, so nothing held in the buffer fails again at exit ("Exception ignored ... BrokenPipeError",
status 120, when Python's stdout is buffered, as in a user's shell).
"""

from __future__ import annotations

import errno
import io
import os
import sys

from .os_errors import OsErrorText, explain_os_error

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


#: the advice's end when standard output failed: what the command wrote to files is whole
_OUTPUT_THEN = "the files the command wrote are not concerned; then rerun the command"


class OutputLost(BaseException):
    """Standard output of a program could not be written: raised by the write that failed, once
    (``guard_standard_streams``); standard output then goes to /dev/null.

    Not an ``OSError`` on purpose: a command's handler of its own files' errors (``except
    OSError``) would take it for one of them (it named the output folder as full), and argparse,
    which ignores an ``OSError`` while printing help, would lose it (exit status 0, nothing said).
    Not an ``Exception`` either: a run's handler of unexpected errors would report it as a bug.
    ``chexpercept.entry_point.run_program`` says it in one line, exit status 2.

    ``error``: the operating system's error (EPIPE, ENOSPC, EIO...); ``target``: what descriptor 1
    was (``/runs/out.txt``; ``pipe:[...]`` for a pipe), from /proc where there is one."""

    def __init__(self, error: OSError, target: str | None):
        super().__init__(error, target)  # as given: a worker's is pickled to its pool
        self.error = error
        self.target = target

    def text(self) -> OsErrorText:
        """What happened and what to do, as a user reads it (``line(prog)`` for the one line)."""
        if self.error.errno == errno.EPIPE:
            return OsErrorText(
                "the program reading this command's output stopped reading (Broken pipe: a pipe such "
                "as '| head' or a closed pager), before everything was printed",
                "send the output to a file (> out.txt) or to a reader that reads it all; " + _OUTPUT_THEN,
            )
        named = self.target if self.target and self.target.startswith("/") else None
        error = OSError(self.error.errno, self.error.strerror, named)
        text = explain_os_error(error, named, then=_OUTPUT_THEN, option="> FILE")
        where = f" ({named})" if named else ""
        return OsErrorText(f"this command's output{where} could not be written: {text.what}", text.advice)

    def line(self, prog: str) -> str:
        """``<prog>: error: <what>. <advice>.``"""
        return self.text().line(prog)


def _target(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class _Guarded(io.FileIO):
    """Descriptor 1 or 2 whose first failed write sends it to /dev/null (what the buffer holds then
    goes nowhere, without failing again); on descriptor 1 that write raises ``OutputLost``."""

    def write(self, data: object) -> int | None:  # type: ignore[override]
        try:
            return super().write(data)  # type: ignore[arg-type]
        except OSError as e:
            fd = self.fileno()
            target = _target(fd)
            to_devnull(fd)
            if fd == 1:
                raise OutputLost(e, target) from e
            return super().write(data)  # type: ignore[arg-type]  # to /dev/null


def guard_standard_streams() -> None:
    """Give a process of the toolkit (a program, a builder's worker) a ``sys.stdout`` and
    ``sys.stderr`` (``sys.__stdout__``, ``sys.__stderr__`` too) that

    * write each line, newline included, in one write: text is held until its line ends (or the
      stream is flushed), then written at once; text without a newline (a progress bar's ``\\r``
      update) is written when it is flushed;
    * outlive a write that fails, its descriptor then on /dev/null so that nothing held fails again
      (at exit, where it was "Exception ignored" and status 120):

      * **standard output**, the command's product (scores, tables, ``--help``): the write raises
        ``OutputLost``, once; the command ends there with one line and exit status 2
        (``chexpercept.entry_point.run_program``);
      * **standard error**, progress and diagnostics: the command goes on without them, as a run
        started with ``nohup ... 2>&1 | tee run.log`` must when ``tee`` ends at logout (the first
        progress line ended such a run before it had done a case). Nobody is left to tell.

    A stream that is not the interpreter's own text file (a test's capture) is left alone; one of
    its text files on another descriptor only writes whole lines."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if type(stream) is not io.TextIOWrapper:
            continue
        try:
            stream.flush()
            own = stream.fileno() == fd
        except (OSError, ValueError, io.UnsupportedOperation):  # closed, detached, failing
            continue
        if not own:
            stream.reconfigure(line_buffering=True, write_through=False)
            continue
        guarded = io.TextIOWrapper(
            io.BufferedWriter(_Guarded(fd, "w", closefd=False)),
            encoding=stream.encoding,
            errors=stream.errors,
            line_buffering=True,
        )
        setattr(sys, name, guarded)
        setattr(sys, f"__{name}__", guarded)
