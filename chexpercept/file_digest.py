"""The sha256 of a file's whole content, read once and remembered: what a run's identity hashes.

The rule: the whole file counts (a fine-tune with frozen embeddings changes only the middle of its
weight file). The cost is bounded by construction:

- every file counts by its content, never by its name: a file of a Hugging Face Hub snapshot (a link
  to ``blobs/<sha256>``) is read like any other, since a blob rewritten in place, or a
  ``save_pretrained`` into a snapshot (which writes through the link), keeps its name;
- each file is read whole once; its digest is kept in a private cache file
  (``$CHEXPERCEPT_CACHE``, default ``$XDG_CACHE_HOME/chexpercept`` or ``~/.cache/chexpercept``,
  ``file-digests.json``, written through chexpercept/fileio.py; a folder or file there of another
  account is ignored with a one-line warning, since its owner would decide the run's identity) keyed by the file's device, inode,
  size, modification time and change time (ns). Rewriting a file in place changes its change time
  (which no program can set back), so a changed file is read again; an unchanged one costs a stat.

Measured (bench/RESULTS.md, ``bench/identity_cost.py``): the time to read and hash a model once
(a Hub snapshot too), then milliseconds; the bundle's images once, then a stat per image.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import warnings
from collections.abc import Iterable
from pathlib import Path as FsPath

from .fileio import owner_name, private_dir, write_json_atomic
from .input_files import JSON_FILE, WEIGHTS, open_checked, open_input
from .input_json import JsonInputError, loads

CACHE_NAME = "file-digests.json"
#: entries kept at most (the newest win): a cache of a few MB
MAX_ENTRIES = 200_000
_BLOB = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 22


def cache_dir() -> FsPath:
    """The toolkit's private cache folder (``$CHEXPERCEPT_CACHE``, else under ``$XDG_CACHE_HOME``)."""
    explicit = os.environ.get("CHEXPERCEPT_CACHE")
    if explicit:
        return FsPath(explicit).expanduser()
    return FsPath(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "chexpercept"


def _foreign(folder: FsPath) -> str | None:
    """Who owns ``folder`` when it exists and is not this account's (or is not a folder); else None."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    return None if st.st_uid == os.geteuid() else f"owned by {owner_name(st.st_uid)}"


def _foreign_fd(fd: int) -> str | None:
    st = os.fstat(fd)
    return None if st.st_uid == os.geteuid() else f"owned by {owner_name(st.st_uid)}"


def _warn_ignored(path: FsPath, why: str) -> None:
    warnings.warn(
        f"digest cache {path} is {why}, not this account's: ignored, file digests are computed afresh",
        stacklevel=3,
    )


def _key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _sha256(path: FsPath) -> str:
    h = hashlib.sha256()
    with open_input(path, WEIGHTS, what="file hashed for a run's identity") as f:  # regular, bounded
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


class DigestCache:
    """Digests of whole files keyed by (device, inode, size, mtime_ns, ctime_ns); ``save`` writes
    what was added (a lost race with another process only costs a file read again)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None):
        self.path = FsPath(folder if folder is not None else cache_dir()) / CACHE_NAME
        self.entries: dict[str, str] = {}
        self.added = 0
        self.hashed_bytes = 0
        #: False when the cache folder is another account's: it is neither read nor written
        self.usable = True
        foreign = _foreign(self.path.parent)
        if foreign:
            self.usable = False
            _warn_ignored(self.path.parent, foreign)
            return
        data = self._read()
        if isinstance(data, dict):
            self.entries = {k: v for k, v in data.items() if isinstance(v, str) and _BLOB.fullmatch(v)}

    def _read(self) -> object:
        """The cache file's JSON, or None when there is none, it is unreadable or it is not a regular
        file of this account (another account's digests would decide this run's identity)."""
        try:
            fd = open_checked(self.path, JSON_FILE, what=CACHE_NAME)  # no link, no FIFO, bounded
        except (OSError, ValueError):
            return None  # none yet, or unusable: digests are read again
        try:
            foreign = _foreign_fd(fd)
            if foreign:
                _warn_ignored(self.path, foreign)
                return None  # replaced by ours on save (our folder)
            with os.fdopen(os.dup(fd), "rb") as f:
                text = f.read(JSON_FILE.max_bytes + 1)
            return loads(text, source=self.path)
        except (OSError, ValueError, JsonInputError):
            return None
        finally:
            os.close(fd)

    def digest(self, path: str | os.PathLike[str], st: os.stat_result | None = None) -> str:
        """The sha256 (hex) of the whole file at ``path`` (links followed); ``st``: its stat
        already taken, when it is no link (a folder walk's)."""
        p = FsPath(path)
        before = st or os.stat(p)
        if not stat.S_ISREG(before.st_mode):  # a FIFO or device is never read (it could block)
            return f"not-a-regular-file:{stat.filemode(before.st_mode)}"
        key = _key(before)
        known = self.entries.get(key)
        if known:
            return known
        digest = _sha256(p)
        if _key(os.stat(p)) != key:  # written while we read: read it again next time
            return digest
        self.entries[key] = digest
        self.added += 1
        self.hashed_bytes += before.st_size
        return digest

    def save(self) -> None:
        """Write the cache if anything was added (private file, replaced whole, through fileio);
        never into a folder of another account."""
        if not self.added or not self.usable:
            return
        entries = dict(list(self.entries.items())[-MAX_ENTRIES:])
        try:
            private_dir(self.path.parent)
            write_json_atomic(self.path, entries, indent=None)
        except OSError:
            pass  # a read-only home: digests are read again next time, nothing else changes
        self.added = 0


def files_digest(
    root: str | os.PathLike[str], relatives: Iterable[str], cache: DigestCache | None = None
) -> str:
    """One sha256 over (relative path, whole-file sha256) of ``relatives`` under ``root``, sorted."""
    own = cache is None
    cache = cache or DigestCache()
    h = hashlib.sha256()
    try:
        for rel in sorted(set(relatives)):
            h.update(f"{rel}\0{cache.digest(FsPath(root) / rel)}\n".encode())
    finally:
        if own:
            cache.save()
    return "sha256:" + h.hexdigest()
