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

A standard stream that cannot be written (its reader went away: ``| head``, a closed pager, ``tee``
ended at logout; its disk is full) is one event of a program, not an ``OSError`` of whatever a
command was doing: the command goes on to its end with the descriptor on /dev/null, so nothing held
in the buffer fails again at exit ("Exception ignored ... BrokenPipeError", status 120, when Python's
stdout is buffered, as in a user's shell), and standard output's loss is said once, at the end.
"""

from __future__ import annotations

import errno
import io
import os
import select
import sys
import time
from dataclasses import dataclass

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
    before ``os._exit``: no buffer in between, nothing raised (a closed or full stderr loses it). A
    descriptor left non-blocking by another process, or a blocking one whose reader stalls, is
    waited for up to ``WAIT_SECONDS``, no longer."""
    try:
        fd = sys.stderr.fileno() if sys.stderr is not None else 2
    except (ValueError, AttributeError, io.UnsupportedOperation):
        fd = 2
    data = memoryview((line + "\n").encode(errors="replace"))
    deadline = time.monotonic() + WAIT_SECONDS
    while data:
        # a write only once the descriptor takes one (a full pipe nobody reads, a stopped terminal:
        # never for ever), at most PIPE_BUF bytes, which a pipe takes whole (a line stays one write)
        if not _writable(fd, deadline):
            return
        try:
            data = data[os.write(fd, data[: select.PIPE_BUF]) :]
        except BlockingIOError:  # another writer took the room first
            if time.monotonic() >= deadline:
                return
        except OSError:
            return


def _writable(fd: int, deadline: float) -> bool:
    """Whether ``fd`` takes a write before ``deadline`` (``time.monotonic``); True where it cannot
    be polled (then the write is tried)."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))
    except (OSError, ValueError, AttributeError):
        return True


#: seconds ``write_now`` waits for a stderr whose reader is slow
WAIT_SECONDS = 1.0


def to_devnull(*fds: int) -> None:
    """Point the process's descriptors ``fds`` (1, 2) at /dev/null: after a program's last line, or
    once the reader of its output has gone away, so that nothing more fails or speaks."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)


@dataclass(frozen=True)
class OutputLoss:
    """Standard output of a program that could not be written (``guard_standard_streams``):
    ``error``, the operating system's (EPIPE, ENOSPC, EIO...); ``target``, what descriptor 1 was
    (``/runs/out.txt``; ``pipe:[...]``, ``socket:[...]``, ``/dev/pts/3``), from /proc where there is
    one."""

    error: OSError
    target: str | None

    def text(self) -> OsErrorText:
        """What happened and what to do, as a user reads it (``line(prog)`` for the one line)."""
        done = "the command went on to its end; the files it wrote are whole"
        see = "to see its output, send it to a file (> out.txt) or to a reader that reads it all"
        code = self.error.errno
        if code in (errno.EPIPE, errno.ECONNRESET):
            return OsErrorText(
                "the program reading this command's output stopped reading "
                f"({os.strerror(code)}: a pipe such as '| head', a closed pager or connection) before "
                f"everything was printed; {done}",
                see,
            )
        target = self.target or ""
        if code == errno.EIO and target.startswith("/dev/"):
            return OsErrorText(f"the terminal this command printed on ({target}) went away; {done}", see)
        if os.path.isfile(target):  # a file of a file system: its real cause (a full disk, a quota)
            text = explain_os_error(
                OSError(code, self.error.strerror, target), then="before it is written to again"
            )
            return OsErrorText(
                f"this command's output could not be written: {text.what}; {done}", text.advice
            )
        where = target if target.startswith("/") else "standard output"
        reason = os.strerror(code) if code else str(self.error)
        return OsErrorText(f"this command's output ({where}) could not be written ({reason}); {done}", see)

    def line(self, prog: str, process: str = "") -> str:
        """``<prog>: [process N: ]error: <what>. <Advice>.``"""
        return self.text().line(prog, process)


_lost: list[OutputLoss] = []


def output_lost() -> OutputLoss | None:
    """The first write of standard output that failed in this process, or None (after
    ``guard_standard_streams``; flush ``sys.stdout`` first to count what it holds)."""
    return _lost[0] if _lost else None


def _target(fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


class _Guarded(io.FileIO):
    """Descriptor 1 or 2 whose first failed write sends it to /dev/null (what the buffer holds then
    goes nowhere, without failing again); on descriptor 1 the failure is kept (``output_lost``). A
    descriptor left non-blocking by whoever shares it (EAGAIN) is waited for: its reader is there."""

    def write(self, data: object) -> int:  # type: ignore[override]
        while True:
            try:
                written = super().write(data)  # type: ignore[arg-type]
            except OSError as e:
                fd = self.fileno()
                if fd == 1 and not _lost:
                    _lost.append(OutputLoss(e, _target(fd)))
                to_devnull(fd)
                return len(memoryview(data))  # type: ignore[arg-type]  # gone, as to /dev/null
            if written is not None:
                return written
            select.select([], [self.fileno()], [])  # EAGAIN: until the reader has made room


def guard_standard_streams() -> None:
    """Give a process of the toolkit (a program, a builder's worker) a ``sys.stdout`` and
    ``sys.stderr`` (``sys.__stdout__``, ``sys.__stderr__`` too) that

    * write each line, newline included, in one write: text is held until its line ends (or the
      stream is flushed), then written at once; text without a newline (a progress bar's ``\\r``
      update) is written when it is flushed;
    * outlive a write that fails: its descriptor goes to /dev/null, so that nothing held fails
      again (at exit, where it was "Exception ignored" and status 120), and the command goes on to
      its end. A run's product is its files: a run started with ``nohup ... 2>&1 | tee run.log``
      finishes every setting when ``tee`` ends at logout (its first progress line ended it before,
      and then its first summary line). Standard output's loss is kept (``output_lost``) and said
      at the end in one line, exit status 2 (``chexpercept.entry_point.run_program``); standard
      error's is not: nobody is left to tell;
    * wait for a descriptor left non-blocking by another process that shares it (EAGAIN), instead
      of failing (Python's own streams raise ``BlockingIOError``, a traceback and status 120);
    * replace what the output's encoding cannot write (an en dash under ``PYTHONIOENCODING=ascii``,
      a file name that is not UTF-8 under a strict UTF-8 locale) with its escape instead of ending
      in ``UnicodeEncodeError`` (a C locale's ``surrogateescape`` is kept: it writes such a name's
      bytes back).

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
            errors="backslashreplace" if stream.errors == "strict" else stream.errors,
            line_buffering=True,
        )
        setattr(sys, name, guarded)
        setattr(sys, f"__{name}__", guarded)
