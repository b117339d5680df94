"""Requests rendered on a thread of their own, so that the engine always has the next work queued.

Rendering a request (chat template, tokenizer, vLLM's multimodal processor) takes longer than an
iteration of a small model, and the thread that renders cannot take the engine's answers meanwhile:
rendered on the engine's thread, a turn's requests were all rendered while the engine idled (see
bench/RESULTS.md, "The runner's own work"). Here one thread renders the requests handed over, in
order, while the engine's thread steps the engine and adds each rendered request at once (``take``);
vLLM's own server renders off its engine loop the same way. Only the engine's thread adds requests
and steps the engine (vLLM's ``LLMEngine`` is not thread-safe); the render thread only renders.

Requests are rendered in the order of their conversations' turns left (``Request.turns_after``,
most first; then in the order handed over): when many answers come in at once, the conversations
with the longest way to go are the run's critical path, and their next turns go first.
``ahead`` bounds the rendered requests not yet taken (each may hold an image's processed pixels).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from chexpercept.eval.protocol import Request

#: what ``take`` hands back: the request, and what adds it to the engine or why it was not rendered
Rendered = tuple[Request, Any]


class RenderThread:
    """Renders requests with ``render(request)`` (which returns what adds it to the engine) on one
    daemon thread, the most turns left first; an exception becomes that request's entry."""

    def __init__(
        self, render: Callable[[Request], Any], *, ahead: int = 16, name: str = "chexpercept-render"
    ):
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1, got {ahead}")
        self.render = render
        self.ahead = ahead
        self._cond = threading.Condition()
        #: (-turns after, order handed over, request): a heap
        self._todo: list[tuple[int, int, Request]] = []
        self._order = itertools.count()
        self._done: deque[Rendered] = deque()
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Requests handed over and not yet taken (waiting, being rendered, or rendered)."""
        with self._cond:
            return len(self._todo) + len(self._done) + int(self._busy)

    def put(self, requests: Sequence[Request]) -> None:
        with self._cond:
            for request in requests:
                heapq.heappush(self._todo, (-request.turns_after, next(self._order), request))
            self._cond.notify_all()

    def take(self, *, wait: bool) -> list[Rendered]:
        """Every rendered request, in order; with ``wait``, at least one (when any is pending)."""
        with self._cond:
            while wait and not self._done and (self._todo or self._busy) and not self._closed:
                self._cond.wait()
            out = list(self._done)
            self._done.clear()
            self._cond.notify_all()
            return out

    def close(self) -> None:
        """Stop after the request being rendered; what was not taken is dropped."""
        with self._cond:
            self._closed = True
            self._todo.clear()
            self._done.clear()
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._todo or len(self._done) >= self.ahead):
                    self._cond.wait()
                if self._closed:
                    return
                request = heapq.heappop(self._todo)[2]
                self._busy = True
            try:
                result: Any = self.render(request)
            except BaseException as e:  # the engine's thread decides: this request refused, or the run ends
                result = e
            with self._cond:
                self._busy = False
                if not self._closed:
                    self._done.append((request, result))
                self._cond.notify_all()
