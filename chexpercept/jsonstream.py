"""Stream the items of a large top-level JSON object one at a time, with their byte spans.

``chexpercept.json`` is a single object keyed by key_id. Parsing it whole costs memory in
proportion to the bundle; reading it item by item (and re-reading one item later by its byte span)
keeps the loader's memory flat whatever the bundle size. Decoding is done by the json module's C
scanner, bounded in depth (``chexpercept.input_json``: a value nested too deeply raises
``JsonInputError``); this module only walks the top level. A value longer than a chunk is retried
with reads that double (``_Reader.more``): linear time whatever the longest entry (a one-line file
of one huge entry included). The file itself comes from
``chexpercept.input_files.open_input`` (a regular file within its size limit).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from .input_json import JsonInputError, loads, raw_decode

_WS = " \t\n\r"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Span:
    """Where an item's value lies in the file (bytes)."""

    start: int
    length: int


class _Reader:
    def __init__(self, f: BinaryIO, chunk: int, source: str):
        self.f = f
        self.source = source
        self.chunk = chunk
        self.buf = ""  # decoded text not yet consumed
        self.pos = 0  # position in buf
        self.base = 0  # byte offset of buf[0] in the file
        self.eof = False
        self._pending = b""  # bytes of an incomplete UTF-8 sequence
        # where buf[0] is in the file as json.loads counts: characters before it, lines before it,
        # and its column's characters before it on its line
        self.chars = 0
        self.lines = 0
        self.column = 0
        #: the key of the entry being read (None before the first)
        self.key: str | None = None

    def more(self, at_least: int = 0) -> bool:
        """Read the next chunk: ``chunk`` bytes, or ``at_least`` when more (a value being decoded
        that has not ended yet: its text so far, so that the reads double and a value of n bytes
        is tried O(log n) times, in O(n) time in all, not once per chunk in O(n^2))."""
        if self.eof:
            return False
        data = self.f.read(max(self.chunk, at_least))
        if not data:
            self.eof = True
            return False
        data = self._pending + data
        cut = len(data)
        # keep an incomplete multi-byte UTF-8 sequence for the next read
        for back in range(1, min(4, len(data)) + 1):
            b = data[-back]
            if b & 0xC0 == 0x80:
                continue
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            if need > back:
                cut = len(data) - back
            break
        self._pending = data[cut:]
        self.buf += data[:cut].decode("utf-8")
        return True

    def consume(self) -> None:
        """Drop text before pos (keeping byte accounting right)."""
        if self.pos:
            consumed = self.buf[: self.pos]
            self.base += len(consumed.encode("utf-8"))
            self.chars += len(consumed)
            newlines = consumed.count("\n")
            self.lines += newlines
            self.column = (
                len(consumed) - consumed.rfind("\n") - 1 if newlines else self.column + len(consumed)
            )
            self.buf = self.buf[self.pos :]
            self.pos = 0

    def skip_ws(self) -> None:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return

    def in_file(self, error: json.JSONDecodeError) -> json.JSONDecodeError:
        """``error`` (raised on ``buf``) with the line, column and character json.loads would give
        for the whole file, and the entry it is in (``key``): the positions counted from the entry's
        start sent a user editing chexpercept.json to the wrong place (new user, stop 45)."""
        key = self.key
        before = error.doc[: error.pos]
        newlines = before.count("\n")
        line = self.lines + newlines + 1
        column = (error.pos - before.rfind("\n")) if newlines else self.column + error.pos + 1
        where = f"{error.msg} (in the entry {key!r})" if key is not None else error.msg
        moved = json.JSONDecodeError.__new__(json.JSONDecodeError)
        ValueError.__init__(moved, f"{where}: line {line} column {column} (char {self.chars + error.pos})")
        moved.msg, moved.doc, moved.pos = where, "", self.chars + error.pos
        moved.lineno, moved.colno = line, column
        return moved

    def offset(self) -> int:
        """The byte offset in the file of ``pos``."""
        return self.base + len(self.buf[: self.pos].encode("utf-8"))

    def peek(self) -> str:
        self.skip_ws()
        return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def decode(self) -> tuple[Any, int, int]:
        """Decode one JSON value at pos; returns (value, byte_start, byte_length)."""
        while True:
            try:
                value, end = raw_decode(_DECODER, self.buf, self.pos, source=self.source)
            except json.JSONDecodeError:
                if self.more(len(self.buf) - self.pos):
                    continue
                raise
            # a number at the very end of the buffer may continue in the next chunk
            if (
                end == len(self.buf)
                and isinstance(value, int | float)
                and self.more(len(self.buf) - self.pos)
            ):
                continue
            start = self.base + len(self.buf[: self.pos].encode("utf-8"))
            length = len(self.buf[self.pos : end].encode("utf-8"))
            self.pos = end
            return value, start, length


def iter_object_items(
    f: BinaryIO, *, chunk: int = 1 << 20, source: str = "JSON"
) -> Iterator[tuple[str, Any, Span]]:
    """Yield (key, value, span) for each item of the top-level object in a binary file.

    Raises json.JSONDecodeError on malformed JSON, chexpercept.input_json.JsonInputError (naming
    ``source``) on a value nested too deeply or on what json.loads refuses around the items (a comma
    before the closing brace, anything after the object), and TypeError when the top level is not
    an object.
    """
    r = _Reader(f, chunk, source)
    first = r.peek()
    if first != "{":
        # Decode the whole value to report what it is (or the JSON error).
        value, _, _ = r.decode()
        raise TypeError(type(value).__name__)
    r.pos += 1
    try:
        yield from _items(r, source)
    except json.JSONDecodeError as e:
        raise r.in_file(e) from None


def _items(r: _Reader, source: str) -> Iterator[tuple[str, Any, Span]]:
    expect_item, items = True, 0
    while True:
        c = r.peek()
        if c == "}":
            if expect_item and items:  # json.loads refuses a trailing comma
                raise JsonInputError(
                    source, f"not valid JSON: a comma before the closing '}}' at byte {r.offset()}"
                )
            r.pos += 1
            if r.peek():  # json.loads refuses anything after the object ("Extra data"): a second
                # object appended to the file would otherwise be dropped without a word
                raise JsonInputError(
                    source,
                    f"not valid JSON: more after the top-level object ends, from byte {r.offset()} "
                    f"({r.buf[r.pos : r.pos + 40]!r})",
                )
            return
        if c == "," and not expect_item:
            r.pos += 1
            expect_item = True
            continue
        if c != '"' or not expect_item:
            raise json.JSONDecodeError("Expecting property name or '}'", r.buf, r.pos)
        key, _, _ = r.decode()
        r.key = key
        if r.peek() != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", r.buf, r.pos)
        r.pos += 1
        r.skip_ws()
        value, start, length = r.decode()
        yield key, value, Span(start, length)
        r.consume()
        expect_item, items = False, items + 1


def read_span(f: BinaryIO, span: Span, *, source: str = "JSON") -> Any:
    """Decode the value stored at a span (as returned by iter_object_items); JsonInputError naming
    ``source`` when it is not (or no longer) valid JSON of bounded depth."""
    f.seek(span.start)
    return loads(f.read(span.length), source=source)
