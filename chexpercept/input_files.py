"""Bounded reads of input files: the one way the toolkit opens a file it did not just write itself.

A bundle, a source tree, a run folder or a model folder may have been tampered with, and on a shared
server a FIFO, a device or a huge file can stand where a file is expected: a FIFO blocks a reader
forever, ``/dev/zero`` never ends. Every reader of such a file (images, ``chexpercept.json``, masks,
``SHA256SUMS.txt``, review data, source tables, results and run.json files...) goes through
``open_input`` / ``read_input`` / ``read_input_text``, which

1. refuse anything that is not a regular file (a FIFO, a character or block device, a socket, a
   folder) *before reading a byte*: the file is opened with ``O_NONBLOCK`` (so opening a FIFO does not
   wait for a writer) and judged by ``fstat`` of the opened descriptor (so nothing can be swapped in
   between the check and the read);
2. refuse a file larger than the limit of its kind (``Limit``; the table is ``LIMITS``), before
   reading it, and never read more than the limit (a file that grows while it is read is refused too).

A refusal is ``InputFileError`` (a ``ContainmentError``, so a ``ValueError``), naming the file, what it
is or how large, and the limit by name; a missing or unreadable file is the usual ``OSError``.
``check_input_stat`` applies the same rule to a ``stat`` result, for code that hands a path to an
engine that opens it itself (vLLM, the datasets library). ``iter_lines`` streams a file of lines
(results.jsonl, failures.jsonl): one line in memory at a time, each at most ``MAX_LINE`` bytes, in time
linear in the file's size.

Cost: one ``open``, one ``fstat`` and one ``fcntl`` per file, as a plain ``open`` costs.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import ContainmentError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limit:
    """The most bytes one kind of input file may hold."""

    #: the constant's name in this module (named in refusals and in docs/data-protection.md)
    name: str
    #: what such a file is, for messages ("image", "run.json", ...)
    kind: str
    max_bytes: int

    def describe(self) -> str:
        return f"{_size(self.max_bytes)} for a {self.kind} (chexpercept.input_files.{self.name})"


#: a bundle image, a source CXR, a lesion or anatomy mask, a review overlay (a 16-bit 4k x 4k PNG is 32 MiB)
IMAGE = Limit("IMAGE", "image or mask", 256 * MiB)
#: chexpercept.json (read entry by entry; the release's is about 30 MB) and the files SHA256SUMS.txt lists
BUNDLE_JSON = Limit("BUNDLE_JSON", "chexpercept.json or a file listed in SHA256SUMS.txt", 4 * GiB)
#: run.json, review.json, access.json, a model's config.json, work records: small JSON documents
JSON_FILE = Limit("JSON_FILE", "JSON document", 256 * MiB)
#: results.jsonl, failures.jsonl, the reference's all_results.json, review decisions (conversations
#: with long reasoning: the largest files a run writes)
RESULTS = Limit("RESULTS", "results or decisions file", 8 * GiB)
#: SHA256SUMS.txt, a card template, a source's annotation JSON
TEXT_FILE = Limit("TEXT_FILE", "text file", 64 * MiB)
#: generation sources read as a whole or in streams: the MIMIC-ILS JSON, CSV tables (CheXmask,
#: MIMIC-CXR metadata, review sheets; read row by row)
SOURCE_TABLE = Limit("SOURCE_TABLE", "source table", 64 * GiB)

#: one reply body of an API server (the openai backend; a long reasoning reply is about 100 KB)
REPLY = Limit("REPLY", "server reply", 64 * MiB)
#: a local model folder's small files read whole for its fingerprint (config, tokenizer, chat
#: template, code: a large tokenizer.json is about 30 MB)
MODEL_FILE = Limit("MODEL_FILE", "model configuration, tokenizer or code file", 1 * GiB)
#: a local model's weight file (or any file a run's identity hashes whole, chexpercept/file_digest.py)
WEIGHTS = Limit("WEIGHTS", "model weight file", 4096 * GiB)

LIMITS: tuple[Limit, ...] = (
    IMAGE, BUNDLE_JSON, JSON_FILE, RESULTS, TEXT_FILE, SOURCE_TABLE, REPLY, MODEL_FILE, WEIGHTS,
)  # fmt: skip
#: the longest line ``iter_lines`` reads (one results.jsonl record with a long reasoning reply and
#: its conversation is about 1 MB)
MAX_LINE = 64 * MiB

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
)


def file_kind(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO (named pipe)", "a folder", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_checked(path: str | os.PathLike[str], limit: Limit, *, what: str = "file") -> int:
    """A read-only descriptor of ``path``, opened non-blocking and never through a link, after
    checking it is a regular file within ``limit`` (InputFileError naming the file and what it is
    otherwise): for a lock or an input that is probed, not streamed (``open_input`` streams). A FIFO
    in its place is refused at once, never waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputFileError(path, "is a link: refused (read only as a file of its own)", what) from None
        raise
    try:
        check_input_stat(path, os.fstat(fd), limit, what=what)
    except BaseException:
        os.close(fd)
        raise
    return fd


class InputFileError(ContainmentError):
    """An input file refused before it was read: not a regular file, or over its size limit.

    ``path`` is the file, ``reason`` the refusal without the path (for messages that name the file
    their own way, e.g. a bundle problem line)."""

    def __init__(self, path: str | os.PathLike[str], reason: str, what: str = "file"):
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{what} {self.path!r} {reason}")


def _size(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


class LineTooLong(ValueError):
    """A JSON-lines record longer than ``MAX_LINE``: never written, since no reader would take it."""


def json_line(text: str, *, what: str) -> bytes:
    """``text`` (one JSON record, no newline in it) and its newline as UTF-8, for a JSON-lines file
    that ``iter_lines`` reads back: every writer of such a file goes through it, so that nothing is
    written that its reader refuses (red team, stop 45: a server's 60 MB replies made a results line
    of 1 GB, and the run could then neither resume nor be scored). LineTooLong naming ``what`` (the
    case) when the record is over ``MAX_LINE``."""
    data = text.encode("utf-8")
    if len(data) > MAX_LINE:
        raise LineTooLong(
            f"{what}: its record is {_size(len(data))}, over the {_size(MAX_LINE)} a line of a results file "
            "may hold: not written"
        )
    return data + b"\n"


def stat_problem(st: os.stat_result, limit: Limit) -> str | None:
    """Why a file with this ``stat`` may not be read as ``limit``'s kind, or None (rules 1 and 2)."""
    mode = st.st_mode
    if not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file: refused (only regular files are read)"
    if st.st_size > limit.max_bytes:
        return f"is {_size(st.st_size)}, over the limit of {limit.describe()}: refused unread"
    return None


def check_input_stat(
    path: str | os.PathLike[str], st: os.stat_result, limit: Limit, *, what: str = "file"
) -> None:
    """InputFileError when ``st`` (the ``stat`` of ``path``) is not a regular file within ``limit``."""
    problem = stat_problem(st, limit)
    if problem:
        raise InputFileError(path, problem, what)


def _grew(path: str, limit: Limit, what: str) -> InputFileError:
    return InputFileError(path, f"grew past the limit of {limit.describe()} while it was read", what)


class _CappedFile(io.FileIO):
    """A regular file whose reads stop one byte past the limit, and refuse (a file that grew)."""

    def __init__(self, fd: int, path: str, limit: Limit, what: str):
        super().__init__(fd, "rb", closefd=True)
        self.name = path
        self._limit, self._what = limit, what

    def _room(self) -> int:
        room = self._limit.max_bytes + 1 - self.tell()
        if room <= 0:
            raise _grew(self.name, self._limit, self._what)
        return room

    def _after(self) -> None:
        if self.tell() > self._limit.max_bytes:
            raise _grew(self.name, self._limit, self._what)

    def readinto(self, b: Any) -> int:
        room = self._room()
        with memoryview(b) as view:
            n = super().readinto(view[:room] if len(view) > room else view)
        self._after()
        return n or 0

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        data = super().read(min(size, self._room()))
        self._after()
        return data or b""

    def readall(self) -> bytes:
        first = self.read(max(0, os.fstat(self.fileno()).st_size - self.tell()) + 1)
        if not first:
            return b""
        chunks = [first]
        while chunk := self.read(1 << 20):
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _open_fd(path: str | os.PathLike[str], limit: Limit, what: str, follow_links: bool = True) -> _CappedFile:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        check_input_stat(path, os.fstat(fd), limit, what=what)
        # a regular file (checked just now) reads the same with O_NONBLOCK: it is left set, which saves
        # two system calls per file
        return _CappedFile(fd, os.fspath(path), limit, what)
    except BaseException:
        os.close(fd)
        raise


def open_input(path: str | os.PathLike[str], limit: Limit, *, what: str = "file") -> io.BufferedReader:
    """The regular file ``path`` opened for binary reading, after ``fstat`` found it a regular file of
    at most ``limit.max_bytes`` (InputFileError otherwise; FileNotFoundError and other OSError as
    ``open`` raises them). Opening never blocks (``O_NONBLOCK``: a FIFO is refused, not waited on).
    Use as a context manager; reading past the limit (a file that grows) raises InputFileError."""
    return io.BufferedReader(_open_fd(path, limit, what), buffer_size=1 << 16)


def read_input(
    path: str | os.PathLike[str], limit: Limit, *, what: str = "file", follow_links: bool = True
) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit.max_bytes``; see ``open_input``);
    ``follow_links=False``: a link at ``path`` itself is refused (OSError ELOOP)."""
    with _open_fd(path, limit, what, follow_links) as f:
        return f.readall()


def read_input_text(path: str | os.PathLike[str], limit: Limit, *, what: str = "file") -> str:
    """The UTF-8 text of the regular file ``path`` (see ``open_input``); InputFileError when it is not
    UTF-8 (naming the byte offset)."""
    data = read_input(path, limit, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(path, f"is not UTF-8 text (byte {e.start}: {e.reason})", what) from None


def iter_lines(
    path: str | os.PathLike[str], limit: Limit, *, what: str = "file", max_line: int = MAX_LINE
) -> Iterator[tuple[int, str]]:
    """(line number, text without its newline) of every line of the regular file ``path`` (see
    ``open_input``) that ends in a newline, streamed: one line in memory at a time, in time linear in
    the file's size. Text after the last newline (a line torn by a crash mid-write) is not yielded.
    InputFileError naming the line when a line is longer than ``max_line`` bytes or not UTF-8."""
    with open_input(path, limit, what=what) as f:
        n = 0
        while raw := f.readline(max_line + 1):
            n += 1
            if not raw.endswith(b"\n"):
                if len(raw) > max_line:
                    raise InputFileError(
                        path, f"has a line longer than {_size(max_line)} (line {n}): refused", what
                    )
                return  # torn last line
            try:
                yield n, raw[:-1].decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputFileError(path, f"is not UTF-8 text (line {n}, byte {e.start})", what) from None
