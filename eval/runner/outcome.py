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

from chexpercept.escape import shown, terminal_lines
from chexpercept.fileio import write_atomic
from chexpercept.input_files import RESULTS, InputFileError, open_input
from chexpercept.os_errors import explain_os_error
from chexpercept.redaction import redact_text

#: errno values of a folder that cannot be written (a finished run there is checked read-only)
READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
#: how the advice for an operating-system error ends where the run has saved cases: a rerun resumes
RESUME = (
    "then rerun the same command to resume (a line cut off by the failed write is repaired when the "
    "run resumes)"
)
#: and where it has saved none (the error came before any case ran)
RERUN = "then rerun the same command"


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


def os_error_text(error: OSError, folder: FsPath, *, saved: bool) -> tuple[str, str]:
    """(what happened, what to do) for an operating-system error while running in ``folder``: the
    toolkit's one reading of such errors (chexpercept.os_errors), its advice ending with the resume
    where the run has ``saved`` cases (else with a rerun: there is nothing to resume or repair)."""
    text = explain_os_error(error, folder, then=RESUME if saved else RERUN)
    return text.what, text.advice


def end_line(session: Session | None, what: str, advice: str) -> str:
    """``chexpercept run: <what>. <saved>. <advice>.`` (any URL in it redacted: chexpercept.redaction)"""
    prefix = session.prefix if session is not None else ""
    saved = f" {session.saved()}." if session is not None else ""
    return redact_text(f"chexpercept run: {prefix}{what.rstrip('.')}.{saved} {advice.rstrip('.')}.")


def say_end(session: Session | None, what: str, advice: str) -> None:
    print(terminal_lines(end_line(session, what, advice)), file=sys.stderr, flush=True)


def say_bug(session: Session | None, error: BaseException) -> None:
    """An unexpected error: one line, and the traceback in the run folder (else on stderr)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    where = None
    if session is not None:
        try:
            where = write_atomic(session.folder / "error.txt", text)
        except OSError:
            where = None
    detail = f"the traceback is in {where}" if where else "traceback:\n" + text
    if os.environ.get("CHEXPERCEPT_DEBUG"):
        sys.stderr.write(text)
    say_end(
        session,
        f"internal error ({type(error).__name__}: {shown(error, 300, one_line=True)})",
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
    ``main``: this is the main process, or the first process of another machine, which speaks for a
    run that a signal stopped before this process finished anything (each machine's log says how
    the run ended there)."""
    from chexpercept.eval.engine import ConversationFailed
    from chexpercept.eval.protocol import BackendError
    from chexpercept.eval.runner.interrupts import RunInterrupted, received

    saved = session is not None and count_lines(session.results) > 0
    resume = "rerun the same command to resume" if saved else "rerun the same command"
    signum = received()
    if isinstance(error, BackendError) and not isinstance(error, ConversationFailed) and signum:
        error = RunInterrupted(signum)  # the engine died of the same signal (Ctrl-C reaches it too)
    if isinstance(error, RunInterrupted):
        if main or (session is not None and session.finished_now):
            say_end(session, str(error), resume)
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
        what, advice = os_error_text(error, folder, saved=saved)
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
