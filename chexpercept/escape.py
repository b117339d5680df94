"""Escapers: untrusted text made inert for the medium it is written to.

Text read from a bundle, a results file, a model's reply, a server or the Hub may hold control
characters (``ESC]0;title BEL``, ``ESC[2J`` clear the screen), a newline followed by a line that looks
like ours (``OK: 0 problems``), markdown that breaks a table or pulls in an image, or a CSV cell that a
spreadsheet runs as a formula. Whatever writes such text goes through one of these:

- ``terminal(text)``: for a terminal or a log line. Every character that is not printable (C0 and C1
  controls including ESC, BEL, CR and the newline, DEL, Unicode line and paragraph separators, bidi
  overrides and other invisible format characters, unassigned code points) is shown as its escape
  (``\\x1b``, ``\\n``, ``\\u202e``), so the text stays on its line and changes nothing on the screen.
- ``terminal_lines(text)``: for a message of several lines of our own: the same, except that the
  newline stays (each value quoted into such a message must already have gone through ``terminal``;
  the error classes do that for their fields, e.g. ``chexpercept.errors.Problem``).
- ``markdown_cell(text)``: for a cell of a markdown table: ``terminal``, then ``\\``, ``|``, ``<``,
  ``>``, ``[``, ``]``, ````` and ``*`` escaped with a backslash (no table break, no HTML, no link or
  image, no code, no ``*`` emphasis; ``_`` stays: key_ids and model ids hold it, and GitHub-flavoured
  markdown does not emphasise inside words).
- ``csv_cell(value)``: for a CSV cell: ``terminal`` for text, and text that a spreadsheet would take
  for a formula (starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return, and not a
  number) gets a leading ``'`` (OWASP's advice).

HTML is escaped by the report's page builder (``html.escape`` on every value it writes; the case viewer
sets text with ``textContent``), so no HTML escaper lives here.

Secrets are hidden too: ``terminal`` and ``terminal_lines`` pass the text through
``chexpercept.redaction.redact_text`` first (a URL's userinfo and key parameters, ``api_key=...``,
``Authorization: Bearer ...``), so every message that quotes a URL, a path, a name read from disk or a
server's error body shows it on one line, inert and without its secret, by going through them.

Cost: one regular-expression search for a secret word, then one ``str.isprintable`` call; printable
text without secrets (the normal case) is returned as it is.
"""

from __future__ import annotations

import re

from .redaction import redact_text

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_MARKDOWN = re.compile(r"([\\|<>\[\]`*])")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?%?")


def _escape_char(ch: str) -> str:
    named = _NAMED.get(ch)
    if named:
        return named
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def terminal(text: object) -> str:
    """``str(text)`` with every non-printable character (newlines and ESC included) shown as its
    escape (see the module docstring): one line that writes only what it shows."""
    s = redact_text(text if isinstance(text, str) else str(text))
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else _escape_char(c) for c in s)


def shown(text: object, limit: int, *, one_line: bool = False) -> str:
    """At most ``limit`` characters of outside text (a server's error body, an engine's message, a
    value read from a file), shown with ``terminal``: redacted whole *before* it is cut, so that a
    secret cut in two never shows its first part (red team, stop 45: 20 characters of an API key
    passed a 500-character cut), then cut (``...`` where it was). ``one_line``: runs of whitespace
    made one space first."""
    s = redact_text(text if isinstance(text, str) else str(text))
    if one_line:
        s = " ".join(s.split())
    if len(s) > limit:
        s = s[: max(0, limit - 3)] + "..."
    return terminal(s)


def shell_word(value: object) -> str:
    """``value`` as one word of a command printed for the user to paste into a POSIX shell: quoted
    where the shell would split or expand it (``shlex.quote``: a path with a space, ``&``, ``$`` or a
    quote), then ``terminal`` (one line that writes only what it shows). Every value that a printed
    command names goes through it (tests/test_escaping.py holds the commands to it)."""
    import shlex

    return terminal(shlex.quote(str(value)))


def terminal_lines(text: object) -> str:
    """``terminal`` for each line of ``text``, the newlines between them kept (for our own messages
    of several lines; values quoted into them must have gone through ``terminal`` already)."""
    s = redact_text(text if isinstance(text, str) else str(text))
    if s.isprintable():
        return s
    return "\n".join(terminal(line) for line in s.split("\n"))


def markdown_cell(text: object) -> str:
    """``text`` for one cell of a markdown table: ``terminal``, then markdown's active characters
    escaped with a backslash (see the module docstring)."""
    return _MARKDOWN.sub(r"\\\1", terminal(text))


def csv_cell(value: object) -> object:
    """``value`` for one CSV cell: numbers and None as they are; text through ``terminal``, with a
    leading ``'`` when a spreadsheet would run it as a formula (and it is not a number)."""
    if value is None or isinstance(value, (int, float)):
        return value
    s = terminal(value)
    if s.startswith(_FORMULA_START) and not _NUMBER.fullmatch(s):
        return "'" + s
    return s
