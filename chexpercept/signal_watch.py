"""Every stop signal reaches the main thread's handler within a fraction of a second, whichever
thread the kernel gave it to and whatever the main thread is waiting on.

Python runs a signal's handler in the main thread, between two bytecodes. The kernel hands a
process's signal to any one of its threads that does not block it; the interpreter's own C handler
then only notes it, and a main thread waiting in a lock, a condition, a queue or a future without a
timeout does not wake: the run took SIGTERM half a minute late, when a reply it waited for came (a
flaky test, stop 45). The same happens when the signal comes to the main thread just before it
starts to wait. Nothing of the toolkit's own waits or of a library's may be trusted to poll.

The rule, in one place: while a stop handler is installed (``entry_point.catch_signals`` arms this
watch), the interpreter writes each signal's number to a socket (``signal.set_wakeup_fd``), which a
thread of its own reads. A stop signal that no handler in the main thread has taken within
``WAKE_SECONDS`` is followed by ``WAKE_SIGNAL`` sent to the main thread alone, again every
``WAKE_SECONDS`` until a handler takes it (``WAKE_TRIES`` times at most): its wait is interrupted, the interpreter runs the pending
handlers, and the stop handler raises as usual. ``on_arrival`` lets a block act at the moment a stop
signal arrives, in this thread, even when the main thread can never be woken (a C call that retries
its wait): the run's shutdown clock starts then (eval/runner/interrupts.py), and a block that waits
in such a call ends the program at once (``entry_point.stop_at_once_while``).

A process forked from this one does not inherit the watch (its wake-up socket is this process's);
other bytes on the socket are passed on to the one that was there before (an event loop's).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
from collections.abc import Callable, Iterator

__all__ = ["WAKE_SECONDS", "WAKE_SIGNAL", "WAKE_TRIES", "arm", "armed", "disarm", "on_arrival", "taken"]

#: sent to the main thread alone to interrupt its wait (ignored by default: a late one harms nothing)
WAKE_SIGNAL: int | None = getattr(signal, "SIGURG", None)
#: seconds a stop signal may wait for the main thread's handler before the main thread is woken,
#: and between two wakes
WAKE_SECONDS = 0.1
#: wakes sent for a stop signal before the watch gives up on it (2 s)
WAKE_TRIES = 20

Hook = Callable[[int], None]
#: the byte a handler writes to the watch's own socket: stop signals it read wait for their hooks
_POKE = 0


class _Watch:
    #: reentrant: a stop handler (``taken``) may run in the main thread while it holds the lock
    lock = threading.RLock()
    #: catch_signals calls that armed the watch and were not yet given back (a program never gives
    #: back its own: the watch lives as long as it does)
    users = 0
    reader: socket.socket | None = None
    writer: socket.socket | None = None
    thread: threading.Thread | None = None
    #: the wake-up descriptor there was before (-1: none), and WAKE_SIGNAL's disposition before
    previous_fd = -1
    previous_wake: object = None
    #: stop signals arrived and not yet taken by a handler in the main thread, and the wakes sent
    #: for them so far
    pending = 0
    wakes = 0
    hooks: list[Hook] = []
    #: stop signals a handler read off the socket before the watch's thread did: its hooks are
    #: still to be called (on the watch's thread, never inside a handler)
    unhooked: list[int] = []
    stops: frozenset[int] = frozenset()


def _wake_handler(_signum: int, _frame: object) -> None:
    """WAKE_SIGNAL's handler: nothing; its arrival has interrupted the main thread's wait."""


def armed() -> bool:
    """Whether the watch runs in this process."""
    return _Watch.thread is not None


def arm(stops: tuple[int, ...]) -> None:
    """Start the watch for these stop signals (main thread only; counted: ``disarm`` once for each
    ``arm``). Call it with the stop signals blocked in the main thread (``catch_signals`` does): an
    arm cut short would leave the interpreter writing to a closed descriptor. An error undoes it.
    Where the platform has no ``pthread_kill`` or no ``WAKE_SIGNAL``, it does nothing."""
    if (
        WAKE_SIGNAL is None
        or not hasattr(signal, "pthread_kill")
        or threading.current_thread() is not threading.main_thread()
    ):
        return
    with _Watch.lock:
        if _Watch.thread is not None:
            _Watch.users += 1
            _Watch.stops = _Watch.stops | frozenset(stops)
            return
        reader, writer = socket.socketpair()
        previous_fd, previous_wake = None, None
        try:
            reader.setblocking(False)
            writer.setblocking(False)
            previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
            previous_wake = signal.signal(WAKE_SIGNAL, _wake_handler)
            thread = threading.Thread(target=_watch, args=(reader,), name="chexpercept-signals", daemon=True)
            _Watch.reader, _Watch.writer, _Watch.thread = reader, writer, thread
            _Watch.previous_fd, _Watch.previous_wake = previous_fd, previous_wake
            _Watch.pending = _Watch.wakes = 0
            _Watch.stops = frozenset(stops)
            # the thread takes no signal itself (it inherits this mask): one that comes while the main
            # thread holds the stop signals blocked (catch_signals changing them) waits for the main
            # thread, never finds the old disposition here
            before = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            try:
                thread.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
        except BaseException:
            if previous_fd is not None:
                signal.set_wakeup_fd(previous_fd)
            if previous_wake is not None:
                signal.signal(WAKE_SIGNAL, previous_wake)  # type: ignore[arg-type]
            _Watch.reader = _Watch.writer = _Watch.thread = None
            writer.close()
            reader.close()
            raise
        _Watch.users += 1


def disarm() -> None:
    """Give back one ``arm`` (with the stop signals blocked, as ``restore_signals`` does); the last
    gives WAKE_SIGNAL's disposition and the wake-up descriptor back (unless another has taken its
    place since: an event loop's, which stays) and ends the watch's thread."""
    with _Watch.lock:
        if _Watch.users == 0 or threading.current_thread() is not threading.main_thread():
            return
        _Watch.users -= 1
        if _Watch.users or _Watch.thread is None:
            return
        thread, reader, writer = _Watch.thread, _Watch.reader, _Watch.writer
        assert WAKE_SIGNAL is not None and writer is not None and reader is not None
        current = signal.set_wakeup_fd(_Watch.previous_fd)
        if current != writer.fileno():  # not ours any more: the one who set it keeps it
            signal.set_wakeup_fd(current)
        previous = _Watch.previous_wake
        signal.signal(WAKE_SIGNAL, signal.SIG_DFL if previous is None else previous)  # type: ignore[arg-type]
        _Watch.thread = _Watch.writer = _Watch.reader = None
        _Watch.pending = _Watch.wakes = 0
        _Watch.stops, _Watch.previous_fd, _Watch.unhooked = frozenset(), -1, []
    writer.close()  # the thread reads the end of the socket and returns
    thread.join(timeout=1.0)
    reader.close()


def taken() -> None:
    """A stop handler runs in the main thread: every stop signal arrived so far is taken (called by
    the handlers ``catch_signals`` installs, before the handler's own work). It never waits long:
    if the watch's lock cannot be had within a moment (its thread stopped by the interpreter's
    exit), the handler goes on without it."""
    if not _Watch.lock.acquire(timeout=0.2):
        return
    try:
        arrived = _read(_Watch.reader)
        _Watch.pending = _Watch.wakes = 0
        if arrived and _Watch.writer is not None:
            _Watch.unhooked.extend(arrived)
            with contextlib.suppress(OSError):
                _Watch.writer.send(bytes([_POKE]))  # the watch's thread calls their hooks
    finally:
        _Watch.lock.release()


@contextlib.contextmanager
def on_arrival(hook: Hook) -> Iterator[None]:
    """Within the block, ``hook(signum)`` is called for each stop signal as it arrives, on the
    watch's thread (never inside a handler: a second signal's handler could cut into it there). It
    must be quick and must not wait for the main thread."""
    with _Watch.lock:
        _Watch.hooks.append(hook)
    try:
        yield
    finally:
        with _Watch.lock, contextlib.suppress(ValueError):
            _Watch.hooks.remove(hook)


def _read(reader: socket.socket | None) -> list[int]:
    """The stop signals waiting on the socket (none if it is gone), counted as pending; every byte
    but the watch's own wakes is passed on to the descriptor there was before (an event loop's,
    which the interpreter would have written them to). Called with the lock held."""
    if reader is None:
        return []
    data = b""
    while True:
        try:
            chunk = reader.recv(4096)
        except OSError:  # BlockingIOError: nothing more now
            break
        if not chunk:
            break
        data += chunk
    passed_on = bytes(b for b in data if b not in (WAKE_SIGNAL, _POKE))
    if passed_on and _Watch.previous_fd >= 0:
        with contextlib.suppress(OSError):
            os.write(_Watch.previous_fd, passed_on)
    stops = [b for b in data if b in _Watch.stops]
    if stops and not _Watch.pending:
        _Watch.wakes = 0
    _Watch.pending += len(stops)
    return stops


def _arrived(stops: list[int]) -> None:
    if not stops:
        return
    with _Watch.lock:
        hooks = list(_Watch.hooks)
    for signum in stops:
        for hook in hooks:
            hook(signum)


def _watch(reader: socket.socket) -> None:
    """The watch's thread: reads each signal as it arrives; wakes the main thread while a stop signal
    waits for it, ``WAKE_TRIES`` times at most (a stop whose handler ran before its byte was read,
    or one taken by a handler that is not ``catch_signals``'s, would otherwise be woken for ever).
    Ends when ``disarm`` closes the socket's other end."""
    main = threading.main_thread().ident
    while True:
        with _Watch.lock:
            waiting = _Watch.pending > 0
        try:
            ready, _, _ = select.select([reader], [], [], WAKE_SECONDS if waiting else None)
        except (OSError, ValueError):
            return
        with _Watch.lock:
            if reader is not _Watch.reader:
                return
            if ready and _closed(reader):
                return
            arrived = _Watch.unhooked + _read(reader)
            _Watch.unhooked = []
            wake = not ready and _Watch.pending > 0
            if wake:
                _Watch.wakes += 1
                if _Watch.wakes > WAKE_TRIES:  # given up: its handler runs when the main thread
                    _Watch.pending = _Watch.wakes = 0  # next runs Python (a run's grace is running)
                    wake = False
        _arrived(arrived)
        if wake and main is not None and WAKE_SIGNAL is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, WAKE_SIGNAL)


def _closed(reader: socket.socket) -> bool:
    """Whether the socket's other end is closed (and nothing is left to read)."""
    try:
        return reader.recv(1, socket.MSG_PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _forget_in_child() -> None:
    """A forked child: the watch and its socket are the parent's (a signal to the child would wake
    the parent's watch); the child starts without them."""
    if _Watch.thread is None:
        return
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(_Watch.previous_fd)
    for sock in (_Watch.reader, _Watch.writer):
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
    _Watch.thread = _Watch.reader = _Watch.writer = None
    _Watch.users, _Watch.pending, _Watch.wakes, _Watch.hooks, _Watch.unhooked = 0, 0, 0, [], []
    _Watch.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
