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
``WAKE_SECONDS`` until a handler takes it (``WAKE_TRIES`` times at most): its wait is interrupted,
the interpreter runs the pending handlers, and the stop handler raises as usual. ``on_arrival`` lets a block act at the moment a stop
signal arrives, in this thread, even when the main thread can never be woken (a C call that retries
its wait): the run's shutdown clock starts then (eval/runner/interrupts.py), and a block that waits
in such a call ends the program at once (``entry_point.stop_at_once_while``).

The watch's socket is made once per process and never closed (a process forked from this one
starts without it): however a change of the watch is cut short (a signal whose handler raises, in a
caller's process), the interpreter never writes to a descriptor that was closed and given to a file
since. Other bytes on the socket are passed on to the descriptor that was there before (an event
loop's). Where the main thread holds ``WAKE_SIGNAL`` blocked (a parent that started the program
so), wakes do not reach it; the hooks still run.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
import time
from collections import deque
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
#: the byte a handler writes to the watch's socket: stop signals it read wait for their hooks; and
#: the byte ``disarm`` writes to end the watch's thread
_POKE = 0


class _Watch:
    #: between the watch's thread and arm / disarm / on_arrival (a handler never takes it)
    lock = threading.RLock()
    #: catch_signals calls that armed the watch and were not yet given back (a program never gives
    #: back its own: the watch lives as long as it does)
    users = 0
    #: the socket the interpreter writes each signal to: made once, never closed (see the module)
    reader: socket.socket | None = None
    writer: socket.socket | None = None
    thread: threading.Thread | None = None
    #: the wake-up descriptor there was before (-1: none), and WAKE_SIGNAL's disposition before
    previous_fd = -1
    previous_wake: object = None
    #: stop signals arrived and not yet taken by a handler in the main thread, the wakes sent for
    #: them, and when the next is due (time.monotonic)
    pending = 0
    wakes = 0
    wake_at = 0.0
    hooks: list[Hook] = []
    #: stop signals a handler read off the socket before the watch's thread did: their hooks are
    #: still to be called (on the watch's thread, never inside a handler); a deque: a handler adds
    #: and the thread takes without a lock
    unhooked: deque[int] = deque()
    stops: frozenset[int] = frozenset()


def _wake_handler(_signum: int, _frame: object) -> None:
    """WAKE_SIGNAL's handler: nothing; its arrival has interrupted the main thread's wait."""


def armed() -> bool:
    """Whether the watch runs in this process."""
    return _Watch.thread is not None


def arm(stops: tuple[int, ...]) -> None:
    """Start the watch for these stop signals (main thread only; counted: ``disarm`` once for each
    ``arm``). Call it with the stop signals blocked in the main thread (``catch_signals`` does). What
    an error or a raising handler cuts short is undone as far as it got. Where the platform has no
    ``pthread_kill`` or no ``WAKE_SIGNAL``, it does nothing."""
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
        if _Watch.writer is None:
            reader, writer = socket.socketpair()
            reader.setblocking(False)
            writer.setblocking(False)
            _Watch.reader, _Watch.writer = reader, writer
        assert _Watch.reader is not None and _Watch.writer is not None
        _drain(_Watch.reader)  # bytes of an earlier arm
        mine = _Watch.writer.fileno()
        _Watch.previous_wake = signal.getsignal(WAKE_SIGNAL)
        _Watch.pending = _Watch.wakes = 0
        _Watch.stops = frozenset(stops)
        _Watch.unhooked.clear()
        try:
            _Watch.previous_fd = -1
            _Watch.previous_fd = signal.set_wakeup_fd(mine, warn_on_full_buffer=False)
            signal.signal(WAKE_SIGNAL, _wake_handler)
            thread = threading.Thread(target=_watch, name="chexpercept-signals", daemon=True)
            # the thread takes no signal itself (it inherits this mask): one that comes while the main
            # thread holds the stop signals blocked (catch_signals changing them) waits for the main
            # thread, never finds the old disposition here
            before = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            try:
                thread.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
            _Watch.thread = thread
        except BaseException:
            _give_back_process_state(mine)
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
        thread = _Watch.thread
        if _Watch.users or thread is None or _Watch.writer is None:
            return
        _Watch.thread = None  # the thread returns at its next look
        _Watch.pending = _Watch.wakes = 0
        _Watch.unhooked.clear()
        _give_back_process_state(_Watch.writer.fileno())
        with contextlib.suppress(OSError):
            _Watch.writer.send(bytes([_POKE]))
    thread.join(timeout=1.0)


def _give_back_process_state(mine: int) -> None:
    """WAKE_SIGNAL's disposition and the wake-up descriptor as they were before ``arm`` (a
    descriptor set by another since ``arm`` stays). Every step is tried; the first error is raised
    after the last."""
    error: BaseException | None = None
    try:
        current = signal.set_wakeup_fd(_Watch.previous_fd)
        if current != mine:  # not ours any more: the one who set it keeps it
            signal.set_wakeup_fd(current)
    except BaseException as e:
        error = e
    try:
        previous = _Watch.previous_wake
        assert WAKE_SIGNAL is not None
        signal.signal(WAKE_SIGNAL, signal.SIG_DFL if previous is None else previous)  # type: ignore[arg-type]
    except BaseException as e:
        error = error or e
    _Watch.previous_fd, _Watch.stops = -1, frozenset()
    if error is not None:
        raise error


def taken() -> None:
    """A stop handler runs in the main thread: every stop signal arrived so far is taken (called by
    the handlers ``catch_signals`` installs, before the handler's own work). It takes no lock (a
    second handler may cut into it, and a handler may cut into the main thread holding one)."""
    reader, writer = _Watch.reader, _Watch.writer
    if reader is None or writer is None or _Watch.thread is None:
        return
    stops = _drain(reader)
    _Watch.pending = _Watch.wakes = 0
    if stops:
        _Watch.unhooked.extend(stops)
        with contextlib.suppress(OSError):
            writer.send(bytes([_POKE]))  # the watch's thread calls their hooks


@contextlib.contextmanager
def on_arrival(hook: Hook) -> Iterator[None]:
    """Within the block, ``hook(signum)`` is called for each stop signal as it arrives, on the
    watch's thread (never inside a handler: a second signal's handler could cut into it there). It
    must be quick and must not wait for the main thread."""
    try:
        with _Watch.lock:
            _Watch.hooks.append(hook)
        yield
    finally:
        with _Watch.lock, contextlib.suppress(ValueError):
            _Watch.hooks.remove(hook)


def _drain(reader: socket.socket) -> list[int]:
    """The stop signals waiting on the socket; every byte but the watch's own is passed on to the
    descriptor there was before (an event loop's, which the interpreter would have written them
    to). The watch's thread and a handler may both call it: each byte is read by one of them."""
    chunks = []
    while True:
        try:
            chunk = reader.recv(4096)
        except OSError:  # BlockingIOError: nothing more now
            break
        if not chunk:
            break
        chunks.append(chunk)
    data = b"".join(chunks)
    passed_on = bytes(b for b in data if b not in (WAKE_SIGNAL, _POKE))
    if passed_on and _Watch.previous_fd >= 0:
        with contextlib.suppress(OSError):
            os.write(_Watch.previous_fd, passed_on)
    return [b for b in data if b in _Watch.stops]


def _watch() -> None:
    """The watch's thread: reads each signal as it arrives, calls the hooks, and wakes the main
    thread while a stop signal waits for it: ``WAKE_SECONDS`` after its arrival, then every
    ``WAKE_SECONDS`` (whatever other signals come meanwhile), ``WAKE_TRIES`` times at most (a stop
    whose handler ran before its byte was read, or one taken by a handler that is not
    ``catch_signals``'s, would otherwise be woken for ever). Ends once ``disarm`` has taken it off."""
    me = threading.current_thread()
    main = threading.main_thread().ident
    reader = _Watch.reader
    if reader is None:
        return
    while True:
        timeout = None if _Watch.pending <= 0 else max(0.0, _Watch.wake_at - time.monotonic())
        try:
            select.select([reader], [], [], timeout)
        except (OSError, ValueError):
            return
        with _Watch.lock:
            if _Watch.thread is not me:
                return
            stops = _drain(reader)
            arrived = []
            while _Watch.unhooked:
                arrived.append(_Watch.unhooked.popleft())
            arrived += stops
            now = time.monotonic()
            if stops:
                if _Watch.pending <= 0:
                    _Watch.wakes, _Watch.wake_at = 0, now + WAKE_SECONDS
                _Watch.pending += len(stops)
            wake = _Watch.pending > 0 and now >= _Watch.wake_at
            if wake:
                _Watch.wakes += 1
                _Watch.wake_at = now + WAKE_SECONDS
                if _Watch.wakes > WAKE_TRIES:  # given up: its handler runs when the main thread
                    _Watch.pending = _Watch.wakes = 0  # next runs Python (a run's grace is running)
                    wake = False
            hooks = list(_Watch.hooks)
        for signum in arrived:
            for hook in hooks:
                hook(signum)
        if wake and main is not None and WAKE_SIGNAL is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, WAKE_SIGNAL)


def _forget_in_child() -> None:
    """A forked child: the watch and its socket are the parent's (a signal to the child would reach
    the parent's watch); the child starts without them, WAKE_SIGNAL's disposition as it was."""
    if _Watch.writer is None:
        return
    if _Watch.thread is not None:
        with contextlib.suppress(Exception):
            _give_back_process_state(_Watch.writer.fileno())
    for sock in (_Watch.reader, _Watch.writer):
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
    _Watch.thread = _Watch.reader = _Watch.writer = None
    _Watch.users, _Watch.pending, _Watch.wakes, _Watch.hooks, _Watch.unhooked = 0, 0, 0, [], deque()
    _Watch.previous_fd, _Watch.stops = -1, frozenset()
    _Watch.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
