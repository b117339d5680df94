"""Images prepared ahead of need on worker threads, once per image, within a memory budget.

A backend turns every image a request carries into what its engine takes: vLLM the decoded pixels,
an API the data URL. Done on the thread that feeds the engine, that work is on the run's critical
path (decoding a 1024x1024 PNG takes longer than an iteration of a small model, and the engine
waits meanwhile). ``ImagePrefetch`` prepares images on worker threads (PIL's decoder, hashing and
file reads release the GIL) in the order they are wanted: first the images of requests handed over
(``want``: needed now, first come first served), then hints (``want(..., hint=True)``: images the
next turns will carry), and hands each over when asked (``get``: waits for it, or prepares it in the
caller's thread when no worker has started it, so a caller never waits on the budget).

Memory is bounded whatever the run's size and live conversations: the prepared images held stay
within ``budget`` bytes, give or take one image per worker and per caller being prepared. A worker
waits for room before it prepares the next needed image, making room first by dropping images that
are only kept for reuse (``keep=True`` of ``get``, least recently used first) or that were hints and
never asked for; hints are prepared only while half the budget is free. ``drop``/``release`` let go
of the images of ended conversations.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Held(Generic[T]):
    value: T
    size: int
    #: handed over at least once and kept for reuse (may be dropped for room)
    used: bool = False
    #: prepared on a hint and not asked for yet (may be dropped for room)
    hinted: bool = False


class ImagePrefetch(Generic[T]):
    """Images (paths relative to the release) prepared by ``prepare`` on ``workers`` threads.

    ``size(prepared)``: the bytes it holds. The threads start with the first ``want`` and end with
    ``close``.
    """

    def __init__(
        self,
        prepare: Callable[[str], T],
        size: Callable[[T], int],
        *,
        budget: int,
        workers: int,
        name: str = "chexpercept-images",
    ):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.prepare = prepare
        self.size = size
        self.budget = budget
        self.workers = workers
        self.name = name
        self._cond = threading.Condition()
        self._held: OrderedDict[str, _Held[T]] = OrderedDict()
        self._needed: deque[str] = deque()
        self._hints: deque[str] = deque()
        #: being prepared (by a worker or by a caller of get)
        self._running: set[str] = set()
        self._errors: dict[str, BaseException] = {}
        self._threads: list[threading.Thread] = []
        self._closed = False
        self.held_bytes = 0
        self.most_held_bytes = 0
        #: prepared by a worker / by the caller of get (no worker had started it) / handed over again
        self.prepared = 0
        self.inline = 0
        self.reused = 0
        self.dropped_for_room = 0
        #: seconds callers of get waited for a worker to finish an image
        self.waited = 0.0

    # ------------------------------------------------------------------ asking
    def want(self, relatives: Iterable[str], *, hint: bool = False) -> None:
        """Prepare these images, in this order: needed now, or (``hint``) when there is room."""
        with self._cond:
            queue = self._hints if hint else self._needed
            for relative in relatives:
                if not hint:
                    self._errors.pop(relative, None)
                if relative in self._held or relative in self._running:
                    continue
                if not hint and relative in self._hints:
                    self._hints.remove(relative)
                elif relative in self._needed or relative in self._hints:
                    continue
                queue.append(relative)
            if not self._threads and (self._needed or self._hints):
                self._start()
            self._cond.notify_all()

    def get(self, relative: str, *, keep: bool = False) -> T:
        """The prepared image: waits for a worker that is preparing it, else prepares it here.
        ``keep``: hold it for reuse (within the budget); otherwise it is let go. Raises what
        preparing it raised."""
        started = time.perf_counter()
        with self._cond:
            while True:
                held = self._held.get(relative)
                if held is not None:
                    if held.used:
                        self.reused += 1
                    self._release_or_keep(relative, held, keep)
                    self.waited += time.perf_counter() - started
                    return held.value
                if relative in self._errors:
                    raise self._errors.pop(relative)
                if relative not in self._running:
                    break
                self._cond.wait()
            for queue in (self._needed, self._hints):
                if relative in queue:
                    queue.remove(relative)
            self._running.add(relative)
        try:
            value = self.prepare(relative)
        finally:
            with self._cond:
                self._running.discard(relative)
                self._cond.notify_all()
        with self._cond:
            self.inline += 1
            if keep:
                self._store(relative, _Held(value, self.size(value), used=True))
        return value

    def drop(self, relatives: Iterable[str]) -> None:
        """Let go of these images (prepared or wanted). Called once per answered request: the held
        images are looked up by name, not scanned."""
        names = set(relatives)
        if names:
            self._forget(names.__contains__, among=names)

    def release(self, prefixes: Iterable[str]) -> None:
        """Let go of every image whose path starts with one of ``prefixes`` (ended conversations)."""
        starts = tuple(prefixes)
        if starts:
            self._forget(lambda relative: relative.startswith(starts))

    def _forget(self, match: Callable[[str], bool], among: Iterable[str] | None = None) -> None:
        """Let go of the images that ``match``, held (``among`` them, else all) or wanted."""
        with self._cond:
            for relative in [
                r for r in (self._held if among is None else among) if r in self._held and match(r)
            ]:
                self.held_bytes -= self._held.pop(relative).size
            for queue in (self._needed, self._hints):
                kept = [r for r in queue if not match(r)]
                queue.clear()
                queue.extend(kept)
            for relative in [r for r in self._errors if match(r)]:
                del self._errors[relative]
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the workers (what they are preparing is finished and dropped) and let go of
        everything."""
        with self._cond:
            self._closed = True
            self._needed.clear()
            self._hints.clear()
            self._held.clear()
            self.held_bytes = 0
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []

    def record(self) -> dict[str, Any]:
        """What run.json says about it."""
        return {
            "budget_bytes": self.budget,
            "workers": self.workers,
            "prepared_ahead": self.prepared,
            "prepared_on_demand": self.inline,
            "reused": self.reused,
            "dropped_for_room": self.dropped_for_room,
            "most_held_bytes": self.most_held_bytes,
            "seconds_waited": round(self.waited, 3),
        }

    # ------------------------------------------------------------------ workers
    def _start(self) -> None:
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"{self.name}-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _next(self) -> tuple[str, bool] | None:
        """The next image to prepare and whether it is a hint (needed ones first, then hints while
        half the budget is free), or None when there is none or no room; called with the lock held."""
        if self._needed:
            if self.held_bytes >= self.budget:
                self._make_room()
            if self.held_bytes < self.budget:
                return self._needed.popleft(), False
            return None
        if self._hints and self.held_bytes < self.budget // 2:
            return self._hints.popleft(), True
        return None

    def _make_room(self) -> None:
        """Drop images kept for reuse or prepared on hints, least recently used first, until the
        budget has room."""
        for relative in [r for r, h in self._held.items() if h.used or h.hinted]:
            if self.held_bytes < self.budget:
                return
            self.held_bytes -= self._held.pop(relative).size
            self.dropped_for_room += 1

    def _work(self) -> None:
        while True:
            with self._cond:
                following = None
                while not self._closed and following is None:
                    following = self._next()
                    if following is None:
                        self._cond.wait()
                if self._closed or following is None:
                    return
                relative, hinted = following
                self._running.add(relative)
            try:
                value: Any = self.prepare(relative)
                error = None
            except Exception as e:  # handed to the caller of get, which names the case
                value, error = None, e
            with self._cond:
                self._running.discard(relative)
                if error is not None:
                    self._errors[relative] = error
                elif not self._closed:
                    self.prepared += 1
                    self._store(relative, _Held(value, self.size(value), hinted=hinted))
                self._cond.notify_all()

    def _store(self, relative: str, held: _Held[T]) -> None:
        old = self._held.pop(relative, None)
        if old is not None:
            self.held_bytes -= old.size
        self._held[relative] = held
        self.held_bytes += held.size
        self.most_held_bytes = max(self.most_held_bytes, self.held_bytes)

    def _release_or_keep(self, relative: str, held: _Held[T], keep: bool) -> None:
        if keep:
            held.used, held.hinted = True, False
            self._held.move_to_end(relative)
        else:
            self.held_bytes -= self._held.pop(relative).size
            self._cond.notify_all()
