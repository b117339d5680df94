"""How a run that cannot finish ends: one line saying what happened, what is saved, and what to do.

Every way a run can stop early ends here instead of in a traceback: a stop signal, a failed request
under ``--on-error stop``, a dead engine (``EngineDeadError``, a server that refuses every request),
an operating-system error (a full disk, a read-only or forbidden folder), or a bug. Whatever stops
it, every case finished before is already on disk (results are appended as each case finishes), so
the line says how many, where, and that rerunning the same command resumes.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path as FsPath

from chexpercept.escape import terminal_lines
from chexpercept.input_files import RESULTS, InputFileError, open_input

#: errno values of a disk that is full, and of a folder that cannot be written
NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})
READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


@dataclass
class Session:
    """What one run of the command did to its folder, for the line that ends it."""

    folder: FsPath
    results: FsPath
    #: cases selected, and those left to do when this session started
    selected: int = 0
    remaining: int = 0
    #: cases this process finished (appended) and left unfinished (failures.jsonl) in this session
    finished_now: int = 0
    failed_now: int = 0
    #: "" for one process, else "process k of n: " (each process of a sharded run says its own)
    prefix: str = ""

    def saved(self) -> str:
        """``12 of 21 selected cases are saved in runs/m/oracle_none/results.jsonl (5 in this session)``."""
        total = count_lines(self.results)
        failed = f"; {self.failed_now} left unfinished (failures.jsonl)" if self.failed_now else ""
        if not total and not self.failed_now:
            return f"0 of {self.selected} selected cases are saved (none yet; they go to {self.results})"
        return (
            f"{total} of {self.selected} selected cases are saved in {self.results} "
            f"({self.finished_now} finished in this session{failed})"
        )


def count_lines(path: FsPath) -> int:
    """Complete lines of a file (0 when it does not exist), without parsing them."""
    try:
        with open_input(path, RESULTS, what="results file") as f:
            return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
    except (OSError, InputFileError):  # missing, or not a regular file (a FIFO is never read)
        return 0


def os_error_text(error: OSError, folder: FsPath) -> tuple[str, str]:
    """(what happened, what to do) for an operating-system error while running in ``folder``."""
    where = error.filename or folder
    reason = os.strerror(error.errno) if error.errno else str(error)
    if error.errno in NO_SPACE:
        return (
            f"no space left on the device of {where} ({reason})",
            f"free space there (df -h {folder}), then rerun the same command to resume; a line cut off "
            "by the full disk is repaired when the run resumes",
        )
    if error.errno in READ_ONLY:
        return (
            f"cannot write to {where} ({reason})",
            "make the folder writable, or copy it to a writable place and pass that --output-dir",
        )
    return (
        f"{type(error).__name__} on {where}: {reason}",
        "fix the cause, then rerun the same command to resume",
    )


def end_line(session: Session | None, what: str, advice: str) -> str:
    """``chexpercept run: <what>. <saved>. <advice>.``"""
    prefix = session.prefix if session is not None else ""
    saved = f" {session.saved()}." if session is not None else ""
    return f"chexpercept run: {prefix}{what.rstrip('.')}.{saved} {advice.rstrip('.')}."


def say_end(session: Session | None, what: str, advice: str) -> None:
    print(terminal_lines(end_line(session, what, advice)), file=sys.stderr, flush=True)


def say_bug(session: Session | None, error: BaseException) -> None:
    """An unexpected error: one line, and the traceback in the run folder (else on stderr)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    where = None
    if session is not None:
        try:
            where = session.folder / "error.txt"
            where.write_text(text, encoding="utf-8")
        except OSError:
            where = None
    detail = f"the traceback is in {where}" if where else "traceback:\n" + text
    if os.environ.get("CHEXPERCEPT_DEBUG"):
        sys.stderr.write(text)
    say_end(
        session,
        f"internal error ({type(error).__name__}: {' '.join(str(error).split())[:300]})",
        f"rerun the same command to resume; if it happens again, please report it ({detail})",
    )


def end_of(
    error: BaseException,
    session: Session | None,
    folder: FsPath,
    *,
    main: bool,
    expected: tuple[type[BaseException], ...] = (ValueError,),
) -> int:
    """Say how the run ended because of ``error`` and return the exit status: a stop signal
    (128 + the signal), a failed request under --on-error stop, a dead engine, an operating-system
    error (2), an ``expected`` error such as bad input (2), or a bug (1, its traceback in error.txt).
    ``main``: this is the main process, which speaks for a run that a signal stopped before this
    process finished anything."""
    from .engine import ConversationFailed
    from .interrupts import RunInterrupted, received
    from .protocol import BackendError

    saved = session is not None and count_lines(session.results) > 0
    resume = "rerun the same command to resume" if saved else "rerun the same command"
    signum = received()
    if isinstance(error, BackendError) and not isinstance(error, ConversationFailed) and signum:
        error = RunInterrupted(signum)  # the engine died of the same signal (Ctrl-C reaches it too)
    if isinstance(error, RunInterrupted):
        if main or (session is not None and session.finished_now):
            say_end(session, f"stopped by {error.name}", resume)
        return error.exit_status
    if isinstance(error, ConversationFailed):
        say_end(
            session,
            f"error: {error} (--on-error stop; {error.live} other live conversation(s) were not finished)",
            f"{resume}, or pass --on-error record to leave the cases whose requests fail unfinished and "
            "go on with the others",
        )
        return 2
    if isinstance(error, BackendError):  # a dead engine resumes; one that never started needs a fix
        say_end(session, f"error: {error}", resume if saved else f"fix it, then {resume}")
        return 2
    if isinstance(error, OSError) and error.errno is not None:  # the system's (not PIL's)
        what, advice = os_error_text(error, folder)
        say_end(session, f"error: {what}", advice)
        return 2
    if isinstance(error, OSError):
        say_end(session, f"error: {type(error).__name__}: {error}", f"fix it, then {resume}")
        return 2
    if isinstance(error, expected):
        say_end(session, f"error: {error}", f"fix it, then {resume}")
        return 2
    say_bug(session, error)
    return 1
