"""The result store of one run folder: results.jsonl, run.json and the lock that guards them.

- results.jsonl gets one line per finished case. Every append is one ``write`` of whole lines under
  an exclusive ``flock`` (processes of an accelerate run share the file), then ``fsync``. A crash can
  leave at most one torn last line, which ``repair_tail`` cuts off before the next run appends.
- run.lock (pid, host, process start time) refuses a second run on the same folder; a lock whose
  process is gone (kill -9, reboot) is recognised as stale and taken over.
- run.json is replaced atomically (write to a temporary file, then rename).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path as FsPath
from typing import Any

from chexpercept.results import FAILURES_NAME, RESULTS_NAME, RUN_NAME, CaseFailure, CaseResult, complete_lines

from .provenance import now

LOCK_NAME = "run.lock"


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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive, pid-stamped lock file in a run folder."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.path = FsPath(folder) / LOCK_NAME
        self.held = False

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
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def is_stale(self, info: Mapping[str, Any] | None) -> bool:
        """True when the holder is certainly gone: same host and its pid is dead or reused."""
        if not info or info.get("host") != socket.gethostname():
            return False
        pid = info.get("pid")
        if not isinstance(pid, int):
            return False
        if not _alive(pid):
            return True
        started = info.get("process_start")
        return started is not None and _process_start(pid) not in (None, started)

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{LOCK_NAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._info()), encoding="utf-8")
        try:
            for _ in range(2):
                try:
                    self._create(tmp)
                    self.held = True
                    return
                except FileExistsError:
                    info = self._read()
                    if self.is_stale(info):
                        with contextlib.suppress(FileNotFoundError):
                            self.path.unlink()
                        continue
                    raise RunLockedError(self._locked_message(info)) from None
            raise RunLockedError(self._locked_message(self._read()))
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _create(self, prepared: FsPath) -> None:
        """Create the lock file with its content, failing with FileExistsError if it exists."""
        try:
            os.link(prepared, self.path)  # atomic, and never visible half-written
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(prepared.read_text(encoding="utf-8"))

    def _locked_message(self, info: Mapping[str, Any] | None) -> str:
        folder = self.path.parent
        if info:
            who = f"pid {info.get('pid')} on host {info.get('host')}, running since {info.get('since')}"
        else:
            who = "a process whose lock file cannot be read"
        return (
            f"another run is writing to {folder} ({who}). Two runs on one folder would duplicate "
            f"cases, so this one stops. Wait for that run to finish, or, if it is certainly dead "
            f"(e.g. it ran on another machine), delete {self.path} and rerun to resume."
        )

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# -------------------------------------------------------------------------------------- results
def _same_setting(key: str, before: Any, now_: Any) -> bool:
    """A resumed run's setting equals the stored one (a model folder however spelled: relative or
    absolute, with or without a trailing slash)."""
    if key == "model_id":
        from .registry import same_model_id

        return same_model_id(before, now_)
    return before == now_


def repair_tail(results: str | os.PathLike[str]) -> int:
    """Cut off a torn last line left by a crash mid-append; returns the bytes removed."""
    path = FsPath(results)
    if not path.exists():
        return 0
    with open(path, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return 0
            keep = 0
            block = 1 << 16
            pos = size
            while pos > 0:
                start = max(0, pos - block)
                f.seek(start)
                chunk = f.read(pos - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                pos = start
            f.truncate(keep)
            os.fsync(f.fileno())
            return size - keep
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_records(results: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """key_id -> record (as a dict) of every complete line; a duplicate key_id is an error."""
    path = FsPath(results)
    out: dict[str, dict[str, Any]] = {}
    first_line: dict[str, int] = {}
    if not path.exists():
        return out
    for n, line in complete_lines(path):  # a torn last line is left out (repair_tail removes it)
        try:
            record = json.loads(line)
            key = record["key_id"]
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path}:{n}: not a CheXpercept case result ({e})") from e
        if key in out:
            raise StoreError(
                f"{path}: case {key} appears twice (lines {first_line[key]} and {n}); "
                "the file was edited or written by two runs at once"
            )
        out[key] = record
        first_line[key] = n
    return out


def append_results(results: str | os.PathLike[str], cases: Iterable[CaseResult | CaseFailure]) -> None:
    """Append finished cases (or failures, to failures.jsonl) as whole lines in one locked write,
    then flush them to disk."""
    payload = "".join(c.to_json() + "\n" for c in cases).encode("utf-8")
    if not payload:
        return
    fd = os.open(results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def rewrite_in_order(
    results: str | os.PathLike[str], records: Mapping[str, Mapping[str, Any]], order: Mapping[str, int]
) -> None:
    """Rewrite results.jsonl from its ``records`` (read_records) sorted by bundle order (cases
    outside ``order`` last); atomic."""
    path = FsPath(results)
    keys = sorted(records, key=lambda k: (order.get(k, len(order)), k))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for k in keys:
            f.write(json.dumps(records[k], ensure_ascii=False, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------- run.json
def write_json_atomic(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    path = FsPath(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    path = FsPath(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise StoreError(f"{path} is not valid JSON ({e})") from e


class RunStore:
    """Paths of one run: OUT/<model>/oracle_<setting>/."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = FsPath(path)
        self.results = self.path / RESULTS_NAME
        self.failures = self.path / FAILURES_NAME
        self.run_json = self.path / RUN_NAME
        self.lock = RunLock(self.path)

    def check_settings(self, settings: Mapping[str, Any]) -> dict[str, Any] | None:
        """The previous run.json if this folder may be resumed with ``settings``, else StoreError."""
        previous = read_json(self.run_json)
        if previous is None:
            if self.results.exists() and self.results.stat().st_size > 0:
                raise StoreError(
                    f"{self.results} exists but {self.run_json} does not, so the settings that made "
                    "those results are unknown; move the folder away or choose another --output-dir"
                )
            return None
        before = previous.get("settings", {})
        diffs = [
            f"{k}: {before.get(k)!r} -> {settings.get(k)!r}"
            for k in sorted(set(before) | set(settings))
            if not _same_setting(k, before.get(k), settings.get(k))
        ]
        if diffs:
            raise StoreError(
                f"{self.path} holds a run made with other settings, so its results cannot be "
                "continued by this one:\n  "
                + "\n  ".join(diffs)
                + "\nUse another --output-dir or --run-name, or delete the folder to start over."
            )
        return previous
