"""Decisions on disk: one append-only JSON-lines file per annotator, ``<review dir>/decisions/<A>.jsonl``.

Each decision is one line written with a single ``write`` on an ``O_APPEND`` descriptor and ``fsync``ed
before the server answers, so an acknowledged decision survives a crash or a power cut. Annotators
never share a file; within a file, a lock (a thread lock plus ``flock`` on ``<A>.jsonl.lock``) keeps
two tabs of the same annotator from interleaving. The last decision per case wins on export. A
decision the page sends again (its answer was lost in a restart) carries the same ``client_id`` and is
not written twice, so a resent older decision never overrides a newer one.

A crash in the middle of a write can leave a torn last line (no newline). Opening the store repairs
it: the fragment moves to ``<A>.jsonl.torn`` (kept, never silently dropped) and the file is cut back to
its last complete line. That decision was never acknowledged, so the page still holds it and sends it
again.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import threading
import time
from pathlib import Path as FsPath
from typing import Any

from chexpercept.fileio import append_durable, cut_tail, open_private, private_dir
from chexpercept.input_files import RESULTS, json_line, open_input, read_input
from chexpercept.input_json import JsonInputError, loads

DECISIONS_DIR = "decisions"
DECISIONS = ("accept", "reject", "skip")
ANNOTATOR_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")

_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


class StoreError(Exception):
    """A decision file cannot be read or a decision is malformed; the message names the file."""


def _thread_lock(path: FsPath) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(str(path.resolve()), threading.Lock())


def decisions_path(review_dir: str | os.PathLike[str], annotator: str) -> FsPath:
    if not ANNOTATOR_RE.match(annotator):
        raise StoreError(f"bad annotator name {annotator!r} (letters, digits, - and _ only)")
    return FsPath(review_dir) / DECISIONS_DIR / f"{annotator}.jsonl"


def read_decisions(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete decision in a file, in order (a torn last line is ignored here; see repair)."""
    p = FsPath(path)
    if not p.exists():  # anything else by that name (a FIFO, a folder) is refused by read_input
        return []
    try:
        data = read_input(p, RESULTS, what="decisions file")
    except ValueError as e:
        raise StoreError(str(e)) from None
    lines = data.split(b"\n")
    if not data.endswith(b"\n"):
        lines = lines[:-1]  # torn tail: not a decision yet
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = loads(line, source=f"{p}, line {number}")
        except JsonInputError as e:
            raise StoreError(f"{p}, line {number}: not a JSON decision ({e.reason})") from None
        if not isinstance(record, dict) or "key_id" not in record or record.get("decision") not in DECISIONS:
            raise StoreError(f"{p}, line {number}: not a decision record")
        out.append(record)
    return out


def latest(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """key_id -> the last decision for it (the last line wins)."""
    last: dict[str, dict[str, Any]] = {}
    for record in records:
        last[record["key_id"]] = record
    return last


class DecisionStore:
    """The decision file of one annotator."""

    def __init__(self, review_dir: str | os.PathLike[str], annotator: str):
        self.annotator = annotator
        self.path = decisions_path(review_dir, annotator)
        private_dir(self.path.parent)
        self._lock = _thread_lock(self.path)
        self.repaired: bytes | None = None
        #: client_id -> stored record, for the bytes of the file read so far (see _known)
        self._by_client: dict[str, dict[str, Any]] = {}
        self._read_to = 0
        with self._locked():
            self._repair()

    # ------------------------------------------------------------------------------------- locking
    class _Both:
        def __init__(self, store: DecisionStore):
            self.store = store
            self.fd = -1

        def __enter__(self):
            self.store._lock.acquire()
            try:
                self.fd = open_private(f"{self.store.path}.lock", os.O_WRONLY | os.O_CREAT)
                fcntl.flock(self.fd, fcntl.LOCK_EX)
            except BaseException:
                self.store._lock.release()
                raise
            return self

        def __exit__(self, *exc: object) -> None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
            finally:
                self.store._lock.release()

    def _locked(self) -> DecisionStore._Both:
        return DecisionStore._Both(self)

    # -------------------------------------------------------------------------------------- repair
    def _repair(self) -> None:
        if not self.path.exists():
            return
        try:
            data = read_input(self.path, RESULTS, what="decisions file")
        except ValueError as e:
            raise StoreError(str(e)) from None
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        fragment = data[cut:]
        append_durable(self.path.with_name(self.path.name + ".torn"), fragment + b"\n")
        cut_tail(self.path, limit=RESULTS, what="decisions file")  # never through a link
        self.repaired = fragment

    # ------------------------------------------------------------------------------- read / write
    def records(self) -> list[dict[str, Any]]:
        return read_decisions(self.path)

    def latest(self) -> dict[str, dict[str, Any]]:
        return latest(self.records())

    def _known(self, client_id: str) -> dict[str, Any] | None:
        """The stored record with this client_id, if any (call with the lock held; reads only what
        was appended since the last call, by any process)."""
        size = self.path.stat().st_size if self.path.exists() else 0
        if size < self._read_to:  # cut back by a repair: read again
            self._by_client, self._read_to = {}, 0
        if size > self._read_to:
            with open_input(self.path, RESULTS, what="decisions file") as f:
                f.seek(self._read_to)
                data = f.read(size - self._read_to)
            end = data.rfind(b"\n") + 1
            for line in data[:end].split(b"\n"):
                try:
                    record = loads(line, source=self.path) if line.strip() else None
                except JsonInputError:
                    continue  # read_decisions names it; dedup only needs the good lines
                if isinstance(record, dict) and isinstance(record.get("client_id"), str):
                    self._by_client[record["client_id"]] = record
            self._read_to += end
        return self._by_client.get(client_id)

    def append(self, key_id: str, decision: str, note: str = "", **extra: Any) -> dict[str, Any]:
        """Write one decision durably (fsync) and return the stored record; a decision whose
        ``client_id`` is already stored is not written again (its stored record is returned)."""
        if decision not in DECISIONS:
            raise StoreError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
        if not isinstance(key_id, str) or not key_id:
            raise StoreError("a decision needs a key_id")
        record = {
            "key_id": key_id,
            "annotator": self.annotator,
            "decision": decision,
            "note": str(note or ""),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **extra,
        }
        line = json_line(
            json.dumps(record, ensure_ascii=False, sort_keys=True), what=f"the decision on {key_id}"
        )
        client_id = extra.get("client_id")
        with self._locked():
            self._repair()  # a torn line left by another process that crashed
            if isinstance(client_id, str) and client_id:
                known = self._known(client_id)
                if known is not None:
                    return known
            append_durable(self.path, line)
        return record
