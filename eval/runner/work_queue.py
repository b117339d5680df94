"""The cases of one setting, shared by every process of a run: each takes the next case as it goes.

A run under ``accelerate launch`` splits nothing in advance. The cases left to do, in admission order
(longest routes first), are a queue in a small file of the run folder (``work-<session>.queue``):
a process that has a free slot takes the next case under an exclusive ``flock`` (a few microseconds),
so a slow process (a slower GPU, a node under load, a rank that started its engine late) simply
takes fewer cases, and no process idles while another still has a queue. A process that has no case
left and has finished its conversations says so in the same file; the main process waits for every
process's word by reading the file (never at a barrier that a slow share could time out) and signs
the run off. Each session has its own queue (a rerun starts a new one), and the main process, which
holds the run's lock, removes the files of sessions that ended.

A process holds at most its share of the cases live at once (``live_limit``: ``--batch-size``, or
the cases divided by the processes, rounded up, whichever is smaller), so the first process up cannot
take, for its first batch, the cases the others would start with; the rest goes to whichever process
frees a slot first.

The file holds one line per event, appended under the lock: ``take <process>`` for each case taken
(the case is the next in the order every process shares), ``done <process>`` when a process has
finished, ``failed <process>`` when one ended with an error, ``stopped <process> <signal>`` when a
stop signal ended one, ``ended <process>`` when one ended because another did (``beating``): every
process that ends leaves its word, and one with none was killed or still works. Its length is the
number of cases taken, so it stays small (a few KB for the release). The main process makes each
queue before the processes meet for the last time (``make_queues``); the others never make one, so
a process whose queue is gone (a rerun took the folder over) stops instead of starting the queue
over (red team, stop 47: it ran every case again into the finished run). A rerun waits for no
process of an earlier session, and refuses while one may still append (``still_working``). A line
that does not read as one of these words ends the run with QueueDamaged, naming the file and line.

Every process ends as the first that ends early does (``ended``): a failure ends the others with
ProcessFailed, a stop signal stops them as if it had reached them (interrupts.stop_as_told). On one
machine the launcher does either; a process on another machine learns it here, at its next case or
while it waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath

from chexpercept.case import Case
from chexpercept.entry_point import STOP_SIGNALS
from chexpercept.eval.runner.interrupts import RunInterrupted, stop_as_told
from chexpercept.fileio import open_private
from chexpercept.input_files import TEXT_FILE, open_input


class ProcessFailed(ValueError):
    """Another process of the run ended with an error while the main process waited for it."""


class ProcessSilent(ProcessFailed):
    """Another process of the run gave no sign of life for ``SILENT_SECONDS`` (the main process
    found it: unlike a process that stops because another said it failed, this one says so)."""


class QueueGone(ProcessFailed):
    """This process's work queue is gone: a later session of the run (a rerun) took the folder
    over, so nothing more is taken or added here."""


class QueueDamaged(ValueError):
    """A line of a work queue is not one of its words (a damaged file, a shared file system's torn
    write)."""


#: one line of a queue: (word, process, signal: for ``stopped`` only)
Event = tuple[str, int, int | None]

_WORDS = ("take", "done", "failed", "ended")


def events(data: bytes, path: FsPath) -> list[Event]:
    """The words of a queue file's ``data``, each checked: QueueDamaged names the first line that
    is none of them (never an internal error, and never a stop by a signal no process was sent)."""
    found: list[Event] = []
    for n, raw in enumerate(data.split(b"\n")[:-1], 1):  # the last piece is what follows the last newline
        words = raw.split()
        try:
            word, numbers = words[0].decode("ascii"), [_number(w) for w in words[1:]]
            if word in _WORDS and len(numbers) == 1:
                found.append((word, numbers[0], None))
                continue
            if word == "stopped" and len(numbers) == 2 and numbers[1] in STOP_SIGNALS:
                found.append((word, numbers[0], numbers[1]))
                continue
        except (IndexError, UnicodeDecodeError, ValueError):
            pass
        raise QueueDamaged(
            f"{path}: line {n} ({raw[:60]!r}) is not a word of a work queue (damaged, or written by "
            "another program): this setting cannot be finished safely; the cases saved stay, and "
            "rerunning the same command resumes (it starts a new queue)"
        )
    if data and not data.endswith(b"\n"):
        raise QueueDamaged(
            f"{path}: its last line is cut off ({data[-60:]!r}); rerunning the same command resumes"
        )
    return found


def _number(word: bytes) -> int:
    if not word.isdigit() or len(word) > 6:
        raise ValueError(word)
    return int(word)


def _named(found: Iterable[Event], word: str) -> set[int]:
    """The processes the ``word`` lines of a queue's events name."""
    return {p for w, p, _ in found if w == word}


def ended(found: Sequence[Event], process: int) -> None:
    """The one rule of an early end, read from a queue's events by every process that takes a case
    or waits (``process`` is the reader): another process's failure raises ProcessFailed naming
    every failed one; else another's stop signal stops this one too (RunInterrupted, as if the
    signal had come here). Returns when neither is said."""
    failed = _named(found, "failed")
    if failed:
        raise _ended(failed)
    for word, p, signum in found:
        if word == "stopped" and p != process and signum is not None:
            stop_as_told(signum, p)


def _ended(failed: Iterable[int]) -> ProcessFailed:
    return ProcessFailed(
        f"process(es) {', '.join(map(str, sorted(failed)))} of the run ended with an error (each says which "
        "in its own output, on its machine): this setting cannot be finished; the cases saved stay, and "
        "rerunning the same command resumes"
    )


#: a process's sign of life as the main process sees it: its file's modification and change times
#: and inode (each beat rewrites the file)
Sign = tuple[int, int, int]

#: seconds between a process's signs of life, and the silence after which the main process stops
#: waiting for it (long: a file system shared between machines may show a change late)
BEAT_SECONDS = 20.0
SILENT_SECONDS = 600.0

QUEUE_PREFIX = "work-"
QUEUE_SUFFIX = ".queue"


def queue_path(folder: FsPath, session: str) -> FsPath:
    return folder / f"{QUEUE_PREFIX}{session}{QUEUE_SUFFIX}"


def alive_path(queue: FsPath, process: int) -> FsPath:
    """The file whose changes are ``process``'s signs of life, beside ``queue``."""
    return queue.with_name(f"{queue.stem}.alive-{process}")


def beat(path: FsPath) -> None:
    """A sign of life at ``path`` (``alive_path``): the file rewritten, which ``wait_for`` sees change."""
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, f"{time.time_ns()}\n".encode())
    finally:
        os.close(fd)


class Beats:
    """The settings whose work queues ``beating`` gives signs of life beside (``finished`` takes one
    off once this process has said ``done`` there)."""

    def __init__(self, queues: Sequence[FsPath]) -> None:
        self._queues = list(queues)
        self._lock = threading.Lock()

    def finished(self, queue: FsPath) -> None:
        """This process is done in ``queue``'s setting: no more signs there, and no failure either
        (one in a later setting must not wreck a setting the others are finishing)."""
        with self._lock:
            if queue in self._queues:
                self._queues.remove(queue)

    def open(self) -> list[FsPath]:
        with self._lock:
            return list(self._queues)


@contextlib.contextmanager
def beating(queues: Sequence[FsPath], process: int) -> Iterator[Beats]:
    """Signs of life of ``process`` every ``BEAT_SECONDS``, beside each of ``queues`` (the work
    queues of every setting the run holds) that this process has not finished, from a thread of its
    own while the block runs: from before the engine loads to the end of the last setting (an engine
    step that takes minutes still beats). A process killed while its engine loads (out of memory,
    on another machine) then falls silent where the main process waits for it; before, one that had
    never beaten was waited for for ever (left alone at stop 45).

    How the block ends is said in the queue of every setting not finished, and every other process
    ends the same way there (``ended``): an error (an engine that fails to load included) as
    ``failed``, and no process takes another case; a stop signal as ``stopped`` with the signal, and
    the others stop as if it had reached them (before, a stop on machine 0 left the other machines'
    processes working through every case left: left alone at stop 46). A process that stops
    because another said it failed (ProcessFailed) or was stopped (``sent_to``) adds nothing; the
    main process that found one silent (ProcessSilent) says so, and the others stop too."""
    beats = Beats(queues)
    stop = threading.Event()

    def beat_on() -> None:
        while not stop.is_set():
            for queue in beats.open():
                with contextlib.suppress(OSError):
                    if queue.exists():  # not after the main process removed it (signed off, or a rerun)
                        beat(alive_path(queue, process))
            stop.wait(BEAT_SECONDS)

    thread = threading.Thread(target=beat_on, name="chexpercept-alive", daemon=True)
    thread.start()
    try:
        yield beats
    except (Exception, RunInterrupted) as e:  # said where it counts: see above
        said = _word_for(e)
        if said is not None:
            for queue in beats.open():
                with contextlib.suppress(OSError, QueueGone, QueueDamaged):  # the error in hand is told
                    WorkQueue(queue, (), process).said(said)
        raise
    finally:
        stop.set()
        thread.join(timeout=5)


def _word_for(error: BaseException) -> str | None:
    """The word a process whose block ``error`` ended leaves in each open queue (``beating``):
    ``ended`` when it only follows another's end (a failure or a stop said there already, which it
    does not repeat), None when its queue is gone."""
    if isinstance(error, QueueGone):
        return None
    if isinstance(error, RunInterrupted):
        return f"stopped {{process}} {error.signum}" if error.sent_to is None else "ended {process}"
    if isinstance(error, ProcessFailed) and not isinstance(error, ProcessSilent):
        return "ended {process}"
    return "failed {process}"


def make_queues(queues: Iterable[FsPath]) -> None:
    """The main process makes each setting's queue, empty, before the processes meet for the last
    time (the others then find it: they never make one)."""
    for queue in queues:
        os.close(open_private(queue, os.O_RDWR | os.O_CREAT))


#: seconds a rerun watches an earlier session's signs of life before it takes the folder
WATCH_SECONDS = BEAT_SECONDS * 1.5


def still_working(
    folder: FsPath, *, watch: float | None = None, watched: Mapping[FsPath, Sign] | None = None
) -> list[str]:
    """Main process of a new session, holding the run's lock, before it reads the results: the
    processes of earlier sessions that may still append to them (each named, with its queue). A
    process that left its word (``done``, ``failed``, ``stopped``, ``ended``) appends no more, nor
    one with no sign of life. The others' signs are watched for ``watch`` seconds (default
    ``WATCH_SECONDS``, only when there is one to watch): one that changes is working (told to stop
    by another, it stops at its next case); one that does not was killed. A sign that ``watched``
    (``watch_settings``) saw unchanged through a whole watch, and that is still the same, is not
    watched again. Before (red team, stop 47): a rerun started while machine 1 still worked took
    the folder over, and both ran the same cases into it."""
    quiet = {
        alive: (sign, whose)
        for alive, (sign, whose) in _without_a_word(folder).items()
        if watched is None or watched.get(alive) != sign
    }
    if not quiet:
        return []
    seconds = WATCH_SECONDS if watch is None else watch
    print(
        f"note: {folder}: {len(quiet)} process(es) of an earlier session of this run ended without a word in "
        f"its work queue (killed, or still working): watching their signs of life for {seconds:.0f} s before "
        "going on",
        file=sys.stderr,
    )
    return [quiet[alive][1] for alive in _changed(quiet, seconds)]


def watch_settings(folders: Sequence[FsPath], *, watch: float | None = None) -> dict[FsPath, Sign]:
    """Main process of a new session, before it takes its settings' folders one by one: the signs
    of life without a word (``still_working``) of every folder, watched together for one ``watch``;
    those that stayed the same throughout (none when one changed: each folder's own watch then
    names it). Before (stop 47, left alone): each setting paid its own watch, one after another
    (66.7 s for two settings after every process had been killed)."""
    quiet = {alive: seen for folder in folders for alive, seen in _without_a_word(folder).items()}
    if not quiet:
        return {}
    seconds = WATCH_SECONDS if watch is None else watch
    print(
        f"note: {len(quiet)} process(es) of earlier sessions of this run ended without a word in the work "
        f"queues of {', '.join(sorted({str(a.parent) for a in quiet}))} (killed, or still working): "
        f"watching their signs of life for {seconds:.0f} s before going on",
        file=sys.stderr,
    )
    return {} if _changed(quiet, seconds) else {alive: sign for alive, (sign, _whose) in quiet.items()}


def _without_a_word(folder: FsPath) -> dict[FsPath, tuple[Sign, str]]:
    """The signs of life in ``folder`` of earlier sessions' processes that left no word in their
    queue: each file -> (its sign now, whose it is)."""
    quiet: dict[FsPath, tuple[Sign, str]] = {}
    for queue in sorted(folder.glob(f"{QUEUE_PREFIX}*{QUEUE_SUFFIX}")):
        try:
            with open_input(queue, TEXT_FILE, what="work queue") as f:
                said = {p for word, p, _ in events(f.read(), queue) if word != "take"}
        except (OSError, QueueDamaged):
            said = set()
        for alive in folder.glob(f"{queue.stem}.alive-*"):
            number = alive.name.rsplit("-", 1)[1]
            if number.isdigit() and int(number) not in said and (sign := _sign_of(alive)) is not None:
                quiet[alive] = (
                    sign,
                    f"process {number} of the earlier session {queue.stem[len(QUEUE_PREFIX) :]}",
                )
    return quiet


def _changed(quiet: Mapping[FsPath, tuple[Sign, str]], seconds: float) -> list[FsPath]:
    """The signs of life of ``quiet`` that change within ``seconds`` (as soon as one does)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        changed = [alive for alive, (sign, _whose) in quiet.items() if _sign_of(alive) != sign]
        if changed:
            return changed
        time.sleep(0.5)
    return []


def _sign_of(path: FsPath) -> Sign | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def remove_queues(folder: FsPath) -> None:
    """Remove the queue files of earlier sessions (main process, holding the run's lock, once
    ``still_working`` found none working)."""
    for queue in folder.glob(f"{QUEUE_PREFIX}*{QUEUE_SUFFIX}"):
        remove_queue(queue)
    for path in folder.glob(f"{QUEUE_PREFIX}*.alive-*"):  # of a session whose queue was never made
        path.unlink(missing_ok=True)


def remove_queue(queue: FsPath) -> None:
    """Remove ``queue`` and its processes' signs of life (main process, at the setting's sign-off:
    a finished run leaves none; or a rerun's). The queue's lock is taken first: an append of an
    earlier session's process (``WorkQueue.holding``) is either whole before, or never."""
    with contextlib.suppress(QueueGone), WorkQueue(queue, (), 0).holding():
        queue.unlink()
    for path in queue.parent.glob(f"{queue.stem}.alive-*"):
        path.unlink(missing_ok=True)


@dataclass
class WorkQueue:
    """One session's queue of ``cases`` (every process passes the same list in the same order)."""

    path: FsPath
    cases: Sequence[Case]
    process: int

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The queue held (its lock) for the block, an append of finished cases: QueueGone, and the
        block never runs, once the file at the queue's path is not the one this process's session
        made (a rerun removed it, ``remove_queue``, which takes the same lock first)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            sign = _sign_of(self.path)
            if sign is None or sign[2] != os.fstat(fd).st_ino:  # removed, or another file there now
                raise self._gone()
            yield
        finally:
            os.close(fd)

    def _open(self) -> int:
        try:
            return open_private(self.path, os.O_RDWR)
        except FileNotFoundError:
            raise self._gone() from None

    def _gone(self) -> QueueGone:
        return QueueGone(
            f"this setting's work queue {self.path} is gone: a later session of the run (a rerun) has "
            "taken the folder over, so this process takes and saves nothing more there"
        )

    def _locked(self, update: Callable[[list[Event]], bytes | None]) -> list[Event]:
        """Read the whole file under an exclusive lock; append what ``update`` returns. QueueGone
        when the file is not there (``make_queues`` made it; a rerun removed it), QueueDamaged when
        a line is none of the queue's words."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            found = events(os.pread(fd, size, 0) if size else b"", self.path)
            extra = update(found)
            if extra:
                os.pwrite(fd, extra, size)
            return found
        finally:
            os.close(fd)  # closing releases the lock

    def live_limit(self, batch_size: int, processes: int) -> int:
        """Conversations this process may hold at once: ``batch_size``, or its share of the queue
        (``ceil(cases / processes)``) when that is smaller (at least 1)."""
        return max(1, min(batch_size, -(-len(self.cases) // max(processes, 1))))

    def take(self) -> Case | None:
        """The next case nobody has taken, now taken by this process; None when none is left.
        ProcessFailed when another process has said it ended with an error: the run cannot be
        finished, and no more is asked of the model (red team, stop 45: machine 1 went on sending
        paid requests for half a minute after the main process had failed). RunInterrupted when a
        stop signal ended another process (``ended``)."""
        taken: list[int] = []

        def claim(found: list[Event]) -> bytes | None:
            ended(found, self.process)  # raises, and nothing is taken, once another process ended early
            n = sum(1 for word, _, _ in found if word == "take")
            if n >= len(self.cases):
                return None
            taken.append(n)
            return f"take {self.process}\n".encode()

        self._locked(claim)
        return self.cases[taken[0]] if taken else None

    def __iter__(self) -> Iterator[Case]:
        """Cases as this process takes them (the engine asks for one whenever a slot is free)."""
        while (case := self.take()) is not None:
            yield case

    def done(self) -> None:
        """This process has taken its last case and finished every conversation."""
        self._locked(lambda found: f"done {self.process}\n".encode())

    def _sign(self, process: int) -> Sign | None:
        """The last sign of life of ``process`` (its file's times, as each beat rewrites it), None
        before its first."""
        return _sign_of(alive_path(self.path, process))

    def said(self, word: str) -> None:
        """This process ends early (``beating``): ``word`` is ``failed {process}`` (an error; its own
        output says which) or ``stopped {process} <signal>``. The main process, waiting for every
        process's word, stops instead of waiting for ever, and the others stop too (a process on
        another machine is no child of this machine's launcher, which stops only its own)."""
        self._locked(lambda found: f"{word.format(process=self.process)}\n".encode())

    def taken_by(self) -> dict[int, int]:
        """Cases each process took in this session (run.json's record of the balance)."""
        counts: dict[int, int] = {}
        for word, p, _ in self._locked(lambda found: None):
            if word == "take":
                counts[p] = counts.get(p, 0) + 1
        return counts

    def wait_for(
        self, processes: int, *, poll: float = 0.2, on_wait: Callable[[set[int], float], None] | None = None
    ) -> None:
        """Main process: wait (reading the file, never at a barrier) until every process is done.

        ``on_wait(done, seconds)`` is called now and then while some are not (a line saying who is
        still working). A stop signal interrupts the wait like any other (eval/runner/interrupts.py);
        a process that ends with an error says so here (``failed``, written by ``beating``), and the
        wait ends with ProcessFailed naming it; one killed on this machine ends the whole launch (the launcher stops the others); one that gives no sign of life for
        ``SILENT_SECONDS`` from the wait's first look (killed on another machine, out of memory
        there), never having beaten included (every process beats from before its engine loads),
        ends the wait with ProcessFailed too (red team, stop 45: the main process waited for it for
        ever). Signs are told apart by change, never by comparing another machine's clock with this
        one's."""
        start = time.monotonic()
        told = 0.0
        seen: dict[int, tuple[Sign | None, float]] = {}  # process -> (its last sign, when it changed)
        while True:
            found = self._locked(lambda found: None)  # one read of the file per look
            done = _named(found, "done")
            if len(done) >= processes:
                return
            ended(found, self.process)
            now = time.monotonic()
            for p in range(processes):
                if p in done or p == self.process:
                    continue
                sign = self._sign(p)
                if p not in seen or seen[p][0] != sign:
                    seen[p] = (sign, now)
                elif now - seen[p][1] > SILENT_SECONDS:  # never beaten: every process beats from before
                    since = "" if sign is not None else " since the run began"  # its engine loads
                    raise ProcessSilent(
                        f"process {p} of the run has given no sign of life{since} for {SILENT_SECONDS / 60:g} min "
                        "(killed, or out of memory, on its machine?): this setting cannot be finished; the "
                        "cases saved stay, and rerunning the same command resumes"
                    )
            waited = time.monotonic() - start
            if on_wait is not None and waited - told >= 60:
                on_wait(done, waited)
                told = waited
            time.sleep(poll)
