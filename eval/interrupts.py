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
  run started (vLLM's engine core and workers included) is killed and the process exits at once.

Child processes are told apart from those that were there before the run (``ChildProcesses``), so a
run started from a test or a notebook never kills processes it did not start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

#: signals that stop a run
STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, n, None) for n in ("SIGTERM", "SIGINT", "SIGHUP")) if s is not None
)
#: seconds a run may take to shut down after a signal before everything it started is killed
DEFAULT_GRACE = 20.0


class RunInterrupted(BaseException):
    """A stop signal arrived; ``signum`` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

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
        return [p for p in descendants() if p not in self.before]

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


def _force_exit(signum: int, why: str) -> None:
    children = _state.children
    stopped = children.stop(timeout=1.0) if children is not None else []
    note = f"; stopped {len(stopped)} process(es) it started" if stopped else ""
    os.write(2, f"chexpercept run: {why}{note}; exiting now (finished cases are saved)\n".encode())
    os._exit(128 + signum)


def _watchdog(signum: int, grace: float) -> None:
    time.sleep(grace)
    _force_exit(signum, f"did not shut down within {grace:g} s of {signal.Signals(signum).name}")


@contextlib.contextmanager
def stop_on_signals(grace: float = DEFAULT_GRACE) -> Iterator[ChildProcesses]:
    """Within the block, a stop signal raises RunInterrupted (see the module docstring); yields the
    run's ChildProcesses. Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield ChildProcesses()
        return
    _state.signum, _state.pending, _state.deferring = None, None, 0
    _state.children = ChildProcesses()

    def handler(signum: int, _frame: object) -> None:
        if _state.signum is not None:  # a second signal: no more waiting
            _force_exit(signum, f"{signal.Signals(signum).name} again")
        _state.signum = signum
        threading.Thread(target=_watchdog, args=(signum, grace), daemon=True).start()
        if _state.deferring:
            _state.pending = signum
            return
        raise RunInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield _state.children
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        _state.children = None
        sys.stderr.flush()
