"""The result store of one run folder: results.jsonl, run.json and the lock that guards them.

- results.jsonl gets one line per finished case. Every append is one ``write`` of whole lines under
  an exclusive ``flock`` (processes of an accelerate run share the file), then ``fsync``. A crash can
  leave at most one torn last line, which ``repair_tail`` cuts off before the next run appends.
- run.lock refuses a second run on the same folder: a ``flock`` held for the whole run (freed by the
  kernel when the holder dies, so it is never stale), the holder's pid, host and start time inside.
- run.json is replaced atomically (write to a temporary file, then rename).
Every file and folder here is created private (chexpercept/fileio.py decides how files are written).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterable, Mapping
from pathlib import Path as FsPath
from typing import Any

from chexpercept.escape import terminal
from chexpercept.eval.runner.identity import settings_diff
from chexpercept.eval.runner.interrupts import deferred, process_exists
from chexpercept.eval.runner.provenance import now
from chexpercept.fileio import (
    append_durable,
    cut_tail,
    open_private,
    private_dir,
    replace_json_lines,
    tighten,
    write_atomic,
)
from chexpercept.fileio import write_json_atomic as write_json_atomic
from chexpercept.input_files import JSON_FILE, RESULTS, json_line
from chexpercept.input_json import JsonInputError, loads
from chexpercept.input_json import read_json as read_json_file
from chexpercept.results import (
    FAILURES_NAME,
    LOCK_NAME,
    OWN_LOCKS,
    QUARANTINE_NAME,
    RESULTS_NAME,
    RUN_NAME,
    CaseFailure,
    CaseResult,
    ForeignRecordError,
    RecordFieldError,
    check_identity,
    check_record_key,
    complete_lines,
    not_a_result,
    read_typed,
)

#: parts of the identity that earlier versions recorded otherwise, and what their old value meant
RECORDED_OTHERWISE = {
    "sampling.top_p": "an API run of an earlier version recorded top_p 1.0 where it sent none, so "
    "the server's own applied; this version records that as None and sends a top_p whenever one is "
    "recorded",
    "seed": "an API run of an earlier version recorded seed 0 (or --seed) where it sent none, so the "
    "server's own randomness applied; this version records that as None and sends a seed whenever one "
    "is recorded",
}


def _made_by_another_version(previous: Mapping[str, Any]) -> bool:
    """Whether the last session of an earlier run (run.json) was made by another version of the
    toolkit than this one (its version or its commit), or does not say; a refusal then explains the
    parts that version recorded otherwise, and only then (red team, stop 44: a run of this very
    version was told an earlier version had recorded its seed)."""
    from chexpercept import __version__
    from chexpercept.eval.runner.provenance import git_commit

    sessions = previous.get("sessions") or []
    last = sessions[-1] if sessions and isinstance(sessions[-1], Mapping) else previous
    made = ((last.get("versions") or {}).get("chexpercept"), last.get("git_commit"))
    return made != (__version__, git_commit())


class RunLockedError(RuntimeError):
    """Another live run holds the folder."""


class StoreError(RuntimeError):
    """results.jsonl or run.json cannot be used as they are."""


# ----------------------------------------------------------------------------------------- lock
def _process_start(pid: int) -> str | None:
    """Start time of a process (clock ticks since boot) to tell a reused pid apart; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[19]
    except (OSError, IndexError):
        return None


class RunLock:
    """An exclusive lock on a run folder: ``flock`` on run.lock, held for the whole run.

    The kernel releases a flock when its holder dies however it dies (kill -9, a crash, a reboot), so
    there is no stale lock to judge and take over: among processes that start at once, exactly one
    gets it. The file holds the holder's pid, host and start time, for the message the others get.
    A holder that releases the lock removes the file while it still holds it; a process that locked
    the removed file (opened just before) sees that the path no longer names its file and tries again.
    """

    def __init__(self, folder: str | os.PathLike[str]):
        self.path = FsPath(folder) / LOCK_NAME
        self.held = False
        self._fd: int | None = None

    def _info(self) -> dict[str, Any]:
        pid = os.getpid()
        return {
            "pid": pid,
            "host": socket.gethostname(),
            "process_start": _process_start(pid),
            "since": now(),
        }

    def _read(self) -> dict[str, Any] | None:
        try:
            return read_json_file(self.path, limit=JSON_FILE, what=LOCK_NAME)
        except (OSError, ValueError):  # gone, or not ours to read: the message says less, nothing more
            return None

    #: seconds a busy lock is tried again before the run is refused: a reader's probe
    #: (chexpercept.results.being_written) holds a shared lock for an instant, which must not
    #: refuse a run (nor be blamed on the pid a dead run left in the file)
    PROBE_GRACE = 1.0

    def acquire(self) -> None:
        private_dir(self.path.parent)
        deadline = time.monotonic() + self.PROBE_GRACE
        tries = 0
        while tries < 8:
            fd = open_private(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                raise RunLockedError(self._locked_message(self._read())) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                current = os.stat(self.path)
                mine = os.fstat(fd)
                same = (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                same = False
            if not same:  # the holder released (and removed) it between our open and our lock
                os.close(fd)
                tries += 1
                continue
            data = json.dumps(self._info()).encode("utf-8")
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            self._fd, self.held = fd, True
            OWN_LOCKS.add((mine.st_dev, mine.st_ino))
            return
        raise RunLockedError(self._locked_message(self._read()))

    def _locked_message(self, info: Mapping[str, Any] | None) -> str:
        folder = self.path.parent
        if info:
            who = f"pid {info.get('pid')} on host {info.get('host')}, running since {info.get('since')}"
            pid = info.get("pid")
            if info.get("host") == socket.gethostname() and isinstance(pid, int) and not process_exists(pid):
                return (
                    f"{folder} is locked by a process that pid {pid} left behind (pid {pid} itself is gone; "
                    f"an engine process it started may still hold {self.path}): find it with "
                    f"'fuser -v {self.path}', stop it, and rerun to resume"
                )
        else:
            who = "a process whose lock file cannot be read"
        return (
            f"another run is writing to {folder} ({who}). Two runs on one folder would duplicate "
            "cases, so this one stops. Wait for that run to finish (the lock is freed the moment its "
            "process ends, however it ends)"
        )

    def release(self) -> None:
        if self.held and self._fd is not None:
            mine = os.fstat(self._fd)
            OWN_LOCKS.discard((mine.st_dev, mine.st_ino))
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # still holding the lock: nobody can have locked this file anew
            os.close(self._fd)
        self._fd, self.held = None, False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -------------------------------------------------------------------------------------- results
def repair_tail(results: str | os.PathLike[str]) -> int:
    """Cut off a torn last line left by a crash mid-append; returns the bytes removed. Through
    ``fileio.cut_tail``: never through a link, only a regular file of this account."""
    return len(cut_tail(results, limit=RESULTS, what="results file"))


def read_records(
    results: str | os.PathLike[str], identity: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """key_id -> record (as a dict) of every complete line; a duplicate key_id is an error, and so
    is a record of another run than ``identity`` (``chexpercept.results.run_identity``) when given."""
    path = FsPath(results)
    out: dict[str, dict[str, Any]] = {}
    first_line: dict[str, int] = {}
    if not path.exists():
        return out
    for n, line in complete_lines(path):  # a torn last line is left out (repair_tail removes it)
        try:
            record = read_typed(CaseResult, loads(line, source=f"{path}:{n}"), f"{path}:{n}")
            key = check_record_key(record)
        except JsonInputError as e:
            raise StoreError(not_a_result(path, n, e.reason)) from None
        except RecordFieldError as e:
            raise StoreError(f"not a CheXpercept case result: {e}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(not_a_result(path, n, str(e))) from e
        if key in out:
            raise StoreError(
                f"{path}: case {key} appears twice (lines {first_line[key]} and {n}); "
                "the file was edited or written by two runs at once"
            )
        out[key] = record
        first_line[key] = n
    if identity is not None:
        try:
            check_identity(path, ((first_line[k], k, r.get("run")) for k, r in out.items()), identity)
        except ForeignRecordError as e:
            raise StoreError(str(e)) from None
    return out


def case_line(case: CaseResult | CaseFailure, *, what: str | None = None) -> bytes:
    """A finished case (or failure) as the line its file holds (``input_files.json_line``:
    LineTooLong naming ``what``, by default the case, when no reader would take it)."""
    return json_line(case.to_json(), what=what or f"case {terminal(case.key_id)}")


def append_results(results: str | os.PathLike[str], cases: Iterable[CaseResult | CaseFailure]) -> None:
    """Append finished cases (or failures, to failures.jsonl) as whole lines in one locked write,
    then flush them to disk (``chexpercept.fileio.append_durable``)."""
    append_lines(results, [case_line(c) for c in cases])


def append_lines(results: str | os.PathLike[str], lines: Iterable[bytes]) -> None:
    """``append_results`` of lines already made (``case_line``)."""
    payload = b"".join(lines)
    with deferred():  # a stop signal waits until the lines are whole and on disk
        append_durable(results, payload)


def rewrite_in_order(
    results: str | os.PathLike[str], records: Mapping[str, Mapping[str, Any]], order: Mapping[str, int]
) -> None:
    """Rewrite results.jsonl from its ``records`` (read_records) sorted by bundle order (cases
    outside ``order`` last); replaced whole."""
    keys = sorted(records, key=lambda k: (order.get(k, len(order)), k))
    replace_json_lines(results, [records[k] for k in keys])


# ------------------------------------------------------------------------------------- run.json
def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    path = FsPath(path)
    if not path.exists():
        return None
    try:
        return read_json_file(path, limit=JSON_FILE, what=path.name)
    except JsonInputError as e:
        raise StoreError(f"{path} is not valid JSON ({e.reason})") from None
    except ValueError as e:  # not a regular file, too large
        raise StoreError(str(e)) from None


class RunStore:
    """Paths of one run: OUT/<model>/oracle_<setting>/."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = FsPath(path)
        self.results = self.path / RESULTS_NAME
        self.failures = self.path / FAILURES_NAME
        self.run_json = self.path / RUN_NAME
        #: lines whose run identity could not be established, kept apart and never scored
        self.quarantine = self.path / QUARANTINE_NAME
        self.lock = RunLock(self.path)

    def tighten(self) -> None:
        """Make the folder's files owner-only (a folder written by an older version under a lax umask)."""
        for path in (self.results, self.failures, self.run_json, self.quarantine):
            if path.exists():
                tighten(path)

    def append(self, lines: Iterable[bytes]) -> None:
        """Finished cases as ``case_line`` made them (each case made into its line once)."""
        append_lines(self.results, lines)

    def append_failures(self, failures: Iterable[CaseFailure]) -> None:
        append_results(self.failures, failures)

    def holds_records(self) -> bool:
        """Whether any line was ever saved here (results, failures or quarantined lines): only then do
        the settings in run.json bind a later run. A run that stopped before its first case (a package
        missing, an engine that would not start, an endpoint never reached) saved nothing that other
        settings could contradict."""
        return any(
            p.exists() and p.stat().st_size > 0 for p in (self.results, self.failures, self.quarantine)
        )

    def check_settings(self, settings: Mapping[str, Any]) -> dict[str, Any] | None:
        """The previous run.json if this folder may be resumed with ``settings`` (the run's identity,
        eval/runner/identity.py), else StoreError naming every difference. A folder that holds no
        saved line starts afresh whatever its run.json says (None): nothing in it was made under
        other settings."""
        if not self.holds_records():
            return None
        previous = read_json(self.run_json)
        if previous is None:
            if self.results.exists() and self.results.stat().st_size > 0:
                raise StoreError(
                    f"{self.results} exists but {self.run_json} does not, so the settings that made "
                    "those results are unknown; move the folder away or choose another --output-dir"
                )
            return None
        from chexpercept.run_metadata import RunMetadata

        try:  # every field of run.json read typed too (resumed, sessions, settings...), named on a bad value
            RunMetadata.from_json(previous, source=str(self.run_json))
        except ValueError as e:
            raise StoreError(f"{e}; fix or remove that field, or move the folder away") from None
        if not previous.get("settings"):
            version = (
                (previous.get("versions") or {}).get("chexpercept") if isinstance(previous, dict) else None
            )
            made = f" (chexpercept {version})" if version else ""
            raise StoreError(
                f"{self.path} holds a run made by an older version of the toolkit{made} that did not "
                f"record a run identity in {self.run_json} (the settings that can change an answer), so "
                "this run cannot check that its answers were made as this command would make them and "
                "does not continue it. Its results can still be scored as they are (chexpercept score). "
                "To run this command, use another --output-dir or --run-name, or move the folder away to "
                "start over."
            )
        before = previous.get("settings") or {}
        diffs = settings_diff(before, settings)
        if diffs:
            # a part the earlier run's version did not record (top level or nested: weights.folder),
            # said only where another version made it (the same version's absent part was not sent)
            other = _made_by_another_version(previous)
            newer = sorted(line.split(": ", 1)[0] for line in diffs if ": (absent) -> " in line and other)
            why = (
                f"\n({', '.join(newer)}: not recorded by the version that made that run; a later version "
                "added it to the identity, so those answers cannot be shown to match)"
                if newer
                else ""
            )
            why += "".join(
                f"\n({RECORDED_OTHERWISE[key]})"
                for key in sorted({line.split(": ", 1)[0] for line in diffs} & set(RECORDED_OTHERWISE))
                if other
            )
            raise StoreError(
                f"{self.path} holds a run made with other settings, so its results cannot be "
                "continued by this one (each of these can change the answers):\n  "
                + "\n  ".join(diffs)
                + why
                + "\nUse another --output-dir or --run-name, or delete the folder to start over."
            )
        return previous

    def quarantine_unverified(self, identity: Mapping[str, str]) -> int:
        """Move the lines of results.jsonl that carry no run identity (an older version's, or lines
        appended by hand) to quarantine.jsonl, so that their cases run again under this identity;
        returns how many. Lines of another identity are not touched (reading them is an error)."""
        if not self.results.exists():
            return 0
        keep: list[str] = []
        moved: list[str] = []
        for n, line in complete_lines(self.results):
            try:
                record = loads(line, source=f"{self.results}:{n}")
            except JsonInputError:
                keep.append(line)  # read_records names it
                continue
            (keep if isinstance(record, dict) and record.get("run") else moved).append(line)
        if moved:
            append_durable(self.quarantine, "".join(m + "\n" for m in moved).encode("utf-8"))
            write_atomic(self.results, "".join(k + "\n" for k in keep))  # the kept lines as they were
        return len(moved)
