"""How long an API client waits before it retries: the server's hint, read against the server's own
clock, and the policy that bounds what one request waits.

A server says how long to wait in one of several forms (``read_wait_hint``): ``retry-after-ms``
(OpenAI, Azure), ``Retry-After`` in seconds or as an HTTP date, Google's ``RetryInfo.retryDelay``
in the error body, and on a 429 the ``x-ratelimit-reset-*`` headers (durations such as ``6m0s``,
or, from some gateways, absolute epoch times). A date or an epoch time is measured against the
server's clock, its ``Date`` header, never this machine's: a local clock two minutes ahead would
otherwise read every such hint as "now" and burn the retries in a fraction of a second, and one
behind would wait minutes too long. Values that are no wait (negative, not a number, infinite,
garbage) are ignored, as if the server had given no hint; ``x-ratelimit-reset-*`` describe the
rate-limit window, so they count only on a 429 (and not for a limit whose ``remaining`` is left).

``RetryPolicy.next_wait`` decides:

* the rule for every wait: **never below the backoff's floor for that attempt; a hint only
  lengthens it** (up to ``longest_hint``, 10 min). A hint of no wait (``Retry-After: 0``, a date at
  or before the server's ``Date``, ``x-ratelimit-reset-requests: 0s``, ``retry-after-ms: 1``) is
  not an immediate retry: seven of those took 0.4 s and stopped a run. A longer hint is honoured as
  given, never cut short (retrying before the server is ready only burns retries);
* a longer hint is not waited out: the request fails at once (``--on-error`` decides what becomes
  of the run) with a message naming the wait asked for, what asked for it and the time, on this
  machine's clock, to rerun after; ``ServerPause`` then keeps the backend from sending anything
  else before that time;
* without a hint: exponential backoff from ``base_delay`` up to ``max_delay``, with jitter;
* one request stops after ``max_retries`` retries, or when its next wait would take its waiting past
  ``budget`` (30 min) in all;
* a wait the server asked for that lasts a minute or more is said on stderr (``WaitNotices``).

A wait is an ``asyncio.sleep`` on the backend's event loop, so a stop signal ends it at once.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

#: a bare number at least this large is an epoch time (seconds; 1e9 is 2001-09-09), not a duration;
#: at least EPOCH_MS, an epoch time in milliseconds
EPOCH_SECONDS = 1e9
EPOCH_MS = 1e12

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
#: the rate-limit windows OpenAI and gateways report, and the header saying what is left of each
_RESETS = (
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests"),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
    ("x-ratelimit-reset", "x-ratelimit-remaining"),
)


def parse_duration(text: str) -> float | None:
    """Seconds of a duration as APIs write them: ``"37s"``, ``"1.5s"``, ``"6m0s"``, ``"20ms"``,
    ``"1h2m3s"``, or a bare number of seconds; None when it is not one (or not finite)."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    return value if math.isfinite(value) else None


def duration_text(seconds: float) -> str:
    """``45 s``, ``6 min``, ``6 min 30 s``, ``1 h 5 min``, ``3 d 4 h``; ``more than 100 years``."""
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds > 100 * 365 * 86400:
        return "more than 100 years"
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    if days:
        return f"{days} d {h} h" if h else f"{days} d"
    if hours:
        return f"{hours} h {m} min" if m else f"{hours} h"
    return f"{m} min {s} s" if s else f"{m} min"


def local_time(epoch: float) -> str:
    """An epoch time on this machine's clock and time zone: ``2026-12-02 15:04:05 CET``."""
    try:
        return datetime.datetime.fromtimestamp(epoch).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, OSError, ValueError):
        return "a time too far ahead to write down"


@dataclass(frozen=True)
class WaitHint:
    """A wait a server asked for, measured from when its reply arrived."""

    #: seconds to wait, from ``received`` (>= 0)
    seconds: float
    #: the header or field that asked for it, as sent: ``Retry-After: 3600``
    source: str
    #: this machine's clock (``time.time()``) when the reply arrived
    received: float
    #: this machine's clock minus the server's (its ``Date`` header), seconds; None without one
    skew: float | None = None

    @property
    def until(self) -> float:
        """When the wait ends, on this machine's clock."""
        return self.received + self.seconds

    def asked(self) -> str:
        """``the server asked to wait 1 h 0 min (Retry-After: 3600)``."""
        return f"the server asked to wait {duration_text(self.seconds)} ({self.source})"

    def describe(self) -> str:
        """``asked()``, then until when on this machine's clock (and how far it is off the server's)."""
        clock = ""
        if self.skew is not None and abs(self.skew) >= 2:
            way = "ahead of" if self.skew > 0 else "behind"
            clock = f"; this machine's clock is {duration_text(abs(self.skew))} {way} the server's"
        return f"{self.asked()}, until {local_time(self.until)} on this machine's clock{clock}"


def _wait_value(text: str) -> float | None:
    """A wait in seconds: a finite number >= 0, else None (negative, inf, nan, garbage)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _http_date(text: str) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    try:
        return when.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def error_objects(body: str) -> list[dict[str, Any]]:
    """The ``error`` objects of a JSON error body: an object, or a list of them (Google's
    OpenAI-compatible endpoint wraps its error in a list); empty when the body is something else."""
    from chexpercept.input_files import REPLY
    from chexpercept.input_json import JsonInputError, loads

    try:
        data = loads(body, source="error body", limit=REPLY)
    except JsonInputError:
        return []
    items = data if isinstance(data, list) else [data]
    errors = [item.get("error") for item in items if isinstance(item, dict)]
    return [e for e in errors if isinstance(e, dict)]


def _retry_info(body: str) -> tuple[float, str] | None:
    """Google's ``RetryInfo.retryDelay`` in a JSON error body (Gemini, Vertex)."""
    for error in error_objects(body):
        for detail in error.get("details") or []:
            if isinstance(detail, dict) and "retryDelay" in detail:
                delay = parse_duration(str(detail["retryDelay"]))
                if delay is not None and delay >= 0:
                    return delay, f"retryDelay: {detail['retryDelay']}"
    return None


def _reset(text: str, clock: float) -> float | None:
    """Seconds until an ``x-ratelimit-reset-*`` value: a duration, or an epoch time (seconds or
    milliseconds) on the server's ``clock``."""
    value = parse_duration(text)
    if value is None or value < 0:
        return None
    if value >= EPOCH_MS:
        value /= 1000.0
    if value >= EPOCH_SECONDS:
        value -= clock
    return value if value >= 0 else None


def read_wait_hint(
    headers: Any, body: str = "", *, status: int | None = None, received: float | None = None
) -> WaitHint | None:
    """The wait a reply asks for (see the module's docstring), or None without a usable hint.

    ``headers``: the reply's headers (any mapping; names in any case); ``body``: its text;
    ``status``: its HTTP status (``x-ratelimit-reset-*`` count on a 429 only; None: not known);
    ``received``: this machine's clock when it arrived (default: now).
    """
    received = time.time() if received is None else received
    lowered = {str(k).lower(): str(v) for k, v in headers.items()} if headers is not None else {}
    server_now = _http_date(lowered["date"]) if "date" in lowered else None
    skew = None if server_now is None else received - server_now
    clock = received if server_now is None else server_now  # the server's "now"

    def hint(seconds: float, source: str) -> WaitHint:
        return WaitHint(max(seconds, 0.0), source, received, skew)

    if "retry-after-ms" in lowered:
        ms = _wait_value(lowered["retry-after-ms"])
        if ms is not None:
            return hint(ms / 1000.0, f"retry-after-ms: {lowered['retry-after-ms']}")
    if "retry-after" in lowered:
        text = lowered["retry-after"]
        seconds = _wait_value(text)
        if seconds is None:
            when = _http_date(text)
            if when is not None:
                seconds = when - clock
                # a past date with no Date header to measure it by: this clock may be the wrong one
                if seconds < 0 and server_now is None:
                    seconds = None
        if seconds is not None:
            return hint(seconds, f"Retry-After: {text}")
    delay = _retry_info(body) if body else None
    if delay is not None:
        return hint(*delay)
    if status not in (None, 429):
        return None
    resets = []
    for reset_name, remaining_name in _RESETS:
        if reset_name not in lowered:
            continue
        left = _wait_value(lowered.get(remaining_name, ""))
        if left is not None and left > 0:
            continue  # that limit is not the one hit
        seconds = _reset(lowered[reset_name], clock)
        if seconds is not None:
            resets.append((seconds, f"{reset_name}: {lowered[reset_name]}"))
    return hint(*max(resets)) if resets else None


def retry_hint(headers: Any, body: str = "", *, now: float | None = None) -> float | None:
    """Seconds ``read_wait_hint`` finds (None without a hint), for callers that need only those."""
    found = read_wait_hint(headers, body, received=now)
    return None if found is None else found.seconds


@dataclass
class RetryPolicy:
    """What one request waits before its retries (see the module's docstring)."""

    max_retries: int = 6
    #: own backoff without a hint: the first wait in seconds, doubled per retry up to max_delay,
    #: with +-25% jitter
    base_delay: float = 2.0
    max_delay: float = 120.0
    #: the longest wait a server may ask for that is waited out; a longer one fails the request
    longest_hint: float = 600.0
    #: the most seconds one request spends waiting between its attempts, in all
    budget: float = 1800.0
    #: a server's wait at least this long is said on stderr while it is waited out (``WaitNotices``)
    notice_after: float = 60.0

    def too_long(self, hint: WaitHint | None) -> bool:
        """Whether the server asked for a wait longer than a run takes (``longest_hint``)."""
        return hint is not None and hint.seconds > self.longest_hint

    def backoff(self, attempt: int) -> float:
        """The wait before retry ``attempt + 1`` without a hint from the server."""
        wait = min(self.base_delay * 2**attempt, self.max_delay)
        return wait * random.uniform(0.75, 1.25)

    def floor(self, attempt: int) -> float:
        """The shortest wait before retry ``attempt + 1``, whatever the server said: the low end of
        ``backoff(attempt)``'s jitter."""
        return min(self.base_delay * 2**attempt, self.max_delay) * 0.75

    def next_wait(self, attempt: int, waited: float, hint: WaitHint | None) -> tuple[float | None, str]:
        """(seconds to wait before retry ``attempt + 1``, "") or (None, why it is not retried).
        ``attempt``: attempts made so far minus one; ``waited``: seconds this request has waited.
        The one place a wait is decided: the own backoff, which a hint only lengthens."""
        if hint is not None and self.too_long(hint):
            return None, (
                f"{hint.describe()}; a run waits at most {duration_text(self.longest_hint)} for one "
                f"retry, so this request was not retried: rerun after {local_time(hint.until)}"
            )
        if attempt >= self.max_retries:
            return None, f"gave up after {attempt + 1} attempts"
        wait = self.backoff(attempt)  # never less than floor(attempt)
        if hint is not None:
            wait = max(wait, hint.seconds)
        if waited + wait > self.budget:
            return None, (
                f"gave up after {attempt + 1} attempts and {duration_text(waited)} of waiting: one more "
                f"wait of {duration_text(wait)} would pass the {duration_text(self.budget)} a request may "
                "wait in all"
            )
        return wait, ""


class WaitNotices:
    """Says on stderr that the run waits because the server asked it to (a run that is quiet for
    minutes looks hung), once for the requests that got the same hint."""

    #: a new notice only for a wait that ends this much later than the last one said
    APART = 60.0

    def __init__(self) -> None:
        self.until = float("-inf")

    def say(self, hint: WaitHint) -> None:
        if hint.until <= self.until + self.APART:
            return
        self.until = hint.until
        print(
            f"note: {hint.describe()}; waiting (Ctrl-C stops the run, and the same command resumes it)",
            file=sys.stderr,
            flush=True,
        )


class ServerPause:
    """After a server asked for a wait too long to take, nothing more is sent before it ends: every
    request until then fails at once with the same message (no pointless request, no retry)."""

    def __init__(self) -> None:
        self.hint: WaitHint | None = None

    def hold(self, hint: WaitHint) -> None:
        if self.hint is None or hint.until > self.hint.until:
            self.hint = hint

    def reason(self, now: float | None = None) -> str | None:
        """Why a request must not be sent now, or None when it may be."""
        current = time.time() if now is None else now
        if self.hint is None or current >= self.hint.until:
            return None
        return (
            f"not sent: {self.hint.describe()} (a run does not wait that long); rerun after "
            f"{local_time(self.hint.until)}"
        )
