"""What a server reports about a call (tokens, cost): a figure it did not report is unknown (None),
never 0, wherever it is recorded, summed or printed.

One call's usage (``TurnResult.usage``) holds each figure as the server reported it, or None
(``count``). A sum over calls (a case's ``usage`` in results.jsonl; a run's in run.json's
``estimate``) is known only when every call reported that figure: otherwise the sum is None and
``unreported_calls`` says how many calls lacked it (``sum_usage``). ``Total.text`` prints a sum as
``12,345``, ``at least 12,000 (2 of 40 calls unreported)`` or ``unknown`` (no call reported it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the figures of one call, in the order they are recorded (tokens, then USD)
FIGURES: tuple[str, ...] = (
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "thinking_tokens",
    "total_tokens",
    "cost_usd",
)
#: the key of a sum's map ``figure -> calls that did not report it``
UNREPORTED = "unreported_calls"


#: the most tokens one call can be said to have used (a trillion: far beyond any context window);
#: a larger count is not one
MAX_COUNT = 10**12
_ASCII_DIGITS = re.compile(r"[0-9]{1,13}")


def count(value: Any) -> int | None:
    """A token count as a server reports it: a whole number from 0 to ``MAX_COUNT`` (an integral
    float or a string of ASCII digits too); None for anything else (missing, null, negative,
    fractional, too large, not a number, digits of other scripts such as ``"²"``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = (
            int(value) if math.isfinite(value) and value.is_integer() and abs(value) <= MAX_COUNT else None
        )
    elif isinstance(value, str):
        text = value.strip()
        value = int(text) if _ASCII_DIGITS.fullmatch(text) else None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    return None


#: parts of one call that cannot exceed their whole: (part, whole)
PARTS: tuple[tuple[str, str], ...] = (
    ("cached_input_tokens", "input_tokens"),
    ("thinking_tokens", "output_tokens"),
)


def call_usage(figures: Mapping[str, int | None]) -> dict[str, int | None]:
    """One call's token counts as recorded: each read with ``count``; a part larger than its
    whole (``PARTS``: cached input over the input, thinking over the output) is a report that
    contradicts itself, so both are unknown (None) rather than a negative uncached input or cost;
    so is a total under the input and output together."""
    usage = {k: count(v) for k, v in figures.items()}
    for part, whole in PARTS:
        if usage.get(part) is not None and usage.get(whole) is not None and usage[part] > usage[whole]:  # type: ignore[operator]
            usage[part] = usage[whole] = None
    said = [usage.get("input_tokens"), usage.get("output_tokens"), usage.get("total_tokens")]
    if None not in said and said[2] < said[0] + said[1]:  # type: ignore[operator]
        usage["total_tokens"] = None  # a total under its parts: which of them is wrong is not known
    return usage


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Total:
    """A sum over calls of one figure, and how many calls did not report it."""

    #: the sum of the calls that reported it
    known: float
    #: calls in all, and those that did not report it
    calls: int
    unreported: int = 0

    @property
    def value(self) -> float | None:
        """The sum, or None when any call did not report the figure."""
        return None if self.unreported else self.known

    def text(self, *, usd: bool = False) -> str:
        """``12,345`` / ``$1.2346``; ``at least ... (2 of 40 calls unreported)``; ``unknown``."""
        if self.calls and self.unreported == self.calls:
            return "unknown"
        shown = f"${self.known:,.4f}" if usd else f"{self.known:,.0f}"
        if self.unreported:
            return f"at least {shown} ({self.unreported} of {self.calls} calls unreported)"
        return shown


def total(values: Iterable[Any]) -> Total:
    """The sum of one figure over calls (``values``: one per call, None where it was not reported)."""
    known: float = 0
    calls = unreported = 0
    for value in values:
        calls += 1
        number = _number(value)
        if number is None:
            unreported += 1
        else:
            known += number
    return Total(known, calls, unreported)


def sum_usage(usages: Sequence[Mapping[str, Any]], figures: Sequence[str] = FIGURES) -> dict[str, Any]:
    """Each figure summed over calls (``usages``: one usage dict per call): ``{figure: sum or None}``
    for the figures any call carries (a backend that never reports one leaves it out), and
    ``unreported_calls: {figure: calls}`` for those some calls did not report (absent when none)."""
    out: dict[str, Any] = {}
    unreported: dict[str, int] = {}
    for figure in figures:
        if not any(figure in u for u in usages):
            continue
        t = total(u.get(figure) for u in usages)
        out[figure] = None if t.unreported else (round(t.known, 8) if figure == "cost_usd" else t.known)
        if t.unreported:
            unreported[figure] = t.unreported
    if unreported:
        out[UNREPORTED] = unreported
    return out


def usage_line(usages: Sequence[Mapping[str, Any]], *, priced: bool) -> str:
    """What the server reported over ``usages`` (one per call) in one line, unknown figures said so:
    ``usage reported for 40 calls: input tokens 41,000 (cached 9,000); output tokens at least 1,800
    (2 of 40 calls unreported); cost $0.1234``. ``priced``: the model has a price (else its cost is
    unknown for that reason). When no call reported a token count: ``no call reported usage (40
    calls): tokens and cost unknown``; when some calls reported none: ``usage reported by 38 of 40
    calls: ...``."""
    tokens = ("input_tokens", "output_tokens", "cached_input_tokens", "thinking_tokens", "total_tokens")
    reporting = sum(any(u.get(f) is not None for f in tokens) for u in usages)
    if not reporting:
        return f"no call reported usage ({len(usages)} calls): tokens and cost unknown"
    parts = []
    for figure, label in (("input_tokens", "input tokens"), ("output_tokens", "output tokens")):
        parts.append(f"{label} {total(u.get(figure) for u in usages).text()}")
    cached = total(u.get("cached_input_tokens") for u in usages)
    parts[0] += f" (cached: {cached.text()})"
    cost = total(u.get("cost_usd") for u in usages).text(usd=True) if priced else "unknown (no price)"
    calls = f"for {len(usages)}" if reporting == len(usages) else f"by {reporting} of {len(usages)}"
    return f"usage reported {calls} calls: {'; '.join(parts)}; cost {cost}"
