"""Work kept off the engine's thread: images prepared ahead within a memory budget
(eval/backends/prefetch.py) and requests rendered on a thread of their own, the conversations with
the most turns left first (eval/backends/vllm/render_thread.py)."""

from __future__ import annotations

import threading
import time

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.prefetch import ImagePrefetch
from chexpercept.eval.backends.vllm.render_thread import RenderThread
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import Response


def test_images_are_prepared_once_ahead_of_need_within_the_budget():
    prepared: list[str] = []
    gate = threading.Event()
    most_held = []

    def prepare(relative: str) -> bytes:
        if relative == "bad.png":
            raise OSError("bad.png: not a PNG or JPEG")
        gate.wait(5)
        prepared.append(relative)
        return b"x" * 100

    pool = ImagePrefetch(prepare, len, budget=250, workers=2)
    try:
        names = [f"chexpercept/c{i}/img.png" for i in range(8)]
        pool.want(names[:4])
        pool.want(names[4:], hint=True)
        pool.want(names[:2])  # wanted again: nothing more to do
        gate.set()
        deadline = time.monotonic() + 5
        while pool.prepared < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        # the budget (250 bytes: two images and a part) stops the workers; hints wait for half of it free
        most_held.append(pool.most_held_bytes)
        assert pool.held_bytes <= 250 + 2 * 100 and set(prepared) <= set(names[:4])
        # a caller takes the images in turn; each one asked for is handed over once and let go
        for name in names[:4]:
            assert pool.get(name) == b"x" * 100
        # an image no worker has started is prepared by the caller, who never waits for room
        assert pool.get("chexpercept/late/img.png") == b"x" * 100
        assert pool.inline >= 1 and prepared.count(names[0]) == 1
        # kept for reuse (an API's data URL, sent again on later turns): prepared once, handed over again
        pool.want(["chexpercept/kept/img.png"])
        assert pool.get("chexpercept/kept/img.png", keep=True) == pool.get(
            "chexpercept/kept/img.png", keep=True
        )
        assert prepared.count("chexpercept/kept/img.png") == 1 and pool.reused == 1
        # what preparing raised reaches the caller, who names the case
        pool.want(["bad.png"])
        with pytest.raises(OSError, match="not a PNG or JPEG"):
            pool.get("bad.png")
        # images named are let go (an API's images that its server now holds); a name not held is no error
        pool.get("chexpercept/gone/img.png", keep=True)
        held_before = pool.held_bytes
        pool.drop(["chexpercept/gone/img.png", "never/wanted.png"])
        assert pool.held_bytes == held_before - 100
        pool.get("chexpercept/gone/img.png")
        assert prepared.count("chexpercept/gone/img.png") == 2
        # an ended conversation's images are let go (asked for again, it is prepared again)
        pool.release(["chexpercept/kept/"])
        pool.get("chexpercept/kept/img.png")
        assert prepared.count("chexpercept/kept/img.png") == 2
    finally:
        pool.close()
    assert max(most_held) <= 250 + 2 * 100  # the budget, give or take one image per worker


def test_requests_with_the_most_turns_left_are_rendered_first(fixture_bundle):
    cases = read_bundle(fixture_bundle, lesions=["effusion"]).cases
    requests = []
    for case in cases:  # each route's requests at every depth
        conversation = Conversation(case, oracle="none")
        while not conversation.done:
            requests.append(conversation.pending)
            conversation.answer(Response("Answer: 1"))
    started = threading.Event()
    release = threading.Event()
    order: list[tuple[int, str]] = []

    def render(request):
        if not started.is_set():  # hold the thread while the rest are handed over at once
            started.set()
            release.wait(5)
        order.append((request.turns_after, request.request_id))
        if request.turn.task == "detection":
            raise ValueError("refused")
        return request.request_id

    renderer = RenderThread(render, ahead=len(requests))
    try:
        renderer.put(requests[:1])
        assert started.wait(5)
        renderer.put(requests[1:])
        release.set()
        taken = []
        while len(taken) < len(requests):
            taken += renderer.take(wait=True)
        assert renderer.pending == 0
    finally:
        renderer.close()
    rest = [turns for turns, _ in order[1:]]
    assert rest == sorted(rest, reverse=True)  # the most turns left first, then in the order handed over
    assert [r for _, r in order[1:] if _ == rest[0]] == [
        r.request_id for r in requests[1:] if r.turns_after == rest[0]
    ]
    # a render that raised is that request's entry (the engine's thread fails that conversation alone)
    refused = {r.request_id for r, result in taken if isinstance(result, ValueError)}
    assert refused == {r.request_id for r in requests if r.turn.task == "detection"}
