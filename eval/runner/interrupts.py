"""Signals that stop a run: SIGTERM, SIGINT (Ctrl-C) and SIGHUP end it within seconds, engine and all.

SLURM, ``timeout`` and ``docker stop`` send SIGTERM, a closed terminal SIGHUP, Ctrl-C SIGINT. By
default the first two kill the process where it stands, and vLLM's engine processes live on,
holding their (GPU) memory (vllm-project/vllm#55510); after Ctrl-C the engine may die first and the
main process then wait for it forever (vllm-project/vllm#39854). Inside ``stop_on_signals``:

* the first signal raises ``RunInterrupted`` in the main thread (a BaseException, so no library's
  ``except Exception`` swallows it); the run then shuts its backend down, saves what is finished
  (every finished case is already on disk), releases its lock and says what was saved;
* a signal that arrives while a finished case is being appended (``deferred``) waits until the
  append is complete, so no line is torn;
* if the shutdown takes longer than ``grace`` seconds, or a second signal comes, every process the
  run started (vLLM's engine core and workers included) is killed and a program exits at once; a
  caller that ran the run in-process (a notebook, a test) is never ended: the run unwinds and
  returns (the shutdown is over when the ``stop_on_signals`` block ends).

Child processes are told apart from those that were there before the run (``ChildProcesses``), so a
run started from a test or a notebook never kills processes it did not start.

A terminal sends Ctrl-C (and a closed terminal SIGHUP) to its whole foreground process group, so
vLLM's engine core and its workers would receive it too, each stopping on its own: a worker that
exits first leaves the engine core's step "cancelled", and the engine core prints a traceback after
the run's own line (or, in some vLLM versions, the main process waits for it forever). Processes a
backend starts inside ``shielded_children`` hold those two signals blocked (a blocked signal mask is
inherited through fork and exec alike), so the main process alone takes them and shuts the engine
down in order, as it does on SIGTERM; SIGTERM and SIGKILL still reach them (vLLM stops its engine
with SIGTERM). A process started there (vLLM's engine core, forked or spawned) also dies with the
main process (Linux's parent-death signal), so a kill -9 of the main process alone, the
out-of-memory killer's way, leaves no engine holding its memory (vllm-project/vllm#55510's other
half).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

from chexpercept import signal_watch
from chexpercept.entry_point import STOP_SIGNALS, exit_now, is_program, signals_caught
from chexpercept.startup import PARENT_VARIABLE
from chexpercept.stdio import write_now

#: signals a terminal sends to its whole foreground process group, which only the main process takes
TERMINAL_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGHUP")) if s is not None
)
#: seconds a run may take to shut down after a signal before everything it started is killed
DEFAULT_GRACE = 20.0


class RunInterrupted(BaseException):
    """A stop signal arrived; ``signum`` says which. ``sent_to``: the signal reached another process
    of the run, whose work queue said so (``stop_as_told``), not this one."""

    def __init__(self, signum: int, *, sent_to: int | None = None):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.sent_to = sent_to
        told = f" (sent to process {sent_to} of the run)" if sent_to is not None else ""
        super().__init__(f"stopped by {self.name}{told}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


# ----------------------------------------------------------------------------------- processes
def _children_of() -> dict[int, list[int]]:
    """ppid -> pids of every process of this machine (Linux /proc; empty elsewhere)."""
    tree: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return tree
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int | None = None) -> list[int]:
    """Every process below ``pid`` (default: this one), children before grandchildren."""
    tree = _children_of()
    out: list[int] = []
    todo = list(tree.get(os.getpid() if pid is None else pid, ()))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(tree.get(child, ()))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is already dead
    except (OSError, IndexError):
        return False


class ChildProcesses:
    """The processes this run started: descendants now that were not there when it began."""

    def __init__(self) -> None:
        self.before = set(descendants())

    def started(self) -> list[int]:
        """The processes the run started, but multiprocessing's resource tracker: it ignores SIGTERM,
        exits by itself once this process and its children are gone, and then frees the shared
        memory they left behind, which a kill would leak."""
        tracker = _resource_tracker_pid()
        return [p for p in descendants() if p not in self.before and p != tracker]

    def stop(self, timeout: float = 3.0) -> list[int]:
        """SIGTERM to each process the run started, SIGKILL to what is left after ``timeout``
        seconds; returns the pids stopped."""
        pids = self.started()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        stubborn = [p for p in pids + self.started() if _alive(p)]
        for pid in stubborn:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return list(dict.fromkeys(pids + stubborn))


# ------------------------------------------------------------------------------------- signals
class _State:
    signum: int | None = None
    #: depth of deferred() blocks, and a signal that arrived inside one
    deferring = 0
    pending: int | None = None
    children: ChildProcesses | None = None
    #: starts the shutdown's grace (inside ``stop_on_signals``)
    start_clock: Callable[[int], None] | None = None
    #: the run was stopped by another process's word (``stop_as_told``)
    told = False


_state = _State()


def received() -> int | None:
    """The stop signal this process received, if any (inside ``stop_on_signals``)."""
    return _state.signum


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block that a stop signal does not cut short (an append of finished cases): the signal
    takes effect when the block ends."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and _state.pending is not None:
            signum, _state.pending = _state.pending, None
            raise RunInterrupted(signum)


def stop_as_told(signum: int, process: int) -> NoReturn:
    """Another process of the run (``process``) was stopped by ``signum``, and its work queue says
    so (eval/runner/work_queue.py): this process stops as if the signal had reached it (its grace
    clock starts), wherever it runs (a machine whose launcher nobody signalled would otherwise go
    on with every case left). Raised in the calling thread, the main one. The signal is not noted
    as this process's own: the launcher's own copy of it, coming next on the same machine, is then
    taken as a first signal, not as a second one that ends the process at once."""
    if _state.start_clock is not None:
        _state.start_clock(signum)
    _state.told = True
    raise RunInterrupted(signum, sent_to=process)


def _exit_as_told(signum: int, _frame: object) -> None:
    """A program stopped by another process's word, ending: the launcher's own copy of the stop,
    coming after the run's handlers were given back, ends it with 128 + the signal and no second
    line (the default action killed it, red team, stop 47: status -15)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(128 + signum)


def _force_exit(signum: int, why: str) -> None:
    """A second signal, or a shutdown past its grace: in a program, everything the run started is
    killed and the process exits at once (``entry_point.exit_now``). In a caller's process (a
    notebook, a test) the processes the run started are killed but the caller is never ended: the
    run goes on unwinding (its main thread may be stuck in the engine; killing it frees it)."""
    children = _state.children
    if is_program():
        exit_now(signum, f"chexpercept run: {why}", children, saved=" (finished cases are saved)")
    stopped = children.stop(timeout=1.0) if children is not None else []
    write_now(f"chexpercept run: {why}; stopped {len(stopped)} process(es) it started; ending the run")


def _watchdog(signum: int, grace: float, shut_down: threading.Event) -> None:
    """Kill the run ``grace`` seconds after a signal unless its ``stop_on_signals`` block has ended by
    then (a run called in-process, from a notebook or a test, returns and the process lives on)."""
    if not shut_down.wait(grace):
        _force_exit(signum, f"did not shut down within {grace:g} s of {signal.Signals(signum).name}")


@contextlib.contextmanager
def stop_on_signals(grace: float = DEFAULT_GRACE) -> Iterator[ChildProcesses]:
    """Within the block, a stop signal raises RunInterrupted (see the module docstring); yields the
    run's ChildProcesses. Outside the main thread it changes nothing; a stop signal that is ignored
    (``nohup``, ``trap '' TERM``) stays ignored; the handlers found are given back at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield ChildProcesses()
        return
    _state.signum, _state.pending, _state.deferring, _state.told = None, None, 0, False
    _state.children = ChildProcesses()
    shut_down = threading.Event()
    clock = threading.Lock()
    started: list[int] = []

    def start_clock(signum: int) -> None:
        """The shutdown's grace starts once, when the first stop signal arrives: on the signal
        watch's thread, even if the main thread is held in a C call that no signal interrupts.
        Never waits: a caller that finds another starting it (the watch's thread, or the main
        thread's own call that a second signal's handler cut into) leaves it to that one."""
        if not clock.acquire(blocking=False):
            return
        try:
            if not started:  # started first, noted after: a call cut short leaves it to the next
                threading.Thread(target=_watchdog, args=(signum, grace, shut_down), daemon=True).start()
                started.append(signum)
        finally:
            clock.release()

    def handler(signum: int, _frame: object) -> None:
        if _state.signum is not None:  # a second signal: no more waiting
            _force_exit(signum, f"{signal.Signals(signum).name} again")  # a program ends here
            if _state.deferring:  # in-process: the append being written still ends whole
                _state.pending = signum
                return
            raise RunInterrupted(signum)
        _state.signum = signum
        start_clock(signum)
        if _state.deferring:
            _state.pending = signum
            return
        raise RunInterrupted(signum)

    _state.start_clock = start_clock
    try:
        # a signal the user ignored (nohup) stays ignored; the caller's handlers come back however
        # the block ends, a stop in the middle of the change included
        with signal_watch.on_arrival(start_clock), signals_caught(handler):
            yield _state.children
    finally:
        shut_down.set()
        _state.children = None
        _state.start_clock = None
        if _state.told and is_program():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    signal.signal(signum, _exit_as_told)
        sys.stderr.flush()


@contextlib.contextmanager
def shielded_children() -> Iterator[None]:
    """Processes started inside the block from the main thread (fork or spawn) never take SIGINT or
    SIGHUP; this process still does, inside the block too. Use it around whatever starts an engine's
    processes, so that a Ctrl-C reaching the whole process group stops the run through its main
    process only (see the module docstring). The processes it starts directly also die when this
    process dies (Linux): forked ones through an at-fork hook, spawned Python ones through
    ``PARENT_VARIABLE``, which the start-up hook reads. Outside the main thread, or where the platform
    has no ``pthread_sigmask``, it changes nothing.

    The main thread holds the two signals blocked for the block's length (its children inherit the
    mask); a thread started just before, which does not block them, takes them meanwhile, and the
    interpreter runs this process's handler in the main thread as usual (at its next bytecode: an
    engine's start-up waits in short polls)."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    _start_resource_tracker()
    done = threading.Event()
    receiver = threading.Thread(target=done.wait, name="chexpercept-signals", daemon=True)
    receiver.start()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
    _Orphans.prctl = _prctl()
    named = os.environ.get(PARENT_VARIABLE)
    os.environ[PARENT_VARIABLE] = str(os.getpid())  # read by follow_parent in each child
    try:
        yield
    finally:
        if named is None:
            os.environ.pop(PARENT_VARIABLE, None)
        else:
            os.environ[PARENT_VARIABLE] = named
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        done.set()


# ------------------------------------------------------------------------------ parent death
#: Linux prctl option: the signal a process gets when the thread that forked it ends
_PR_SET_PDEATHSIG = 1
#: PARENT_VARIABLE (chexpercept/startup.py, which reads it at interpreter start-up) is set to a run's
#: pid while shielded_children starts its engine: a process whose parent it names dies with it
#: (follow_parent: a forked child at once, a spawned one as its interpreter starts)


class _Orphans:
    #: libc's prctl, looked up by shielded_children before any fork
    prctl: object = None
    #: whether the fork under way is the main thread's (the signal comes when the forking thread ends)
    from_main = False


def _prctl() -> object:
    """libc's prctl (Linux), or None; looked up before any fork: a forked child only calls it."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None


def die_with(parent: int, prctl: object = None) -> None:
    """Make this process die (SIGKILL) when ``parent``, its parent, ends, however it ends; at once if
    it already has. Nothing of an engine's is worth saving once the run's process is gone: its
    workers stop when their parent does, and the resource tracker frees their shared memory. Linux
    only (elsewhere it does nothing)."""
    prctl = prctl if callable(prctl) else _prctl()
    if not callable(prctl):
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGKILL)


def follow_parent(prctl: object = None) -> None:
    """Die with the parent when ``PARENT_VARIABLE`` names it: the processes shielded_children starts
    directly, forked or spawned. One level only: a grandchild's parent is not the one named, and
    what a child starts in turn is that child's business."""
    named = os.environ.get(PARENT_VARIABLE, "")
    if not named.isdigit():
        return
    parent = int(named)
    if parent == os.getppid():
        die_with(parent, prctl)
    elif not process_exists(parent):  # the run's process died before this one got this far (a loaded
        os.kill(os.getpid(), signal.SIGKILL)  # machine starts a spawned interpreter slowly)


def process_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (one of another account's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _note_forking_thread() -> None:
    _Orphans.from_main = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    if _Orphans.from_main:  # the signal comes when the forking thread ends: the main thread's only
        follow_parent(_Orphans.prctl)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_note_forking_thread, after_in_child=_after_fork_in_child)


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker now, before the block: CPython starts it at the first
    spawn or shared-memory block of a process and then *unblocks* SIGINT and SIGTERM in the thread
    that started it, which would undo the shield there and in every process started after it (vLLM's
    engine core creates shared memory, then forks its workers). Started here, every child reuses it
    (a forked one inherits it, a spawned one is handed it)."""
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()


def _resource_tracker_pid() -> int | None:
    """The pid of the resource tracker this process started, if it did (CPython keeps it as
    ``_resource_tracker._pid``; None where that changes)."""
    module = sys.modules.get("multiprocessing.resource_tracker")
    pid = getattr(getattr(module, "_resource_tracker", None), "_pid", None)
    return pid if isinstance(pid, int) else None
