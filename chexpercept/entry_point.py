"""What the toolkit's programs do first, and how each stop signal is taken from then on.

The programs are the ``chexpercept`` command and ``eval/run.py`` run as a script (what ``accelerate
launch`` starts in every process). Called in-process (a notebook, a test, another tool's
``main(argv)``), nothing here changes the caller's process: ``start_program`` is called only by a
program's own entry, and ``program_started`` does nothing where it was not.

The rules, held here for every program and every run:

* **A signal the user ignored stays ignored.** ``nohup`` ignores SIGHUP, ``trap '' TERM`` SIGTERM, a
  shell's background job SIGINT: a process inherits the choice, and nothing of the toolkit installs
  a handler over it (``catch_signals``; the run's own ``stop_on_signals`` goes through it too).
* **Every stop says one line.** While a program starts (imports take seconds, and under
  ``accelerate launch`` a Ctrl-C reaches every process) a stop signal ends it with one line and
  status 128 + the signal; once the command runs, SIGTERM and SIGHUP are raised as SIGINT is
  (``Stopped``, a ``KeyboardInterrupt``), so ``finally`` blocks and worker pools shut down and the
  command says how it ended; ``chexpercept run`` then takes them over with its own handling
  (eval/runner/interrupts.py).
* **A stop signal is taken at once, whatever the main thread waits on.** The kernel may give it to
  any thread, and a main thread waiting without a timeout (a queue, a future, a lock) would take it
  when its wait ended: ``catch_signals`` arms the signal watch (chexpercept/signal_watch.py), which
  wakes the main thread until its handler has run.
* **Standard streams**: descriptors 0-2 held open and each line written at once; a stream that
  cannot be written (its reader went away, its disk is full) does not end the command, and standard
  output's loss is one line and exit status 2 at its end (chexpercept/stdio.py, ``run_program``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from . import signal_watch
from .progress import is_terminal
from .stdio import guard_standard_streams, hold_standard_fds, output_lost, to_devnull, write_now

__all__ = [
    "STOP_SIGNALS",
    "Stopped",
    "catch_signals",
    "exit_now",
    "is_program",
    "launched_as",
    "program_started",
    "restore_signals",
    "run_program",
    "signals_caught",
    "start_program",
    "stop_at_once_while",
    "stop_name",
]

#: signals that stop a command: SIGTERM (SLURM, ``timeout``, ``docker stop``), SIGINT (Ctrl-C),
#: SIGHUP (a closed terminal)
STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGHUP")) if s is not None
)

Handler = Callable[[int, Any], Any]


class Stopped(KeyboardInterrupt):
    """A stop signal raised in the main thread (SIGINT's ``KeyboardInterrupt``, for SIGTERM and
    SIGHUP too); ``signum`` says which, ``exit_status`` is 128 + it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def stop_name(error: KeyboardInterrupt) -> tuple[str, int]:
    """(how to name the stop, the exit status) of a ``KeyboardInterrupt`` or ``Stopped``."""
    if isinstance(error, Stopped):
        return error.name, error.exit_status
    return "Ctrl-C", 128 + signal.SIGINT


def catch_signals(handler: Handler) -> dict[int, Any]:
    """Install ``handler`` for each stop signal that is not ignored; returns what each replaced (for
    ``restore_signals``). The handler runs within ``signal_watch.WAKE_SECONDS`` of the signal's
    arrival whatever the main thread waits on (chexpercept/signal_watch.py). Outside the main thread
    (where Python takes no handler) it changes nothing and returns ``{}``. A stop signal that came
    while the handlers changed reaches ``handler`` as this returns, and what it raises comes out of
    here, the return value lost: a block that gives the handlers back uses ``signals_caught``."""
    caught = _catchable()
    if not caught:
        return {}
    with _held(caught):
        return _install(caught, handler)


@contextlib.contextmanager
def signals_caught(handler: Handler) -> Iterator[dict[int, Any]]:
    """``catch_signals`` for the length of a block (yields what it replaced), given back at its end
    however it ends: a stop signal that comes while the handlers change is taken inside the block
    (what ``handler`` raises then comes out of the ``with``, the caller's handlers back in place),
    one that comes while they are given back goes to the caller's own."""
    caught = _catchable()
    mask = getattr(signal, "pthread_sigmask", None)
    if not caught or mask is None:
        previous = catch_signals(handler)
        try:
            yield previous
        finally:
            restore_signals(previous)
        return
    held = _holdable() | set(caught)
    before = mask(signal.SIG_BLOCK, held)
    try:
        previous = _install(caught, handler)
        try:
            mask(signal.SIG_SETMASK, before)  # a stop held meanwhile comes now, to ``handler``
            yield previous
        finally:
            try:  # a handler noted just before the mask runs as it returns; what it raises waits
                mask(signal.SIG_BLOCK, held)
            finally:
                _give_back(previous)
    finally:
        mask(signal.SIG_SETMASK, before)


def _catchable() -> list[int]:
    """The stop signals a handler may be installed for: none outside the main thread (Python takes
    no handler there), and none the user (or the launcher) chose to ignore: that choice holds."""
    if threading.current_thread() is not threading.main_thread():
        return []
    return [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


def _install(caught: list[int], handler: Handler) -> dict[int, Any]:
    """With ``caught`` held: the signal watch armed (the handler runs promptly, whichever thread
    takes the signal; no stop cuts the arm short, which would leave a closed wake-up descriptor),
    then ``handler`` installed for each; returns what each replaced."""
    signal_watch.arm(tuple(caught))
    previous: dict[int, Any] = {}
    try:
        for s in caught:
            previous[s] = signal.getsignal(s)
            signal.signal(s, _taking(handler))
    except BaseException:  # a handler of another signal that raised (a caller's alarm): undone
        _give_back(previous)
        raise
    return previous


def _give_back(previous: dict[int, Any]) -> None:
    """With the signals held: ``_install`` undone. Every step is tried (a handler of another signal
    may raise in the middle: a caller's alarm); the first error is raised after the last."""
    error: BaseException | None = None
    for s, old in previous.items():
        try:
            signal.signal(s, signal.SIG_DFL if old is None else old)
        except BaseException as e:
            error = error or e
    try:
        signal_watch.disarm()
    except BaseException as e:
        error = error or e
    if error is not None:
        raise error


def _taking(handler: Handler) -> Handler:
    """``handler``, telling the signal watch first that the main thread took the stop signals."""

    def take(signum: int, frame: Any) -> Any:
        signal_watch.taken()
        return handler(signum, frame)

    return take


def restore_signals(previous: dict[int, Any]) -> None:
    """Give back the dispositions ``catch_signals`` replaced (one set outside Python: the default),
    and its arm of the signal watch."""
    if not previous:
        return
    with _held(list(previous)):
        _give_back(previous)


#: signals the kernel sends for a fault of the thread itself: never held (held, one kills at once)
_FAULTS = {
    getattr(signal, n)
    for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS")
    if hasattr(signal, n)
}


def _holdable() -> set[int]:
    """Every signal but the faults: what the main thread holds while the stop handlers and the
    signal watch change. Not only the stop signals: another's handler that raises in the middle (a
    caller's alarm) would leave a change half made (second red team, stop 46)."""
    return set(signal.valid_signals()) - _FAULTS if hasattr(signal, "valid_signals") else set()


@contextlib.contextmanager
def _held(signals: list[int]) -> Iterator[None]:
    """Signals wait (blocked in the main thread) while the stop signals' dispositions change, and
    come after, to the new ones: every stop signal changes at once, so none arrives between two of
    them (a SIGHUP just after SIGTERM's handler is in place, under load, killed the program without
    a word). ``signals`` are the ones changed; every other signal but the faults waits too."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None or not signals:
        yield
        return
    before = mask(signal.SIG_BLOCK, _holdable() | set(signals))
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, before)


class _Program:
    #: the command's name for its one line, set by start_program
    command: str | None = None
    #: the stop signal the command took (after program_started), if any
    stopped: int | None = None
    #: the processes the command starts (eval/runner/interrupts.py: ChildProcesses), from
    #: program_started on
    children: Any = None


def is_program() -> bool:
    """True in a program of the toolkit (``start_program`` was called), False in a caller's process
    (a notebook, a test, another tool): that one is never ended from here."""
    return _Program.command is not None


def launched_as() -> str:
    """``process N: `` in a process of a multi-process launch, else nothing."""
    rank = os.environ.get("RANK")
    return f"process {rank}: " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""


def exit_now(signum: int, why: str, children: Any = None, *, saved: str = "") -> NoReturn:
    """End the program at once: one line ``<why>[; stopping N process(es) it started]; exiting
    now<saved>``, then every process it started (``children``, a ChildProcesses) stopped (SIGTERM,
    SIGKILL after 1 s), exit status 128 + ``signum``. For a second stop signal or a shutdown that
    hangs. After the line, this process's stdout and stderr go to /dev/null: its other threads
    (a worker pool's, seeing its workers die) say nothing more."""
    pids = children.started() if children is not None else []
    note = f"; stopping {len(pids)} process(es) it started" if pids else ""
    write_now(f"{why}{note}; exiting now{saved}")
    to_devnull(1, 2)
    if children is not None:
        children.stop(timeout=1.0)
    os._exit(128 + signum)


def _stopped_while_starting(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    write_now(f"{_Program.command}: {launched_as()}stopped by {name} while starting; nothing was done")
    os._exit(128 + signum)


def _raise_stopped(signum: int, _frame: object) -> None:
    if _Program.stopped is not None:  # a second signal: the shutdown is not waited for
        exit_now(
            signum,
            f"{_Program.command}: {launched_as()}{signal.Signals(signum).name} again",
            _Program.children,
        )
    _Program.stopped = signum
    raise Stopped(signum)


def start_program(command: str) -> None:
    """First thing a program does (``command``: its name in messages, ``chexpercept run``): hold
    descriptors 0-2, write whole lines, and end on a stop signal with one line until
    ``program_started``. Where stderr is a log, not a terminal, the Hugging Face libraries' own bars
    are off (``HF_HUB_DISABLE_PROGRESS_BARS``, unless set), as the toolkit's are lines
    (chexpercept/progress.py)."""
    hold_standard_fds()
    guard_standard_streams()
    _Program.command = command
    catch_signals(_stopped_while_starting)
    if not is_terminal(sys.stderr):
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def program_started() -> None:
    """The command's own work begins (its options are read): from now on a stop signal not ignored
    raises ``Stopped`` in the main thread, and a second one ends the program at once with the
    processes it started. Does nothing where ``start_program`` was not called."""
    if _Program.command is not None:
        from chexpercept.eval.runner.interrupts import ChildProcesses

        _Program.children = ChildProcesses()
        catch_signals(_raise_stopped)


def run_program(main: Callable[[], int]) -> int:
    """``main()``'s exit status, in a program. Standard output is flushed here, not left to the
    interpreter's exit: where it could not be written (``| head``, ``--help | true``, a full disk),
    the command went on to its end all the same (chexpercept/stdio.py) and a command that would
    have ended well ends with one line naming the cause, exit status 2 (``sys.exit(0)`` included:
    ``--help``); one that failed keeps its own status and message. A package that this install
    lacks is one line naming the extra that brings it (``chexpercept.extras``).

    A stop signal that no part of the command turned into its own line (one between the options and
    the command's ``try``, one while standard output is flushed at the end) is one line here and
    128 + the signal, never a traceback; from the return on, one while the interpreter exits is one
    line and ends the process at once (``_stopped_while_exiting``)."""
    ended: list[int] = []  # main's status, once it returned
    try:
        return _run_main(main, ended)
    except BaseException as e:
        signum = _stop_signal(e)
        if signum is None:
            raise
        name = signal.Signals(signum).name
        said = f"after the command had ended (status {ended[0]})" if ended else "before its work began"
        write_now(f"{_Program.command or 'chexpercept'}: {launched_as()}stopped by {name} {said}")
        return 128 + signum
    finally:
        catch_signals(_stopped_while_exiting)


def _stop_signal(error: BaseException) -> int | None:
    """The stop signal an exception stands for (``Stopped``, the runner's ``RunInterrupted``, a
    bare ``KeyboardInterrupt``: SIGINT), or None."""
    signum = getattr(error, "signum", None)
    if isinstance(signum, int) and signum in STOP_SIGNALS:
        return signum
    return int(signal.SIGINT) if isinstance(error, KeyboardInterrupt) else None


def _stopped_while_exiting(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    why = f"{_Program.command}: {launched_as()}stopped by {name} while exiting; the command had ended"
    exit_now(signum, why, _Program.children)  # with what it started (a pool's workers it waits for)


def _run_main(main: Callable[[], int], ended: list[int]) -> int:
    """``run_program``'s body: ``main()``, its status appended to ``ended``, standard output flushed."""
    try:
        try:
            status = main()
            ended.append(status)
        except SystemExit as e:
            ended.append(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)
            if _lost_output(ended_well=e.code in (None, 0)):
                return 2
            raise
    except ModuleNotFoundError as e:  # a package this install lacks (chexpercept.extras); else a bug
        from .extras import say_missing

        _lost_output(ended_well=False)
        return say_missing(_Program.command or "chexpercept", e)
    return 2 if _lost_output(ended_well=status == 0) else status


def _lost_output(*, ended_well: bool) -> bool:
    """Flush standard output; whether it was lost in a command that ``ended_well`` (then said)."""
    if sys.stdout is not None:
        with contextlib.suppress(ValueError):  # closed by the command: nothing is held
            sys.stdout.flush()
    loss = output_lost()
    if loss is None or not ended_well:
        return False
    write_now(loss.line(_Program.command or "chexpercept", launched_as()))
    return True


@contextlib.contextmanager
def stop_at_once_while(what: str) -> Iterator[None]:
    """A block that waits inside a C call that may last (a run's processes waiting for each other to
    connect): Python runs its signal handlers only between bytecodes, so a stop signal would wait
    for the call to end (days). In a program's main thread, a stop signal inside the block ends the
    process at once with one line (``stopped by SIGTERM while <what>; nothing was written``), said
    by the signal watch's thread as the signal arrives (chexpercept/signal_watch.py). Elsewhere it
    changes nothing."""
    if not is_program() or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int) -> None:
        name = signal.Signals(signum).name
        write_now(f"{_Program.command}: {launched_as()}stopped by {name} while {what}; nothing was written")
        os._exit(128 + signum)

    with signal_watch.on_arrival(stop):
        yield
