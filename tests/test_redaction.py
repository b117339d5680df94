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


def test_a_value_under_a_secret_key_is_in_no_file_and_no_message(
    fixture_bundle, tmp_path, capsys, monkeypatch
):
    """Rule: a value under a key that names a secret (x-api-key, Authorization, token, password...) is
    hidden whole wherever JSON is written or printed (run.json, a resume's settings diff), by
    chexpercept.redaction.redact_field; the identity holds its digest, so a changed secret is still
    refused as a change, without either value shown."""
    from chexpercept.eval.runner.identity import settings_diff
    from chexpercept.redaction import redact_json

    old, new = "sk-proj-OLD111SECRET", "sk-proj-NEW000SECRET"
    extra = {"extra_headers": {"x-api-key": old, "Authorization": "Bearer " + old, "x-trace": "t1"}}
    with FakeServer() as server:
        argv = run_argv(fixture_bundle, tmp_path, server.url, "--paths", "RF")
        argv_old = [*argv, "--request-extra", json.dumps(extra)]
        monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv_old])
        assert main(argv_old) == 0
        info = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
        assert not any(s in everything_written(tmp_path) for s in (old, new))
        fields = info["settings"]["backend_identity"]["request_fields"]["extra_headers"]
        assert fields["x-trace"] == "t1" and fields["x-api-key"].startswith("*** pbkdf2:")
        extra["extra_headers"]["x-api-key"] = new
        argv_new = [*argv, "--request-extra", json.dumps(extra)]
        monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv_new])
        capsys.readouterr()
        assert main(argv_new) != 0  # a changed secret is a changed identity
    err = capsys.readouterr().err
    assert "extra_headers.x-api-key" in err and old not in err and new not in err, err
    assert not any(s in everything_written(tmp_path) for s in (old, new))
    # the one function, without the run's registered secrets: whole values, every occurrence
    diff = settings_diff({"h": {"api-key": "AAAAAAAA1"}}, {"h": {"api-key": "BBBBBBBB2"}})
    assert diff == ["h.api-key: '***' -> '***'"]
    assert redact_json({"token": ["x", "y"], "cookie": {"a": "b"}, "n": 1}) == {
        "token": "***",
        "cookie": "***",
        "n": 1,
    }


def test_the_runs_api_key_is_masked_where_a_server_echoes_it(fixture_bundle, tmp_path, capsys, monkeypatch):
    """Rule: the run's known secrets (the API key read from the environment, header values given) are
    registered with chexpercept.redaction at start and masked in every text printed or written."""
    secret = "sk-live-TOPSECRET987"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    body = {"error": {"message": f"Incorrect API key provided: {secret}.", "code": "invalid_api_key"}}
    with FakeServer(failures=[{"status": 401, "body": body}] * 20) as server:
        argv = run_argv(fixture_bundle, tmp_path, server.url, "--limit", "1")
        monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv])
        assert main(argv) != 0
    assert server.requests[0]["headers"]["Authorization"] == f"Bearer {secret}"  # still sent
    err = capsys.readouterr().err
    assert "Incorrect API key provided: ***" in err, err
    assert secret not in err and secret not in everything_written(tmp_path)


def test_a_key_given_as_the_api_key_env_name_is_refused_unshown(
    fixture_bundle, tmp_path, capsys, monkeypatch
):
    """Rule: --api-key-env is an environment variable's name ([A-Za-z_][A-Za-z0-9_]*), checked by its
    option (eval/backends/options.py env_var_name); anything else is refused without being quoted."""
    pasted = "sk-proj-AbCdEfGh12345678"
    argv = run_argv(fixture_bundle, tmp_path, "http://127.0.0.1:9/v1", "--api-key-env", pasted)
    monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv])
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "--api-key-env must be the name of an environment variable" in err and "looks like a key" in err
    assert pasted not in err and not any(tmp_path.rglob("run.json"))


def test_an_api_key_variable_named_but_not_set_is_refused_before_any_request(
    fixture_bundle, tmp_path, capsys, monkeypatch
):
    """New user on a bad day: --api-key-env MY_KEY with MY_KEY unset ran with no key at all (a real
    API answers 401 later; a server that takes any key, or none, answered). Rule, one place
    (eval/backends/openai/backend.py: api_key_from_env): a variable named on purpose (OPENAI_API_KEY
    too) must hold a usable key: unset, blank, or with a control character (a pasted line break) is
    refused before any request, the key never shown; only OPENAI_API_KEY when not named may be unset
    or blank (no key: a local vllm serve needs none)."""
    monkeypatch.delenv("CHEX_TEST_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeServer() as server:
        for name, value, what in (
            ("CHEX_TEST_KEY", None, "is not set"),
            ("CHEX_TEST_KEY", "", "is blank"),
            ("CHEX_TEST_KEY", "   ", "is blank"),
            ("CHEX_TEST_KEY", "sk-line\nbreak-123456", "holds a control character"),
            ("OPENAI_API_KEY", None, "is not set"),
        ):
            if value is not None:
                monkeypatch.setenv(name, value)
            argv = run_argv(fixture_bundle, tmp_path / "named", server.url, "--api-key-env", name)
            monkeypatch.setattr(sys, "argv", ["eval/run.py", *argv])
            assert main(argv) != 0
            err = capsys.readouterr().err
            assert f"the environment variable {name} that --api-key-env names {what}" in err, err
            assert "sk-line" not in err and "break-123456" not in err  # the value is not shown
            assert not server.requests and not any((tmp_path / "named").rglob("results.jsonl"))
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("CHEX_TEST_KEY", "sk-test-1234567890")
        argv = run_argv(
            fixture_bundle, tmp_path / "set", server.url, "--api-key-env", "CHEX_TEST_KEY", "--limit", "1"
        )
        assert main(argv) == 0
        assert server.requests[-1]["headers"]["Authorization"] == "Bearer sk-test-1234567890"
        for blank in (None, "  "):  # OPENAI_API_KEY not named: unset or blank is no key
            if blank is not None:
                monkeypatch.setenv("OPENAI_API_KEY", blank)
            count = len(server.requests)
            argv = run_argv(fixture_bundle, tmp_path / f"default{blank is None}", server.url, "--limit", "1")
            assert main(argv) == 0
            assert len(server.requests) > count and "Authorization" not in server.requests[-1]["headers"]


def test_a_secret_digest_is_stable_and_slow_to_try_candidates_against():
    """Final red team: run.json held a plain SHA-256 of each secret, so a short one was found again by
    hashing candidates. The digest is now a slow derivation: the same value gives the same digest
    (a resume compares them), no fast hash of the value gives it, and each try costs the rounds."""
    import hashlib
    import json

    from chexpercept.redaction import DIGEST_ITERATIONS, secret_digest

    digest = secret_digest("hunter2")
    assert digest == secret_digest("hunter2") != secret_digest("hunter3")
    assert secret_digest(digest) == digest  # a digest is kept as it is
    tail = digest.rsplit(":", 1)[1]
    for data in (b"hunter2", json.dumps("hunter2").encode()):
        assert tail not in (hashlib.sha256(data).hexdigest()[:16], hashlib.sha512(data).hexdigest()[:16])
    assert DIGEST_ITERATIONS >= 100_000


@pytest.mark.parametrize("pad", [451, 480, 495, 0])
def test_a_secret_cut_by_a_shortened_server_text_shows_no_part_of_itself(
    fixture_bundle, tmp_path, capsys, monkeypatch, pad
):
    """A server's error body is shown cut to 500 characters; it was cut before it was redacted, so an
    API key that straddled the cut showed its first 20 characters on stderr and in failures.jsonl
    (red team, stop 45). Outside text is redacted whole, then cut (``escape.shown``): no prefix of
    the key is written anywhere, wherever the cut falls."""
    key = "sk-ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstu"
    monkeypatch.setenv("MYKEY", key)
    body = {"error": {"message": "a" * pad + f" Incorrect API key provided: {key}."}}
    with FakeServer(failures=[{"status": 400, "body": body}] * 8) as server:
        argv = run_argv(
            fixture_bundle, tmp_path, server.url, "--api-key-env", "MYKEY", "--on-error", "record"
        )
        assert main([*argv, "--limit", "2"]) == 3
    err = capsys.readouterr().err
    written = everything_written(tmp_path)
    prefix = key[:8]  # "sk-ABCDE": any cut of the key shows at least this much of it
    assert "HTTP 400" in err and prefix not in err, err[-2000:]
    assert prefix not in written
    if not pad:  # the whole message fits: the key is masked in it
        assert "Incorrect API key provided: ***" in err


def test_outside_text_is_never_cut_before_it_is_shown():
    """The rule above, for every place: no ``terminal(<text>[:N])`` (cut, then redacted) in the
    toolkit's source; such text goes through ``escape.shown``."""
    import re

    root = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"terminal\([^()]*(?:\([^()]*\))?[^()]*\[:\s*\d+\s*\]\s*\)")
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for folder in ("eval", "chexpercept", "metrics", "builder")
        for path in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("form", ["a key with a space after it", "a password percent-encoded in the URL"])
def test_a_secret_is_masked_in_every_form_it_travels_in(fixture_bundle, tmp_path, capsys, monkeypatch, form):
    """A key pasted with a space after it was registered with the space and travelled without it; a
    password percent-encoded in --base-url was registered encoded and travelled decoded (as HTTP
    Basic credentials): a server's echo of either showed it whole on stderr and in failures.jsonl
    (red team, stop 45). Every form a secret travels in is masked (redaction.secret_forms, and the
    Basic credentials' base64)."""
    import base64

    if form.startswith("a key"):
        monkeypatch.setenv("MYKEY", "sk-topsecretKEY1234567 ")
        travels = ["sk-topsecretKEY1234567"]
        extra = ["--api-key-env", "MYKEY"]
    else:
        travels = ["pa/ss-word99", base64.b64encode(b"user:pa/ss-word99").decode()]
        extra = []
    echo = {"status": 400, "body": {"error": {"message": f"bad credentials {' and '.join(travels)} given"}}}
    with FakeServer(failures=[echo] * 8) as server:
        url = server.url if extra else server.url.replace("http://", "http://user:pa%2Fss-word99@")
        argv = run_argv(fixture_bundle, tmp_path, url, *extra, "--on-error", "record", "--max-retries", "0")
        assert main([*argv, "--limit", "2"]) == 3
    err = capsys.readouterr().err
    assert "bad credentials" in err, err[-2000:]
    assert not any(t in err or t in everything_written(tmp_path) for t in travels), err[-2000:]
