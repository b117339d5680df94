"""The numbers an upload may carry: each checked against a declared range, here and nowhere else.

A number published to the Hub (a staged JSON or YAML value, a cell of a card's table, a count in a
note) is a *field* of ``RANGES``: a finite int or float (never a bool) within the field's bounds, an
integer where the field is a count. A run.json or a command line could otherwise carry anything in a
number: ``10**4000`` is 4,001 digits of free text, ``true`` is not a count. The bounds are wide
enough for every real run and narrow enough to carry nothing (the guard's identifier search still
reads each number: ``identifiers.Identifiers.find_number``).

``number_problem(value, field)`` says what is wrong, ``check_number(value, field)`` raises
``NumberRefused`` naming the field and its range; the guard's ``Number(field)`` spec and every stager
that writes a number into text (the scores card, the ``.eval_results`` notes) call them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .names import NameRefused


class NumberRefused(NameRefused):
    """A number that would be published is not within its field's declared range."""


@dataclass(frozen=True)
class Range:
    """The values a published number may take: ``low`` to ``high`` inclusive; ``integer``: a count."""

    low: float
    high: float
    integer: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        return f"{kind} from {self.low:g} to {self.high:g}"


_COUNT = Range(0, 10**7, integer=True)
#: every field a published number may be, and its range
RANGES: dict[str, Range] = {
    # decoding settings (run.json's sampling, the card's models table, the notes)
    "temperature": Range(0, 100),
    "top_p": Range(0, 1),
    "max_tokens": Range(0, 10**7, integer=True),
    "seed": Range(0, 2**63 - 1, integer=True),
    # counts of a run
    "n_cases": _COUNT,
    "per_cell": _COUNT,
    "limit": _COUNT,
    "n_selected": _COUNT,
    "n_results": _COUNT,
    "unfinished_cases": _COUNT,
    "batch_size": Range(1, 10**6, integer=True),
    "num_processes": Range(1, 10**5, integer=True),
    "size_bytes": Range(0, 2**53, integer=True),
    # scores
    "fraction": Range(0, 1),
    "depth": Range(0, 10),  # stages reached (columns.py: depth/<path>)
    "interval_bound": Range(-1, 20),
    "percent": Range(0, 100),
    "level": Range(0, 1),
    "n_resamples": Range(0, 10**7, integer=True),
}


def number_problem(value: object, field: str) -> str | None:
    """Why ``value`` may not be published as the number ``field`` (``RANGES``), or None."""
    rng = RANGES[field]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected {rng.describe()}, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected {rng.describe()}, got a number that is not finite"
    if rng.integer and not isinstance(value, int):
        return f"expected {rng.describe()}, got a fraction"
    if not rng.low <= value <= rng.high:
        shown = str(value) if abs(value) < 10**20 else f"a number of {int(math.log10(abs(value))) + 1} digits"
        return f"expected {rng.describe()}, got {shown}"
    return None


def check_number(value: object, field: str, what: str | None = None) -> object:
    """``value`` when it may be published as ``field``; NumberRefused naming ``what`` (default: the
    field) and the range otherwise."""
    problem = number_problem(value, field)
    if problem:
        raise NumberRefused(f"refusing to publish {what or field}: {problem}")
    return value
