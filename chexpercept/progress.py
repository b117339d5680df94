"""Progress bars of the toolkit's commands: tqdm's bar on a terminal, whole lines in a log.

A bar redraws one line with ``\\r`` and leaves it open; in a log (a pipe, a file, SLURM's output) that
is one endless line, and under ``accelerate launch`` another process's line is glued to its end
(``... 4/21 [00:02<00:10, 1.66case/s]chexpercept run: process 1 of 2: stopped by SIGTERM ...``).
Where the stream is not a terminal, each state of the bar is a line of its own, at most one every
``LOG_INTERVAL`` seconds (and the last one at the end). Every command's bar is made here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO, Any

__all__ = ["LOG_INTERVAL", "is_terminal", "progress_bar"]

#: seconds between two lines of progress in a log
LOG_INTERVAL = 30.0


class _LogLines:
    """A stream for tqdm that writes each state of the bar as a whole line."""

    def __init__(self, stream: IO[str]):
        self._stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self._stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return False


def is_terminal(stream: Any) -> bool:
    """True where ``stream`` is a terminal (False for a pipe, a file, a closed or odd stream)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def progress_bar(iterable: Iterable[Any] | None = None, **options: Any) -> Any:
    """A ``tqdm`` bar (``options`` as tqdm takes them; ``file`` defaults to stderr): drawn as tqdm
    draws it on a terminal, as whole lines at most every ``LOG_INTERVAL`` s elsewhere (with
    ``disable=None``, none at all there, as tqdm does)."""
    from tqdm.auto import tqdm

    stream = options.pop("file", None) or sys.stderr
    if not is_terminal(stream):
        options.update(file=_LogLines(stream), mininterval=LOG_INTERVAL, dynamic_ncols=False, ncols=100)
    else:
        options["file"] = stream
    return tqdm(iterable, **options)
