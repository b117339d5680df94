"""Bounded JSON decoding: the one way the toolkit decodes JSON it did not write itself.

JSON from a bundle, a run folder, the review store, a source tree, a model folder, a server or the Hub
may be hostile. Python's parser recurses once per nesting level, so a document nested 200,000 levels
deep ends in a ``RecursionError`` traceback instead of an error naming the file. Every such decode
goes through ``loads`` (or ``read_json``, which reads the file through ``chexpercept.input_files``
first: a regular file within its size limit), which

- bounds the size: a text longer than its ``Limit`` is refused before it is parsed;
- bounds the depth: nesting deeper than ``MAX_DEPTH`` levels is refused (the parser's own recursion
  limit is turned into this error however deep the document goes; real files nest fewer than 10);
- names the source in every error: ``JsonInputError`` (a ``ValueError``) with ``source`` (the file,
  or what the text is, e.g. "the reply of http://127.0.0.1:8000/v1/chat/completions") and ``reason``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from .input_files import JSON_FILE, Limit, read_input

#: the deepest nesting decoded (levels of objects and arrays); deeper is refused
MAX_DEPTH = 100


class JsonInputError(ValueError):
    """JSON that cannot be used: too large, nested too deeply, not valid JSON, or not UTF-8.

    ``source`` names where it came from, ``reason`` says what is wrong (without the source), ``kind``
    is ``"invalid"`` (not JSON, not UTF-8: perhaps cut off), ``"too_deep"`` or ``"too_large"``."""

    def __init__(self, source: object, reason: str, kind: str = "invalid"):
        self.source = str(source)
        self.reason = reason
        self.kind = kind
        super().__init__(f"{self.source}: {reason}")


def too_deep(source: object) -> JsonInputError:
    """The error for JSON nested deeper than MAX_DEPTH levels."""
    return JsonInputError(
        source,
        f"JSON nested more than {MAX_DEPTH} levels deep: refused (CheXpercept's files nest fewer than 10)",
        "too_deep",
    )


def depth(value: Any, *, stop: int = MAX_DEPTH) -> int:
    """How deeply ``value`` (decoded JSON) nests objects and arrays (0 for a scalar), counted up to
    ``stop + 1``; level by level, so it never recurses however deep ``value`` goes."""
    level = [value] if type(value) in (dict, list) else []
    levels = 0
    while level and levels <= stop:
        levels += 1
        below = []
        for container in level:
            for x in container.values() if type(container) is dict else container:
                if type(x) is dict or type(x) is list:
                    below.append(x)
        level = below
    return levels


def _may_be_deep(text: str | bytes) -> bool:
    """Whether ``text`` holds more than MAX_DEPTH brackets at all (else it cannot nest deeper)."""
    if isinstance(text, str):
        return text.count("[") + text.count("{") > MAX_DEPTH
    return text.count(b"[") + text.count(b"{") > MAX_DEPTH


def loads(
    text: str | bytes,
    *,
    source: object,
    limit: Limit | None = None,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """``json.loads(text)`` bounded in size (``limit``) and depth (MAX_DEPTH); JsonInputError naming
    ``source`` otherwise. Errors raised by ``object_pairs_hook`` pass through unchanged."""
    if limit is not None and len(text) > limit.max_bytes:
        raise JsonInputError(
            source, f"{len(text)} bytes of JSON, over the limit of {limit.describe()}", "too_large"
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonInputError(source, f"not UTF-8 text (byte {e.start}: {e.reason})") from None
    try:
        value = json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError:
        raise too_deep(source) from None
    except json.JSONDecodeError as e:
        raise JsonInputError(source, f"not valid JSON: {e}") from None
    if _may_be_deep(text) and depth(value) > MAX_DEPTH:
        raise too_deep(source)
    if _LONE_SURROGATE.search(text):
        value = _replace_lone_surrogates(value)
    return value


#: a JSON escape of a UTF-16 surrogate (\ud800 to \udfff): half of a character, or all of one
#: pair's halves; json.loads keeps a lone one in the string, which then cannot be written as UTF-8
_LONE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _replace_lone_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD, as invalid
    UTF-8 bytes are: a server's reply holding ``"\udcff"`` ended the whole run when its answer was
    written (red team, stop 43). A pair of escapes is one character already and stays."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_replace_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_replace_lone_surrogates(k): _replace_lone_surrogates(v) for k, v in value.items()}
    return value


def raw_decode(decoder: json.JSONDecoder, text: str, pos: int, *, source: object = "JSON") -> tuple[Any, int]:
    """``decoder.raw_decode(text, pos)`` with the depth bound of ``loads`` (for readers that walk a
    large document item by item, chexpercept.jsonstream); json.JSONDecodeError passes through (a
    streaming reader may need more text)."""
    try:
        value, end = decoder.raw_decode(text, pos)
    except RecursionError:
        raise too_deep(source) from None
    if isinstance(value, (dict, list)) and _may_be_deep(text[pos:end]) and depth(value) > MAX_DEPTH:
        raise too_deep(source)
    if _LONE_SURROGATE.search(text, pos, end):  # as loads: text that can be written again
        value = _replace_lone_surrogates(value)
    return value, end


def read_json(
    path: str | os.PathLike[str],
    *,
    limit: Limit = JSON_FILE,
    what: str = "JSON file",
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """The JSON document in the regular file ``path`` (chexpercept.input_files: a FIFO, a device or a
    file over ``limit`` is refused unread), bounded in depth; errors name the file."""
    data = read_input(path, limit, what=what)
    return loads(data, source=os.fspath(path), object_pairs_hook=object_pairs_hook)
