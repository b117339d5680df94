"""OpenAI-compatible backend against a fake server on 127.0.0.1: payloads, retries, usage, refusal."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from fake_openai import FakeServer, backend_for, run_cases

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.openai.backend import (
    call_cost,
    check_endpoint,
    price_for,
)
from chexpercept.eval.engine import ConversationFailed, run_conversations
from chexpercept.eval.protocol import BackendError, RunContext
from chexpercept.eval.run import main
from chexpercept.results import iter_results


def test_payload_retries_and_usage(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["RR"])
    with FakeServer(failures=[429, 503, 500]) as server:
        backend = backend_for(server, api_key="secret")
        (record,) = run_cases(backend, bundle)
    assert backend.retries == 3
    assert len(server.requests) == 9 + 3  # 9 turns, 3 retried
    # each body went out whole, in its pieces (a retry sends them all again), as JSON that the
    # server parsed, and run.json's byte count is what the server read
    assert sum(len(r["raw"]) for r in server.requests) == backend.bytes_sent
    assert server.requests[0]["raw"] == server.requests[3]["raw"]
    first = server.requests[0]
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["Authorization"] == "Bearer secret"
    body = first["body"]
    assert body["model"] == "gpt-5.4-2026-03-05"
    assert body["max_completion_tokens"] == 8192 and body["temperature"] == 1.0 and "top_p" not in body
    assert body["reasoning_effort"] == "medium" and body["frequency_penalty"] == 0.0
    assert body["messages"][0]["role"] == "system"
    parts = body["messages"][1]["content"]
    assert parts[0]["type"] == "text" and parts[1]["type"] == "image_url"
    url = parts[1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    image = bundle.root / bundle.cases[0].turn("detection").images[0]
    assert base64.b64decode(url.split(",", 1)[1]) == image.read_bytes()  # the file's bytes, not re-encoded
    last = server.requests[-1]["body"]["messages"]
    assert len(last) == 1 + 2 * 8 + 1 and last[2]["content"] == [{"type": "text", "text": "Answer: 1"}]
    cost = ((1000 - 200) * 2.50 + 200 * 0.25 + 50 * 15.00) / 1e6
    turn = record.turns[0]
    assert turn.usage["cost_usd"] == pytest.approx(cost)
    assert turn.usage["input_tokens"] == 1000 and turn.usage["cached_input_tokens"] == 200
    assert turn.usage["output_tokens"] == 50 and turn.usage["thinking_tokens"] == 30
    assert turn.usage["attempts"] == 4  # 429, 503, 500, then the answer
    assert record.usage["num_calls"] == 9 and record.usage["input_tokens"] == 9000
    assert record.usage["cost_usd"] == pytest.approx(9 * cost)
    # each image read and encoded once while its conversation is live, then sent on every later turn
    images = backend.images.record()
    bodies = [r["body"] for r in server.requests[3:]]  # the first request was sent 4 times
    sent = [p for b in bodies for m in b["messages"][1:] for p in m["content"] if p["type"] == "image_url"]
    distinct = {i for t in bundle.cases[0].turns for i in t.images}
    assert images["prepared_ahead"] + images["prepared_on_demand"] == len(distinct) > 1
    assert images["reused"] == len(sent) - len(distinct) > 0


def test_timeouts_are_retried(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["LF"])
    with FakeServer(failures=["sleep"]) as server:
        backend = backend_for(server, timeout=0.5)  # the server sleeps 1 s on the first request only
        (record,) = run_cases(backend, bundle)
    assert (
        backend.retries == 1 and record.turns[0].usage["attempts"] == 2 and record.turns[0].correct is False
    )


def test_giving_up_stops_the_run_or_leaves_the_case_unfinished(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["LF"])
    with (
        FakeServer(failures=[500] * 10) as server,
        pytest.raises(ConversationFailed, match=r"effusion_\w+ \(detection\): gave up after 4 attempts"),
    ):
        run_cases(backend_for(server), bundle)
    with FakeServer(failures=[500] * 4 + [400]) as server:
        backend = backend_for(server, on_error="record")
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        results, failures = [], []
        run_conversations(
            bundle.cases,
            backend,
            oracle="implicit",
            batch_size=8,
            on_finished=results.extend,
            on_failed=failures.extend,
        )
    # a failed request is no answer: the case is not a result, it is a failure to retry
    assert results == [] and len(failures) == 1
    assert failures[0].task == "detection" and failures[0].error.startswith(
        "gave up after 4 attempts: HTTP 500"
    )


def test_client_errors_are_not_retried(fixture_bundle):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["LF"])
    with FakeServer(failures=[400]) as server:
        with pytest.raises(BackendError, match="HTTP 400"):
            run_cases(backend_for(server), bundle)
        assert len(server.requests) == 1


def test_concurrency_limit(fixture_bundle):
    bundle = read_bundle(fixture_bundle, paths=["LF"])  # 7 one-turn cases in one step
    with FakeServer(delay=0.15) as server:
        run_cases(backend_for(server, concurrency=3), bundle)
    assert server.max_in_flight == 3


def test_non_loopback_endpoints_are_refused_unless_vouched_for(fixture_bundle, tmp_path, capsys):
    for ok in (
        "http://127.0.0.1:8000/v1",
        "http://localhost:8000/v1",
        "http://127.0.0.9/v1",
        "http://[::1]:8000/v1",
    ):
        check_endpoint(ok, dua_compliant=False)
    for remote in (
        "https://api.openai.com/v1",
        "https://my.openai.azure.com/openai/v1",
        "http://10.0.0.5/v1",
    ):
        with pytest.raises(PermissionError, match="data use agreement forbids"):
            check_endpoint(remote, dua_compliant=False)
        check_endpoint(remote, dua_compliant=True)
    with pytest.raises(ValueError, match="http"):
        check_endpoint("127.0.0.1:8000", dua_compliant=False)
    rc = main(
        [
            *("--data-dir", str(fixture_bundle), "--model", "gemini-3.1-pro", "--output-dir", str(tmp_path)),
            *("--base-url", "https://generativelanguage.googleapis.com/v1beta/openai"),
        ]
    )
    err = capsys.readouterr().err
    assert (
        rc == 2 and "PhysioNet credentialed data use agreement" in err and "--dua-compliant-endpoint" in err
    )
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_price_table_lookup():
    assert price_for("gpt-5.4-nano-2026-03-17") == (0.20, 0.02, 1.25)
    assert price_for("GPT-5.4-mini") == (0.75, 0.075, 4.50)
    assert price_for("gemini-3.1-pro-preview") == (2.00, 0.20, 12.00)
    assert price_for("my-local-model") is None and call_cost("my-local-model", 10, 0, 10) is None


def test_cli_run_against_a_local_server(fixture_bundle, tmp_path):
    with FakeServer() as server:
        rc = main(
            [
                *("--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai"),
                *("--base-url", server.url, "--output-dir", str(tmp_path), "--no-progress", "--paths", "RF"),
            ]
        )
    assert rc == 0
    folder = tmp_path / "local-vlm" / "oracle_implicit"
    records = list(iter_results(folder / "results.jsonl"))
    assert len(records) == 7
    body = server.requests[0]["body"]
    assert body["model"] == "local-vlm" and body["temperature"] == 0.0 and "reasoning_effort" not in body
    assert "Authorization" not in server.requests[0]["headers"]
    info = json.loads((folder / "run.json").read_text())
    assert info["sampling"]["greedy"] is True and info["backend_settings"]["base_url"] == server.url


def test_a_request_whose_image_is_still_being_encoded_holds_up_no_other(fixture_bundle):
    """The event loop never waits for an image (bodies are built on worker threads): while one
    conversation's images are still being read and encoded (held here until the other conversation
    is answered), the other one is sent and answered."""
    bundle = read_bundle(fixture_bundle, paths=["RR"])
    slow, quick = bundle.cases[0], bundle.cases[1]
    slow_images = {i for t in slow.turns for i in t.images}
    assert slow_images and not slow_images & {i for t in quick.turns for i in t.images}
    answered_while_held: list[str] = []
    quick_answered = threading.Event()
    with FakeServer() as server:
        backend = backend_for(server)
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        encode = backend.images.prepare

        def held_back(relative: str):
            if relative in slow_images:
                quick_answered.wait(20)
            return encode(relative)

        backend.images.prepare = held_back

        def finished(records):
            if not quick_answered.is_set():
                answered_while_held.extend(r.key_id for r in records)
            if any(r.key_id == quick.key_id for r in records):
                quick_answered.set()

        started = time.monotonic()
        run_conversations([slow, quick], backend, oracle="implicit", batch_size=2, on_finished=finished)
        backend.close()
    assert answered_while_held == [quick.key_id] and time.monotonic() - started < 15
