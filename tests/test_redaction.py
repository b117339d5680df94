"""A secret in --base-url (a user:password@ part, an api-key= in the query string) is written and printed
nowhere: not in run.json's command line or backend settings, not in an error, not in failures.jsonl;
the run still reaches the endpoint, and a note points to --api-key-env (chexpercept.redaction)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from chexpercept.eval.run import main
from chexpercept.redaction import redact_text, redact_url

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai import FakeServer

SECRETS = ("s3cretpw", "KEYSECRET", "alice")


def run_argv(bundle: Path, out: Path, base_url: str, *extra: str) -> list[str]:
    return [
        *("--data-dir", str(bundle), "--model", "local-vlm", "--backend", "openai"),
        *("--base-url", base_url, "--output-dir", str(out), "--no-progress", "--no-score", *extra),
    ]


def everything_written(out: Path) -> str:
    return "\n".join(p.read_text() for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "template",
    ["http://alice:s3cretpw@{host}/v1", "http://{host}/v1?api-version=2024-10-21&api-key=KEYSECRET"],
)
def test_a_secret_in_the_base_url_is_in_no_file_and_no_message(
    fixture_bundle, tmp_path, capsys, monkeypatch, template
):
    with FakeServer() as server:
        base_url = template.format(host=server.url.split("//")[1].split("/")[0])
        argv = run_argv(fixture_bundle, tmp_path, base_url, "--paths", "RF")
        monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv])  # what run.json records as the command
        assert main(argv) == 0
    assert server.requests and server.requests[0]["path"].startswith("/v1/chat/completions")
    if "api-version" in template:  # the query string still goes with the request
        assert "api-version=2024-10-21" in server.requests[0]["path"]
    else:  # the userinfo still authenticates (HTTP basic)
        assert server.requests[0]["headers"]["Authorization"].startswith("Basic ")
    err = capsys.readouterr().err
    info = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
    assert info["backend_settings"]["base_url"] == redact_url(base_url) and "***" in redact_url(base_url)
    assert redact_url(base_url) in info["command"]
    assert not any(s in everything_written(tmp_path) for s in SECRETS)
    assert not any(s in err for s in SECRETS) and "--api-key-env" in err


def test_a_connection_error_quotes_the_url_without_its_secret(fixture_bundle, tmp_path, capsys, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base_url = f"http://alice:s3cretpw@127.0.0.1:{port}/v1?key=KEYSECRET"
    argv = run_argv(fixture_bundle, tmp_path, base_url, "--max-retries", "0", "--limit", "1")
    monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"cannot reach http://***@127.0.0.1:{port}/v1/chat/completions?key=***" in err, err
    assert not any(s in err for s in SECRETS)
    assert not any(s in everything_written(tmp_path) for s in SECRETS)
    # --on-error record: an endpoint that never answered ends the run too (every request would fail),
    # at once and redacted (it is not retried for minutes)
    assert main([*argv, "--on-error", "record", "--max-retries", "6"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach http://***@" in err and "has not answered once in this run" in err
    assert not any(s in err for s in SECRETS)
    assert not any(s in everything_written(tmp_path) for s in SECRETS)


def test_what_is_hidden_and_what_is_kept():
    assert redact_url("https://u:p@h.example/v1") == "https://***@h.example/v1"
    assert redact_url("https://sk-abc@h.example/v1") == "https://***@h.example/v1"  # a key as the user
    assert redact_url("u:p@h.example/v1") == "***@h.example/v1"  # no scheme
    kept = "https://x.openai.azure.com/openai/v1?api-version=2024-10-21"
    assert redact_url(kept) == kept
    assert (
        redact_url("https://h/v1?key=a&access_token=b&sig=c&X-Api-Key=d&n=1")
        == "https://h/v1?key=***&access_token=***&sig=***&X-Api-Key=***&n=1"
    )
    assert redact_text("--base-url=http://u:p@h/v1 and 'https://h/x?token=t'") == (
        "--base-url=http://***@h/v1 and 'https://h/x?token=***'"
    )


#: (text, what is shown): every form of a secret in a message or an error body (red team #15)
FORMS = [
    ("api_key=abc123", "api_key=***"),
    ("api_key = abc123", "api_key = ***"),
    ('api_key = "abc 123"', 'api_key = "***"'),
    ('{"password": "hunter2", "n": 1}', '{"password": "***", "n": 1}'),
    ("{'token': 'tok'}", "{'token': '***'}"),
    ("pass=abc", "pass=***"),
    ("passwd: xyz", "passwd: ***"),
    ("apikey=k", "apikey=***"),
    ("X-Api-Key: kkk", "X-Api-Key: ***"),
    ("accessToken=abc", "accessToken=***"),
    ("HF_TOKEN=hf_abcdef", "HF_TOKEN=***"),
    ("Authorization: Bearer sk-abcdefgh12345", "Authorization: ***"),
    ("sent Bearer sk-abcdefgh12345 to the server", "sent Bearer *** to the server"),
    ("https://user:pw@hub.example/api", "https://***@hub.example/api"),
    ("http://h/v1?api-version=1&api-key=K", "http://h/v1?api-version=1&api-key=***"),
    # kept: names of things, counts, the variable that holds a key
    ("key_id=edema_s50000001_positive_0", "key_id=edema_s50000001_positive_0"),
    ("max_tokens: 64", "max_tokens: 64"),
    ("--api-key-env=OPENAI_API_KEY", "--api-key-env=OPENAI_API_KEY"),
    ("--api-key-header=api-key", "--api-key-header=api-key"),
    ("input tokens 15,000", "input tokens 15,000"),
]


@pytest.mark.parametrize(("text", "shown"), FORMS, ids=[f[0][:24] for f in FORMS])
def test_every_form_of_secret_is_hidden(text, shown):
    """One function, one table of forms; the terminal escapers apply it, so every message printed
    through them is redacted (chexpercept.escape)."""
    from chexpercept.escape import terminal, terminal_lines

    assert redact_text(text) == shown
    assert terminal(text) == shown and terminal_lines(text + "\n" + text) == shown + "\n" + shown
