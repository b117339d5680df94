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
stop signal ended one (``beating``). Its length is the number of cases taken, so it stays small (a
few KB for the release).

Every process ends as the first that ends early does (``ended``): a failure ends the others with
ProcessFailed, a stop signal stops them as if it had reached them (interrupts.stop_as_told). On one
machine the launcher does either; a process on another machine learns it here, at its next case or
while it waits.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath

from chexpercept.case import Case
from chexpercept.eval.runner.interrupts import RunInterrupted, stop_as_told
from chexpercept.fileio import open_private


class ProcessFailed(ValueError):
    """Another process of the run ended with an error while the main process waited for it."""


class ProcessSilent(ProcessFailed):
    """Another process of the run gave no sign of life for ``SILENT_SECONDS`` (the main process
    found it: unlike a process that stops because another said it failed, this one says so)."""


def _named(data: bytes, event: str) -> set[int]:
    """The processes a queue file's lines of ``event`` (``done``, ``failed``, ``stopped``) name."""
    return {int(line.split()[1]) for line in data.decode().splitlines() if line.startswith(f"{event} ")}


def ended(data: bytes, process: int) -> None:
    """The one rule of an early end, read from a queue file's ``data`` by every process that takes
    a case or waits (``process`` is the reader): another process's failure raises ProcessFailed
    naming every failed one; else another's stop signal stops this one too (RunInterrupted, as
    if the signal had come here). Returns when neither is said."""
    failed = _named(data, "failed")
    if failed:
        raise _ended(failed)
    for line in data.decode().splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "stopped" and int(words[1]) != process:
            stop_as_told(int(words[2]), int(words[1]))


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
                    beat(alive_path(queue, process))
            stop.wait(BEAT_SECONDS)

    thread = threading.Thread(target=beat_on, name="chexpercept-alive", daemon=True)
    thread.start()
    try:
        yield beats
    except (Exception, RunInterrupted) as e:  # said where it counts: see above
        said = _end_of(e)
        if said is not None:
            for queue in beats.open():
                with contextlib.suppress(OSError):
                    WorkQueue(queue, (), process).said(said)
        raise
    finally:
        stop.set()
        thread.join(timeout=5)


def _end_of(error: BaseException) -> str | None:
    """The word a process whose block ``error`` ended leaves in each open queue (``beating``), or
    None when it only follows another's (a failure or a stop said there already)."""
    if isinstance(error, RunInterrupted):
        return f"stopped {{process}} {error.signum}" if error.sent_to is None else None
    if isinstance(error, ProcessFailed) and not isinstance(error, ProcessSilent):
        return None
    return "failed {process}"


def remove_queues(folder: FsPath) -> None:
    """Remove the queue files of earlier sessions (main process, holding the run's lock)."""
    for pattern in (f"{QUEUE_PREFIX}*{QUEUE_SUFFIX}", f"{QUEUE_PREFIX}*.alive-*"):
        for path in folder.glob(pattern):
            path.unlink(missing_ok=True)


@dataclass
class WorkQueue:
    """One session's queue of ``cases`` (every process passes the same list in the same order)."""

    path: FsPath
    cases: Sequence[Case]
    process: int

    def _locked(self, update: Callable[[bytes], bytes | None]) -> bytes:
        """Read the whole file under an exclusive lock; append what ``update`` returns."""
        fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
            extra = update(data)
            if extra:
                os.pwrite(fd, extra, size)
            return data
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

        def claim(data: bytes) -> bytes | None:
            ended(data, self.process)  # raises, and nothing is taken, once another process ended early
            n = data.count(b"take ")
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
        self._locked(lambda data: f"done {self.process}\n".encode())

    def _sign(self, process: int) -> Sign | None:
        """The last sign of life of ``process`` (its file's times, as each beat rewrites it), None
        before its first."""
        try:
            st = os.stat(alive_path(self.path, process))
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ctime_ns, st.st_ino

    def said(self, word: str) -> None:
        """This process ends early (``beating``): ``word`` is ``failed {process}`` (an error; its own
        output says which) or ``stopped {process} <signal>``. The main process, waiting for every
        process's word, stops instead of waiting for ever, and the others stop too (a process on
        another machine is no child of this machine's launcher, which stops only its own)."""
        self._locked(lambda data: f"{word.format(process=self.process)}\n".encode())

    def taken_by(self) -> dict[int, int]:
        """Cases each process took in this session (run.json's record of the balance)."""
        data = self._locked(lambda data: None)
        counts: dict[int, int] = {}
        for line in data.decode().splitlines():
            if line.startswith("take "):
                p = int(line.split()[1])
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
            data = self._locked(lambda data: None)  # one read of the file per look
            done = _named(data, "done")
            if len(done) >= processes:
                return
            ended(data, self.process)
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
