"""The server's wait hints, read against its own clock and honoured or reported, never turned into
pointless retries (eval/backends/openai/retries.py): an HTTP date with a skewed local clock, an epoch reset time, a
rate-limit window on a 503, a hint longer than the client's own backoff cap, a wait too long to
take (the run stops, or records, naming it and when to rerun), garbage hints, the total waiting of
one request, and Ctrl-C in the middle of a wait."""

from __future__ import annotations

import email.utils
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.openai.backend import RetryPolicy
from chexpercept.eval.engine import ConversationFailed
from chexpercept.results import read_failures

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeServer, backend_for, run_cases

ROOT = Path(__file__).resolve().parents[1]
#: without the server's hint a retry would come after 10 ms; the cap on our own backoff is 30 s
POLICY = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=30)


def http_date(epoch: float) -> str:
    return email.utils.formatdate(epoch, usegmt=True)


def one_case(fixture_bundle: Path):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["LF"])
    bundle.cases = bundle.cases[:1]
    return bundle


def gap_after(fixture_bundle: Path, reply: dict, policy: RetryPolicy = POLICY) -> float:
    """Seconds between a request that got ``reply`` and its retry."""
    with FakeServer(failures=[reply]) as server:
        backend = backend_for(server, retry=policy)
        try:
            (record,) = run_cases(backend, one_case(fixture_bundle))
        finally:
            backend.close()
    assert record.turns[0].usage["attempts"] == 2
    return server.times[1] - server.times[0]


def throttled(headers: dict, status: int = 429) -> dict:
    return {"status": status, "headers": headers, "body": {"error": {"message": "slow down"}}}


# ------------------------------------------------------------------- the server's own clock
@pytest.mark.parametrize("local_ahead", [120, -120], ids=["local-clock-ahead", "local-clock-behind"])
def test_an_http_date_is_read_against_the_servers_clock(fixture_bundle, local_ahead):
    """The server's Date says its clock is 2 minutes off ours; its Retry-After date is 2 s after
    its own now: the client waits 2 s, neither 0 (7 retries in 0.4 s) nor 2 minutes."""
    server_now = time.time() - local_ahead
    reply = throttled({"Date": http_date(server_now), "Retry-After": http_date(server_now + 2)})
    gap = gap_after(fixture_bundle, reply)
    assert 1.5 <= gap < 10, gap


def test_an_epoch_reset_time_is_a_time_not_a_duration(fixture_bundle):
    """Some gateways send x-ratelimit-reset-* as an absolute epoch time: 2 s from the server's now,
    not 1.8 billion seconds (cut to the backoff cap)."""
    server_now = time.time() - 300  # and the server's clock is 5 minutes behind ours
    reply = throttled({"Date": http_date(server_now), "x-ratelimit-reset-requests": str(int(server_now) + 2)})
    gap = gap_after(fixture_bundle, reply)
    assert 1.5 <= gap < 10, gap


def test_a_rate_limit_window_on_a_503_is_not_a_wait(fixture_bundle):
    """OpenAI sends x-ratelimit-reset-* on every reply: on a 503 (overloaded) the token window's
    reset is no reason to wait 6 minutes; the client's own backoff applies."""
    gap = gap_after(fixture_bundle, throttled({"x-ratelimit-reset-tokens": "6m0s"}, status=503))
    assert gap < 3, gap


@pytest.mark.parametrize("status", [429, 503])
def test_a_hint_longer_than_the_backoff_cap_is_honoured_not_cut(fixture_bundle, status):
    """The own backoff is capped at max_delay; the server's hint is not: retrying before it is ready
    only burns retries."""
    policy = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05)
    gap = gap_after(fixture_bundle, throttled({"Retry-After": "2"}, status=status), policy)
    assert gap >= 1.8, gap


def _zero_hints() -> list[dict]:
    server_now = time.time() - 120  # this machine's clock 2 minutes ahead of the server's
    return [
        {"Retry-After": "-5"},
        {"retry-after-ms": "-1000"},
        {"Retry-After": "inf"},
        {"Retry-After": "soon"},
        {"Retry-After": "0"},
        {"Date": http_date(server_now), "Retry-After": http_date(server_now)},
        {"x-ratelimit-reset-requests": "0s", "x-ratelimit-remaining-requests": "0"},
    ]


@pytest.mark.parametrize(
    "headers",
    _zero_hints(),
    ids=["negative", "negative-ms", "inf", "garbage", "zero", "date-at-server-now", "reset-0s"],
)
def test_a_hint_that_is_no_wait_falls_back_to_the_backoff(fixture_bundle, headers):
    """Rule: a wait is never below the backoff's floor; a zero hint once gave 7 attempts in 0.4 s."""
    policy = RetryPolicy(max_retries=3, base_delay=1.0, max_delay=1.0)  # 0.75 to 1.25 s
    gap = gap_after(fixture_bundle, throttled(headers), policy)
    assert gap >= 0.7, gap  # not an immediate retry


NOW = 1_800_000_000.0
SERVER = {"Date": http_date(NOW - 120)}  # this machine's clock 2 minutes ahead of the server's
FLOOR = (0.75, 1.25)  # the own backoff of attempt 0 below: 1 s +-25 %


@pytest.mark.parametrize(
    ("headers", "body", "wait"),
    [
        ({"Retry-After": "0"}, "", FLOOR),
        ({"Retry-After": "-5"}, "", FLOOR),
        ({"Retry-After": "nan"}, "", FLOOR),
        ({"Retry-After": "1e400"}, "", FLOOR),
        ({"Retry-After": "0.2"}, "", FLOOR),
        ({"Retry-After": "3"}, "", 3.0),
        ({**SERVER, "Retry-After": http_date(NOW - 120)}, "", FLOOR),
        ({**SERVER, "Retry-After": http_date(NOW - 200)}, "", FLOOR),
        ({**SERVER, "Retry-After": http_date(NOW - 117)}, "", 3.0),
        ({"Retry-After": http_date(NOW - 50)}, "", FLOOR),
        ({"retry-after-ms": "0"}, "", FLOOR),
        ({"retry-after-ms": "2"}, "", FLOOR),  # 2 ms, not 2 s
        ({"retry-after-ms": "3000"}, "", 3.0),
        ({"retry-after-ms": "-1"}, "", FLOOR),
        ({"x-ratelimit-reset-requests": "0s", "x-ratelimit-remaining-requests": "0"}, "", FLOOR),
        ({"x-ratelimit-reset-tokens": "20ms"}, "", FLOOR),
        ({"x-ratelimit-reset-requests": "1m30s", "x-ratelimit-remaining-requests": "0"}, "", 90.0),
        ({**SERVER, "x-ratelimit-reset": str(int(NOW - 120))}, "", FLOOR),  # an epoch time: now
        ({}, json.dumps({"error": {"details": [{"retryDelay": "0s"}]}}), FLOOR),
        ({}, json.dumps({"error": {"details": [{"retryDelay": "4s"}]}}), 4.0),
        ({"Retry-After": "86400"}, "", None),  # longer than a run waits: not retried, said
        ({"Retry-After": "1e300"}, "", None),
        ({"retry-after-ms": "1e20"}, "", None),
    ],
)
def test_every_hint_form_only_lengthens_the_backoff(headers, body, wait):
    """Rule (RetryPolicy.next_wait): a wait is never below the backoff's floor for that attempt; a
    hint only lengthens it, up to the longest a run waits (beyond it: not retried, the wait named)."""
    from chexpercept.eval.backends.openai.retries import read_wait_hint

    policy = RetryPolicy(max_retries=6, base_delay=1.0, max_delay=120.0)
    hint = read_wait_hint(headers, body, status=429, received=NOW)
    got, why = policy.next_wait(0, 0.0, hint)
    if wait is None:
        assert got is None and "the server asked to wait" in why and "rerun after" in why, why
    elif wait == FLOOR:
        assert FLOOR[0] <= got <= FLOOR[1], (headers, got)
    else:
        assert got == pytest.approx(wait, abs=0.01), (headers, got)
    late, _ = policy.next_wait(3, 0.0, hint)  # attempt 3: the floor is 6 s, a hint of 3 s does not cut it
    assert late is None if wait is None else late >= 6.0


def test_every_form_is_read_relative_to_the_reply():
    from chexpercept.eval.backends.openai.retries import read_wait_hint

    for garbage in ({"Retry-After": "-5"}, {"retry-after-ms": "nan"}, {"Retry-After": "1e400"}):
        assert read_wait_hint(garbage, status=429) is None
    now = 1_800_000_000.0
    server = {"Date": http_date(now - 60)}  # this machine 60 s ahead
    assert read_wait_hint({**server, "Retry-After": http_date(now - 50)}, received=now).seconds == 10
    assert read_wait_hint({**server, "retry-after": "7"}, received=now).seconds == 7  # any case
    past = read_wait_hint({"Retry-After": http_date(now - 50)}, received=now)
    assert past is None  # a past date and no Date to measure it by: not "now"
    ms = {**server, "x-ratelimit-reset-tokens": str(int((now - 60 + 3) * 1000))}  # epoch milliseconds
    assert read_wait_hint(ms, status=429, received=now).seconds == pytest.approx(3, abs=1)
    left = {"x-ratelimit-reset-requests": "9s", "x-ratelimit-remaining-requests": "5"}
    assert read_wait_hint({**left, "x-ratelimit-reset-tokens": "2s"}, status=429).seconds == 2
    assert read_wait_hint({"x-ratelimit-reset-tokens": "2s"}, status=500) is None
    hint = read_wait_hint({**server, "Retry-After": "30"}, received=now)
    assert "this machine's clock is 1 min ahead of the server's" in hint.describe()


# ------------------------------------------------------------- a wait too long to take
def start_run(bundle: Path, out: Path, url: str, *extra: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        str(ROOT / "eval" / "run.py"),
        "--data-dir",
        str(bundle),
        "--output-dir",
        str(out),
    ]
    argv += ["--model", "local-vlm", "--backend", "openai", "--base-url", url, "--paths", "RF"]
    argv += ["--no-progress", "--no-score", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_wait_too_long_stops_the_run_naming_the_wait_and_when_to_rerun(fixture_bundle, tmp_path):
    hour = throttled({"Retry-After": "3600"})
    with FakeServer(failures=[hour]) as server:
        started = time.monotonic()
        proc = start_run(fixture_bundle, tmp_path, server.url, "--batch-size", "1")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and time.monotonic() - started < 30
    (line,) = [x for x in err.splitlines() if x.startswith("chexpercept run:")]
    assert "the server asked to wait 1 h (Retry-After: 3600)" in line, line
    assert "a run waits at most 10 min for one retry" in line and "rerun after " in line
    assert len(server.requests) == 1  # not retried


def test_under_record_a_wait_too_long_sends_nothing_more_before_it_ends(fixture_bundle, tmp_path):
    hour = throttled({"Retry-After": "3600"})
    with FakeServer(failures=[hour]) as server:
        proc = start_run(fixture_bundle, tmp_path, server.url, "--batch-size", "1", "--on-error", "record")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert len(server.requests) == 1  # the others are not sent into a server that said "an hour"
    failures = read_failures(tmp_path / "local-vlm" / "oracle_implicit" / "failures.jsonl")
    assert len(failures) == 7
    assert all("the server asked to wait 1 h (Retry-After: 3600)" in f.error for f in failures)
    assert sum(f.error.startswith("not sent:") for f in failures) == 6
    assert "rerun after " in failures[-1].error


def test_the_waits_of_one_request_are_bounded_in_all(fixture_bundle):
    policy = RetryPolicy(max_retries=5, base_delay=0.01, budget=2.0)
    replies = [throttled({"Retry-After": "1.5"})] * 3
    expected = r"gave up after 2 attempts and 1\.5 s of waiting.*a request may wait in all.*Retry-After: 1\.5"
    with FakeServer(failures=replies) as server, pytest.raises(ConversationFailed, match=expected):
        backend = backend_for(server, retry=policy)
        try:
            run_cases(backend, one_case(fixture_bundle))
        finally:
            backend.close()
    assert len(server.requests) == 2


def test_ctrl_c_during_a_long_wait_stops_within_seconds(fixture_bundle, tmp_path):
    waits = [throttled({"Retry-After": "300"})] * 50  # within what a run waits out
    with FakeServer(failures=waits) as server:
        proc = start_run(fixture_bundle, tmp_path, server.url)
        deadline = time.monotonic() + 60
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.requests, "no request reached the server"
        time.sleep(1.0)  # every request is waiting now
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5 and proc.returncode == 128 + signal.SIGINT, err
    assert "stopped by SIGINT" in err and "Traceback" not in err
    assert not (tmp_path / "local-vlm" / "oracle_implicit" / "run.lock").exists()


def test_a_long_wait_the_server_asked_for_is_said_while_it_is_waited_out(fixture_bundle, capsys):
    policy = RetryPolicy(max_retries=3, base_delay=0.01, notice_after=1.0)  # a minute by default
    gap = gap_after(fixture_bundle, throttled({"Retry-After": "1.5"}), policy)
    err = capsys.readouterr().err
    assert gap >= 1.4 and err.count("note: the server asked to wait 1.5 s (Retry-After: 1.5)") == 1, err
    assert "waiting (Ctrl-C stops the run" in err
