"""The HTTP client's view of a reply (issue 20 item 6): what a server can send back besides a clean
JSON answer, and what the openai backend makes of it. Every case against a loopback server."""

from __future__ import annotations

import gzip
import json
import time

import pytest
from fake_openai import FakeServer, backend_for, run_cases

from chexpercept.bundle import read_bundle
from chexpercept.eval.engine import ConversationFailed, run_conversations
from chexpercept.eval.protocol import BackendError, RunContext

ANSWER = {"choices": [{"message": {"content": "Answer: 2"}, "finish_reason": "stop"}], "model": "gpt-5.4"}


def one_case(bundle_dir):
    return read_bundle(bundle_dir, lesions=["effusion"], paths=["LF"])  # one case, one turn


def first_turn(bundle_dir, server, **kwargs):
    (record,) = run_cases(backend_for(server, **kwargs), one_case(bundle_dir))
    return record.turns[0]


def test_a_close_delimited_body_cut_mid_way_is_retried(fixture_bundle):
    cut = {"raw": b'{"choices": [{"message": {"content": "Ans', "content_length": None}
    with FakeServer(failures=[cut]) as server:
        turn = first_turn(fixture_bundle, server)
    assert turn.usage["attempts"] == 2 and turn.response == "Answer: 1"


def test_a_chunked_or_html_or_empty_200_is_retried_then_fails_naming_it(fixture_bundle):
    html = {"raw": b"<html><body>Gateway says hello</body></html>", "content_type": "text/html"}
    empty = {"raw": b"", "content_length": 0}
    with FakeServer(failures=[html, empty]) as server:
        turn = first_turn(fixture_bundle, server)
    assert turn.usage["attempts"] == 3
    with FakeServer(failures=[html] * 4) as server, pytest.raises(ConversationFailed) as e:
        first_turn(fixture_bundle, server)
    assert "not complete JSON" in str(e.value) and "text/html" in str(e.value)


def test_a_deadline_per_attempt_however_slowly_the_bytes_trickle(fixture_bundle):
    # one byte every 0.2 s: a per-read socket timeout of 1 s would never fire (the 153.6 s)
    trickle = {"message": {"content": "Answer: 1"}, "trickle": 0.2}
    with FakeServer(failures=[trickle]) as server:
        started = time.monotonic()
        turn = first_turn(fixture_bundle, server, timeout=1.0)
    assert time.monotonic() - started < 4
    assert turn.usage["attempts"] == 2 and turn.response == "Answer: 1"


def test_the_served_model_is_recorded_and_a_fallback_warns_once(fixture_bundle, capsys):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    fallback = {"message": {"content": "Answer: 1"}, "model": "gpt-4o-mini"}
    snapshot = {"message": {"content": "Answer: 1"}, "model": "gpt-5.4-2026-03-05-preview"}
    with FakeServer(failures=[fallback, fallback, snapshot]) as server:
        backend = backend_for(server)
        results = run_cases(backend, bundle)
    served = [t.usage.get("served_model") for r in results for t in r.turns]
    assert served.count("gpt-4o-mini") == 2 and served.count("gpt-5.4-2026-03-05-preview") == 1
    assert served.count("gpt-5.4-2026-03-05") == len(served) - 3  # the id the registry asks for
    err = capsys.readouterr().err
    assert err.count("the server answered as 'gpt-4o-mini'") == 1 and "preview" not in err
    counts = backend.describe()["served_models"]
    assert counts["gpt-4o-mini"] == 2 and sum(counts.values()) == len(served)


def test_a_redirect_is_never_followed(fixture_bundle):
    moved = {"status": 307, "headers": {"Location": "https://elsewhere.example/v1/chat/completions"}}
    with (
        FakeServer(failures=[moved]) as server,
        pytest.raises(BackendError, match="redirects are not followed"),
    ):
        first_turn(fixture_bundle, server, on_error="record")
    assert len(server.requests) == 1  # the image went to the endpoint given, and nowhere else


def test_json_that_is_not_an_object_is_a_failed_request(fixture_bundle):
    with FakeServer(failures=[{"raw": b'["Answer: 1"]'}]) as server, pytest.raises(ConversationFailed) as e:
        first_turn(fixture_bundle, server)
    assert "JSON that is not an object" in str(e.value)


def test_a_streamed_reply_is_put_together_and_a_cut_stream_retried(fixture_bundle):
    chunks = [
        {"model": "gpt-5.4-2026-03-05", "choices": [{"delta": {"reasoning": "Look at the base. "}}]},
        {"choices": [{"delta": {"content": "Answer: "}}]},
        {"choices": [{"delta": {"content": "2"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}},
    ]
    cut = {"events": chunks[:2], "done": False}
    with FakeServer(failures=[cut, {"events": chunks}]) as server:
        turn = first_turn(fixture_bundle, server)
    assert turn.usage["attempts"] == 2 and turn.response == "Answer: 2"
    assert turn.usage["input_tokens"] == 10 and turn.usage["served_model"] == "gpt-5.4-2026-03-05"
    assert "Look at the base." in (turn.full_response or "")


def test_a_gzip_encoded_reply_is_read(fixture_bundle):
    body = gzip.compress(json.dumps(ANSWER).encode())
    with FakeServer(failures=[{"raw": body, "headers": {"Content-Encoding": "gzip"}}]) as server:
        turn = first_turn(fixture_bundle, server)
    assert turn.response == "Answer: 2" and turn.usage["attempts"] == 1


def test_429s_halve_the_in_flight_limit_and_answers_raise_it_back(fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    with FakeServer(failures=[429] * 6, delay=0.02) as server:
        backend = backend_for(server, concurrency=8)
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        results = []
        run_conversations(bundle.cases, backend, oracle="implicit", batch_size=32, on_finished=results.extend)
    limit = backend.describe()["schedule"]["in_flight_limit"]
    assert len(results) == 21
    assert limit["ceiling"] == 8 and limit["decreases"] >= 1 and limit["lowest"] <= 4
    assert limit["final"] > limit["lowest"]  # recovered as answers came
    assert server.max_in_flight <= 8


MALFORMED = {
    "message is a string": ({"choices": [{"message": "Answer: 1"}]}, "choices[0].message is not an object"),
    "choices missing": ({"id": "x", "model": "gpt-5.4"}, "choices is not a non-empty list"),
    "choices an object": ({"choices": {"0": {"message": {}}}}, "choices is not a non-empty list"),
    "choice a list": ({"choices": [["Answer: 1"]]}, "choices[0] is not an object"),
    "content a number": (
        {"choices": [{"message": {"content": 7}}]},
        "choices[0].message.content is not text",
    ),
    "content part a list": (
        {"choices": [{"message": {"content": [["Answer"]]}}]},
        "choices[0].message.content[0] is not a text part",
    ),
    "finish_reason an object": (
        {"choices": [{"message": {"content": "Answer: 1"}, "finish_reason": {}}]},
        "choices[0].finish_reason is not text",
    ),
}


@pytest.mark.parametrize("shape", sorted(MALFORMED))
def test_a_reply_of_another_shape_is_the_case_s_recorded_error(fixture_bundle, shape):
    """Red team #16: a reply without the expected shape is a recorded error for that case (naming the
    case and the field), like any other server error, not a traceback that ends the run; it is not
    retried (the server answered)."""
    reply, field = MALFORMED[shape]
    malformed = {"raw": json.dumps(reply).encode()}
    with FakeServer(failures=[malformed]) as server, pytest.raises(ConversationFailed) as e:
        first_turn(fixture_bundle, server)
    assert field in str(e.value) and one_case(fixture_bundle).cases[0].key_id in str(e.value)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([["data", "list"]], "streamed chunk 1 is not an object"),
        ([{"choices": [{"delta": "Answer"}]}], "streamed chunk 1: choices[0].delta is not an object"),
        ([{"choices": "Answer"}], "streamed chunk 1: choices is not a list"),
    ],
    ids=["chunk-a-list", "delta-a-string", "choices-a-string"],
)
def test_a_stream_of_another_shape_is_the_case_s_recorded_error(fixture_bundle, events, field):
    with FakeServer(failures=[{"events": events}]) as server, pytest.raises(ConversationFailed) as e:
        first_turn(fixture_bundle, server)
    assert field in str(e.value)


def test_content_parts_are_joined(fixture_bundle):
    parts = {"message": {"content": [{"type": "text", "text": "Answer: "}, "2", {"type": "image_url"}]}}
    with FakeServer(failures=[parts]) as server:
        assert first_turn(fixture_bundle, server).response == "Answer: 2"


ERROR_CHUNK = {
    "error": {"message": "the engine failed mid-generation", "type": "InternalServerError", "code": 500}
}
PARTIAL = {"choices": [{"delta": {"content": "Answer: 1"}}]}


@pytest.mark.parametrize(
    "reply",
    [
        {
            "events": [PARTIAL, ERROR_CHUNK]
        },  # vLLM's stream when a generation fails: an error chunk, then [DONE]
        {"events": [PARTIAL, {**ERROR_CHUNK, "error": {**ERROR_CHUNK["error"], "code": 400}}]},
        {"events": [PARTIAL, {"choices": [{"delta": {}, "finish_reason": "abort"}]}]},
        {"events": [{"choices": [{"delta": {"content": "Answer: 1"}, "finish_reason": "error"}]}]},
        {"message": {"content": "Answer: 1"}, "finish_reason": "abort"},
        {"message": {"content": "Answer: 1"}, "finish_reason": "error"},
        # round 2 (helper-53): no finish reason in a stream, an error beside the choices, an abort
        # then a stop, other spellings
        {"events": [PARTIAL]},
        {
            "raw": json.dumps(
                {
                    "choices": [{"message": {"content": "Answer: 1"}, "finish_reason": "stop"}],
                    "error": ERROR_CHUNK["error"],
                }
            ).encode()
        },
        {
            "events": [
                {"choices": [{"delta": {"content": "Answer: 1"}, "finish_reason": "abort"}]},
                {"choices": [{"delta": {}, "finish_reason": "stop"}]},
            ]
        },
        {"message": {"content": "Answer: 1"}, "finish_reason": "ABORT"},
        {"message": {"content": "Answer: 1"}, "finish_reason": "cancelled"},
    ],
    ids=[
        "stream-error-500",
        "stream-error-400",
        "stream-abort",
        "stream-error-finish",
        "abort",
        "error",
        "stream-no-finish",
        "choices-and-error",
        "abort-then-stop",
        "ABORT",
        "cancelled",
    ],
)
def test_a_generation_that_did_not_finish_is_never_an_answer(fixture_bundle, reply):
    """Red team, stop 48: a stream that ended with an error chunk (and then ``[DONE]``), or a reply
    whose finish_reason says the generation did not finish (vLLM's ``abort``, ``error``), was
    recorded and scored as the model's answer. Such a reply is retried where it may pass (a 5xx
    code, an unfinished generation) and is otherwise the case's error; it is never an answer."""
    with FakeServer(failures=[reply] * 4) as server, pytest.raises(ConversationFailed) as e:
        first_turn(fixture_bundle, server)  # FAST: 3 retries
    assert any(w in str(e.value) for w in ("mid-generation", "unfinished", "no finish reason")), str(e.value)
    retried = "400" not in repr(reply)
    assert len(server.requests) == (4 if retried else 1)
    if retried:
        with FakeServer(failures=[reply]) as server:  # one such reply, then an answer
            turn = first_turn(fixture_bundle, server)
        assert turn.response == "Answer: 1" and turn.usage["attempts"] == 2


def test_a_stream_of_several_choices_is_read_as_its_first(fixture_bundle):
    """Red team, stop 48: with ``"n": 2`` in a streamed request the two choices' deltas were joined
    into one reply ("Answer: 2 Answer: 1", read as 1); a stream is read as its choice 0, as a reply
    that is not streamed is."""
    events = [
        {
            "choices": [
                {"index": 0, "delta": {"content": "Answer: 2"}},
                {"index": 1, "delta": {"content": " Answer: 1"}},
            ]
        },
        {"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    with FakeServer(failures=[{"events": events}]) as server:
        turn = first_turn(fixture_bundle, server)
    assert turn.response == "Answer: 2" and turn.usage["attempts"] == 1
