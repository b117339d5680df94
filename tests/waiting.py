"""``wait_until``: poll a condition instead of sleeping a fixed time before checking it."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.05) -> bool:
    """True as soon as ``condition()`` is true, False when ``timeout`` seconds pass first (checked a
    last time then): processes that were told to stop take a moment to be reaped."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return bool(condition())
        time.sleep(interval)
    return True
