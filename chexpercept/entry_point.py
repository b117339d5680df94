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
* **Standard streams**: descriptors 0-2 held open and each line written at once
  (chexpercept/stdio.py).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from .stdio import hold_standard_fds, whole_lines, write_now

__all__ = [
    "STOP_SIGNALS",
    "Stopped",
    "catch_signals",
    "program_started",
    "restore_signals",
    "start_program",
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
    ``restore_signals``). Outside the main thread (where Python takes no handler) it changes
    nothing and returns ``{}``."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {}
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is signal.SIG_IGN:  # the user's (or the launcher's) choice holds
            continue
        previous[s] = signal.signal(s, handler)
    return previous


def restore_signals(previous: dict[int, Any]) -> None:
    """Give back the dispositions ``catch_signals`` replaced (one set outside Python: the default)."""
    for s, old in previous.items():
        signal.signal(s, signal.SIG_DFL if old is None else old)


class _Program:
    #: the command's name for its one line, set by start_program
    command: str | None = None


def _who() -> str:
    """``process N: `` in a process of a multi-process launch, else nothing."""
    rank = os.environ.get("RANK")
    return f"process {rank}: " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""


def _stopped_while_starting(signum: int, _frame: object) -> None:
    name = signal.Signals(signum).name
    write_now(f"{_Program.command}: {_who()}stopped by {name} while starting; nothing was done")
    os._exit(128 + signum)


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


def start_program(command: str) -> None:
    """First thing a program does (``command``: its name in messages, ``chexpercept run``): hold
    descriptors 0-2, write whole lines, and end on a stop signal with one line until
    ``program_started``."""
    hold_standard_fds()
    whole_lines()
    _Program.command = command
    catch_signals(_stopped_while_starting)


def program_started() -> None:
    """The command's own work begins (its options are read): from now on a stop signal not ignored
    raises ``Stopped`` in the main thread. Does nothing where ``start_program`` was not called."""
    if _Program.command is not None:
        catch_signals(_raise_stopped)
