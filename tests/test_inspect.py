"""CheXpercept in Inspect AI (docs/inspect.md): the installed task against our runner, and what it
refuses.

The parity test runs ``inspect eval chexpercept/chexpercept`` (the command users run, found through
the entry point) and ``chexpercept run --backend openai`` against two scripted loopback servers
that answer by the conversation alone: both must send the same conversations, get the same answers
and give the same numbers, case for case. Needs the ``inspect`` extra (scripts/test.sh installs it);
run by hand without it, the tests skip with a loud reason; under scripts/test.sh or CI they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest
from fake_openai import FakeServer, conversation_of, scripted_reply

from chexpercept.results import iter_results

try:
    import inspect_ai
except ImportError:  # pragma: no cover - the inspect extra is missing
    inspect_ai = None

pytestmark = pytest.mark.inspect_ai


@pytest.fixture(autouse=True)
def _inspect_ai_installed() -> None:
    """Fail (under scripts/test.sh or CI) or skip each test here when inspect-ai is missing.

    Checked per test, never at import: the other environments of scripts/test.sh (SAM 3, vLLM,
    lmms-eval) collect this module too, without inspect-ai, and deselect it by its marker.
    """
    if inspect_ai is not None:
        return
    message = "INSPECT TESTS NOT RUN: inspect-ai is not installed (pip install -e '.[inspect]')"
    required = os.environ.get("CI") or os.environ.get("CHEXPERCEPT_REQUIRE_INSPECT")
    if required and os.environ.get("CHEXPERCEPT_SKIP_INSPECT") != "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


MODEL = "local-vlm"
#: the parity test's cases: every route of a lesion with Stage 4 attributes and of cardiomegaly
#: (none); the whole phantom bundle takes about three times as long, and bench/inspect_vs_runner.py
#: runs 42 cases
LESIONS = ("cardiomegaly", "effusion")


def inspect_env(data_home: Path) -> dict[str, str]:
    """The environment of an ``inspect`` command: no proxy, Inspect's own files (traces, the realtime
    sample buffer) under ``data_home`` instead of ~/.local/share."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["XDG_DATA_HOME"] = str(data_home)
    return env


def run_inspect(bundle: Path, url: str, log_dir: Path, *args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("inspect")
    cmd = [
        str(exe) if exe.exists() else shutil.which("inspect") or "inspect",
        *("eval", "chexpercept/chexpercept", "-T", f"data_dir={bundle}", "-T", "oracle=implicit"),
        *("-T", f"lesions={','.join(LESIONS)}"),
        *("--model", f"vllm/{MODEL}", "--model-base-url", url, "--no-log-images"),
        *("--log-dir", str(log_dir), "--display", "none", "--log-level", "warning", *args),
    ]
    env = inspect_env(log_dir.parent / "xdg")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def test_inspect_gives_our_runners_answers_and_scores(phantom_bundle, tmp_path):
    from inspect_ai.log import read_eval_log

    from chexpercept.cli import main as cli
    from chexpercept.eval.harnesses.inspect_ai.scorer import METRIC_KEYS, log_records

    ours, theirs = FakeServer(reply=scripted_reply), FakeServer(reply=scripted_reply)
    with ours, theirs:
        started = time.monotonic()
        rc = cli(
            [
                *("run", "--data-dir", str(phantom_bundle), "--model", MODEL, "--backend", "openai"),
                *("--base-url", ours.url, "--output-dir", str(tmp_path / "runs"), "--no-progress"),
                *("--lesions", *LESIONS),
            ]
        )
        assert rc == 0
        middle = time.monotonic()
        done = run_inspect(phantom_bundle, theirs.url, tmp_path / "logs")
        print(f"our runner {middle - started:.1f} s, inspect eval {time.monotonic() - middle:.1f} s")
    assert done.returncode == 0, done.stdout + done.stderr

    # the same conversations went out: system message, texts, images (the same bytes), history
    sent = Counter(json.dumps(conversation_of(r["body"])) for r in ours.requests)
    assert sent == Counter(json.dumps(conversation_of(r["body"])) for r in theirs.requests)
    assert conversation_of(theirs.requests[0]["body"])[0][0] == "system"
    assert {r["body"]["temperature"] for r in theirs.requests} == {0.0}  # greedy, as our runner

    # the same answers, verdicts and oracle patches, case for case; sample ids are key_ids
    (path,) = (tmp_path / "logs").glob("*.eval")
    log = read_eval_log(str(path))
    assert log.status == "success"
    run_dir = tmp_path / "runs" / MODEL / "oracle_implicit"
    expected = {r.key_id: r for r in iter_results(run_dir / "results.jsonl")}
    got = {r.key_id: r for r in log_records(log)}
    assert sorted(s.id for s in log.samples) == sorted(expected) == sorted(got)
    assert len(expected) == 6 and {r.path for r in expected.values()} == {"RR", "RF", "LF"}
    for key_id, record in expected.items():
        assert got[key_id].conversation == record.conversation, key_id
        for a, b in zip(got[key_id].turns, record.turns, strict=True):
            assert (a.task, a.response, a.parsed, a.correct, a.patched_to, a.oracle_text) == (
                b.task,
                b.response,
                b.parsed,
                b.correct,
                b.patched_to,
                b.oracle_text,
            ), key_id
    assert any(not t.correct for r in expected.values() for t in r.turns)  # the script errs
    assert any(t.patched_to for r in expected.values() for t in r.turns)  # and the oracle fires

    # the same numbers as `chexpercept score` on our runner's answers
    out = tmp_path / "score.json"
    assert cli(["score", str(run_dir), "--output", str(out)]) == 0
    flat = json.loads(out.read_text())
    (scores,) = log.results.scores
    metrics = {name: m.value for name, m in scores.metrics.items()}
    assert set(metrics) == set(METRIC_KEYS)
    for key in METRIC_KEYS:
        assert metrics[key] == pytest.approx(flat[key]), key
    sample = log.samples[0]
    assert set(sample.scores["chexpercept_turns"].value) == set(sample.metadata["turns"])

    # inspect view shows the conversation; the log holds no pixels, each image by its path
    assert any("[image: chexpercept/" in m.text for m in sample.messages if m.role == "user")
    with zipfile.ZipFile(path) as z:
        assert not any(b"base64," in z.read(name) for name in z.namelist())


def eval_one(task_args: dict, tmp_path: Path, **kwargs):
    """One sample of our task through inspect_ai.eval in this process; the log."""
    from inspect_ai import eval as inspect_eval

    kwargs.setdefault("log_images", False)
    (log,) = inspect_eval(
        "chexpercept/chexpercept",
        task_args=task_args,
        log_dir=str(tmp_path / "logs"),
        display="none",
        limit=1,
        **kwargs,
    )
    return log


def model_at(server) -> str:
    """A model name of its own for each server: Inspect reuses a model (and its HTTP client) by name
    within a process."""
    return f"vllm/{MODEL}-{server.url.split(':')[-1].split('/')[0]}"


def error_of(log) -> str:
    assert log.status == "error"
    return log.error.message


def test_inspect_refuses_what_the_data_use_agreement_forbids(fixture_bundle, tmp_path, monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "not-a-key")
    args = {"data_dir": str(fixture_bundle)}
    with FakeServer() as server:
        model = {"model": model_at(server), "model_base_url": server.url}
        # images in Inspect's log
        text = error_of(eval_one(args, tmp_path, **model, log_images=True))
        assert "--no-log-images" in text and "credentialed" in text
        # --batch keeps the inputs server side
        text = error_of(eval_one(args, tmp_path, **model, batch=True))
        assert "batch" in text and "server side" in text and "-T dua_compliant=true" in text
        assert not server.requests  # nothing was sent
        # declared: the same run goes through
        log = eval_one({**args, "dua_compliant": True}, tmp_path, **model)
        assert log.status == "success" and server.requests
    with FakeServer() as server:
        # a proxy from the environment would receive the images (the generic OpenAI-compatible
        # provider: the vllm provider asks the server for its models through the proxy first)
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
        monkeypatch.setenv("LOCAL_API_KEY", "not-a-key")
        proxied = {"model": f"openai-api/local/{MODEL}", "model_base_url": server.url}
        text = error_of(eval_one(args, tmp_path, **proxied))
        assert "proxy http://127.0.0.1:9" in text and "NO_PROXY" in text and not server.requests
        monkeypatch.delenv("HTTP_PROXY")
    # another account's server on the port (the owner as the kernel's socket table would say)
    with FakeServer() as server:
        monkeypatch.setattr("chexpercept.tcp_table.owner", lambda *a: os.geteuid() + 4242)
        text = error_of(
            eval_one(args, tmp_path, model=f"openai-api/local/{MODEL}", model_base_url=server.url)
        )
        assert "belongs to account" in text and not server.requests
    # a provider's public API, and a host that is not this machine (never contacted: refused first)
    text = error_of(eval_one(args, tmp_path, model="openai/gpt-5.4"))
    assert "public API" in text and "zero data retention" in text and "-T dua_compliant=true" in text
    remote = {"model": f"openai-api/local/{MODEL}", "model_base_url": "http://192.0.2.7/v1"}
    text = error_of(eval_one(args, tmp_path, **remote))
    assert "192.0.2.7" in text and "not this machine" in text


def test_the_vllm_provider_s_server_is_checked_as_every_other_one(fixture_bundle, tmp_path, monkeypatch):
    """Inspect's vllm provider keeps --model-base-url (or VLLM_BASE_URL) aside until its first call,
    with ``base_url`` None: the task took it for a server Inspect starts itself and checked nothing,
    so another account's server, a remote host and a proxy from the environment received the X-rays
    (red team, stop 43). The URL is now read however the provider keeps it (rules.endpoint_of)."""
    for var in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "VLLM_BASE_URL",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "not-a-key")
    args = {"data_dir": str(fixture_bundle)}
    with FakeServer() as server, monkeypatch.context() as patched:
        patched.setattr("chexpercept.tcp_table.owner", lambda *a: os.geteuid() + 4242)
        text = error_of(eval_one(args, tmp_path, model=model_at(server), model_base_url=server.url))
        assert "belongs to account" in text, text
        patched.setenv("VLLM_BASE_URL", server.url)  # the provider's own variable, no --model-base-url
        text = error_of(eval_one(args, tmp_path, model=f"vllm/{MODEL}-env"))
        assert "belongs to account" in text, text
        assert not [r for r in server.requests if r["path"].endswith("/chat/completions")]
    with FakeServer() as proxy, FakeServer() as server:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.rsplit("/v1", 1)[0])
        text = error_of(eval_one(args, tmp_path, model=model_at(server), model_base_url=server.url))
        assert f"through the proxy {proxy.url.rsplit('/v1', 1)[0]}" in text, text
        monkeypatch.delenv("HTTP_PROXY")
        assert not [r for r in proxy.requests + server.requests if r["path"].endswith("/chat/completions")]
    text = error_of(
        eval_one(args, tmp_path, model=f"vllm/{MODEL}-remote", model_base_url="http://192.0.2.7/v1")
    )
    assert "192.0.2.7" in text and "not this machine" in text, text


def test_inspect_s_own_files_of_our_runs_are_private_whatever_the_umask(
    fixture_bundle, tmp_path, monkeypatch
):
    """Inspect wrote its log (every case's key_id, questions and answers) 0644 in a 0755 folder, and its
    traces likewise, under the user's umask: another account read them (red team, stop 43). A run of
    our tasks writes them owner-only, and leaves the umask as it found it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for folder in ("data/inspect_ai", "cache/inspect_ai"):
        (tmp_path / folder).mkdir(parents=True, mode=0o755)
        os.chmod(tmp_path / folder, 0o755)
    before = os.umask(0o022)
    try:
        # Inspect's trace file as its process start makes it (0644), opened by another account
        # (red team, stop 48: through a handle on traces/ it read every sample's key_id)
        from inspect_ai._util import logger as inspect_logger
        from inspect_ai._util.trace import inspect_trace_dir

        inspect_logger.init_logger(None)
        trace = inspect_logger._logHandler["handler"].trace_logger
        trace_file = Path(trace.baseFilename)
        trace_file.parent.mkdir(parents=True, exist_ok=True)
        if trace.stream is not None:
            trace.stream.close()
        trace_file.unlink(missing_ok=True)
        trace.stream = open(trace_file, "a")  # noqa: SIM115 (as Inspect opens it, under umask 022)
        assert trace_file.stat().st_mode & 0o077
        other_account = open(trace_file)  # noqa: SIM115
        monkeypatch.setenv("VLLM_API_KEY", "not-a-key")
        with FakeServer() as server:
            log = eval_one(
                {"data_dir": str(fixture_bundle)}, tmp_path, model=model_at(server), model_base_url=server.url
            )
        assert os.umask(0o022) == 0o022  # as it was
    finally:
        os.umask(before)
    assert log.status == "success"
    seen = other_account.read()
    other_account.close()
    assert "sample=" not in seen and "cardiomegaly" not in seen, seen[-500:]
    assert trace_file.stat().st_mode & 0o077 == 0 and "sample=" in trace_file.read_text()
    assert inspect_trace_dir().stat().st_mode & 0o077 == 0
    # round 2 (helper-54): a link planted at the trace file's path (to another account's file) while
    # traces/ was open to others: the next run of ours writes to a new file of its own, not through it
    stolen = tmp_path / "stolen.log"
    stolen.write_text("")
    if trace.stream is not None:
        trace.stream.close()
        trace.stream = None
    trace_file.unlink()
    trace_file.symlink_to(stolen)
    with FakeServer() as server:
        log = eval_one(
            {"data_dir": str(fixture_bundle)}, tmp_path, model=model_at(server), model_base_url=server.url
        )
    assert log.status == "success" and "sample=" not in stolen.read_text()
    assert not trace_file.is_symlink() and trace_file.stat().st_mode & 0o077 == 0
    location = Path(log.location)
    assert location.stat().st_mode & 0o077 == 0  # its folder may be a shared one: its names say nothing
    for folder in ("data/inspect_ai", "cache/inspect_ai"):
        assert (tmp_path / folder).stat().st_mode & 0o077 == 0, folder


def test_inspect_says_what_is_wrong_with_the_data_or_the_model(fixture_bundle, tmp_path, monkeypatch):
    from inspect_ai import eval as inspect_eval

    with pytest.raises(Exception, match="-T data_dir=DIR"):
        inspect_eval("chexpercept/chexpercept", model="mockllm/model", display="none", log_dir=str(tmp_path))
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "notes.txt").write_text("not a release")
    with pytest.raises(Exception, match="not a CheXpercept release"):
        eval_one({"data_dir": str(tmp_path / "downloads")}, tmp_path, model="mockllm/model")
    args = {"data_dir": str(fixture_bundle), "paths": "RR"}
    text = error_of(
        eval_one(args, tmp_path, model="vllm-completions/x", model_base_url="http://127.0.0.1:9/v1")
    )
    assert "cannot take a chat with images" in text
    limit = {"limit_mm_per_prompt": {"image": 1}}
    with FakeServer() as server:
        log = eval_one(args, tmp_path, model=model_at(server), model_base_url=server.url, model_args=limit)
        assert "allows 1 image(s) per request" in error_of(log) and not server.requests
    rejection = {
        "status": 400,
        "body": {"error": {"message": "At most 1 image(s) may be provided in one request."}},
    }
    with FakeServer(failures=[rejection]) as server:
        text = error_of(eval_one(args, tmp_path, model=model_at(server), model_base_url=server.url))
    assert "turn detection" in text and "rejected the request" in text and "1 image(s)" in text


def test_records_of_two_evals_are_never_scored_as_one_run(fixture_bundle, tmp_path, monkeypatch, capsys):
    """Red team, stop 48: records of Inspect logs carried no run identity, so a results.jsonl merged
    from an eval at temperature 0 and one at temperature 1 (or of two models) was scored as one run;
    and ``inspect eval-retry`` over a release changed in place kept the old release's finished
    samples beside the new one's, scored as one. Each record now carries its eval's identity
    (model, answer-changing settings, oracle, parse mode, release, prompts: ``run_identity``):
    ``chexpercept score`` refuses the mix, and so does the task's metric."""
    import shutil

    from inspect_ai import eval as inspect_eval
    from inspect_ai.log import read_eval_log

    from chexpercept.cli import main as cli
    from chexpercept.eval.harnesses.inspect_ai.scorer import log_records

    monkeypatch.setenv("VLLM_API_KEY", "not-a-key")
    bundle = tmp_path / "bundle"
    shutil.copytree(fixture_bundle, bundle)
    (bundle / "chexpercept.json").chmod(0o600)
    args = {"data_dir": str(bundle), "paths": "LF"}
    common = {"task_args": args, "display": "none", "log_images": False, "limit": 2}
    with FakeServer() as server:
        model = {"model": model_at(server), "model_base_url": server.url}
        logs = [
            inspect_eval(
                "chexpercept/chexpercept", log_dir=str(tmp_path / f"t{t}"), temperature=t, **model, **common
            )[0]
            for t in (0.0, 1.0)
        ]
        assert [log.status for log in logs] == ["success", "success"]
        one, two = (log_records(read_eval_log(log.location)) for log in logs)
        assert (
            one[0].run["harness"] == "inspect_ai" and one[0].run["fingerprint"] != two[0].run["fingerprint"]
        )
        folder = tmp_path / "runs" / "m" / "oracle_implicit"
        folder.mkdir(parents=True)
        (folder / "results.jsonl").write_text(one[0].to_json() + "\n" + two[1].to_json() + "\n")
        capsys.readouterr()
        assert cli(["score", str(folder)]) == 2
        assert "made by 2 different runs" in capsys.readouterr().err
        (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in one))
        assert cli(["score", str(folder)]) == 0  # one eval's records: scored
        # round 2 (helper-53): an eval of other settings as the model's oracle_none: not one row
        none = folder.parent / "oracle_none"
        none.mkdir()
        lines = [json.loads(r.to_json()) for r in two]
        (none / "results.jsonl").write_text(
            "".join(json.dumps({**x, "oracle": "none"}) + "\n" for x in lines)
        )
        capsys.readouterr()
        assert cli(["score", str(folder.parent)]) == 2
        assert "records of evals made under different settings" in capsys.readouterr().err
        # an eval stopped by a refused request after two samples, its release then changed in place,
        # then retried (as the command line does both)
        refused = {"status": 400, "body": {"error": "refused"}}
        server.failures = ["ok", "ok", *[refused] * 4]
        exe = Path(sys.executable).with_name("inspect")
        env = {**inspect_env(tmp_path / "xdg"), "VLLM_API_KEY": "not-a-key"}
        flags = [
            "--model",
            model_at(server),
            "--model-base-url",
            server.url,
            "--no-log-images",
            "--display",
            "none",
        ]
        subprocess.run(
            [str(exe), "eval", "chexpercept/chexpercept", "-T", f"data_dir={bundle}", "-T", "paths=LF",
             "--max-samples", "1", "--log-dir", str(tmp_path / "r"), *flags],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        (stopped,) = (tmp_path / "r").glob("*.eval")
        assert read_eval_log(str(stopped)).status == "error"
        server.failures = []
        release = json.loads((bundle / "chexpercept.json").read_text())
        for entry in release.values():
            question = entry["detection_qa"]["question"]
            entry["detection_qa"]["question"] = question.replace("Is any", "Is there any", 1)
        (bundle / "chexpercept.json").write_text(json.dumps(release))
        done = subprocess.run(
            [str(exe), "eval-retry", str(stopped), "--log-dir", str(tmp_path / "retry"), "--display", "none"],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
    (retried,) = [read_eval_log(str(p)) for p in (tmp_path / "retry").glob("*.eval")]
    assert retried.status == "error" and "different runs" in str(retried.error), done.stderr[-2000:]


def test_an_eval_made_with_strict_parsing_is_scored_with_it(fixture_bundle, tmp_path, monkeypatch, capsys):
    """Round 2 (helper-53): an eval made with ``-T parse_mode=strict`` had every verdict strict, yet
    the task's metric and ``chexpercept score`` of its records read the answers with reference
    parsing (End-to-End stage 1 0.75 against the runner's 0.0). The records name their parse mode
    (``run_identity``), and a run without run.json is read in it."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.log import read_eval_log

    from chexpercept.cli import main as cli
    from chexpercept.eval.harnesses.inspect_ai.scorer import log_records

    monkeypatch.setenv("VLLM_API_KEY", "not-a-key")
    args = {"data_dir": str(fixture_bundle), "paths": "LF", "parse_mode": "strict"}
    with FakeServer(reply=lambda body: "I think it is option 2.") as server:  # right, if read loosely
        (log,) = inspect_eval(
            "chexpercept/chexpercept", task_args=args, model=model_at(server), model_base_url=server.url,
            log_dir=str(tmp_path / "logs"), display="none", log_images=False, limit=2, temperature=0.0,
        )  # fmt: skip
    assert log.status == "success"
    metrics = {k: m.value for s in log.results.scores for k, m in s.metrics.items()}
    assert metrics["e2e/stage1/all"] == 0.0, metrics  # strict reads no answer in those replies
    records = log_records(read_eval_log(log.location))
    folder = tmp_path / "runs" / "m" / "oracle_implicit"
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(r.to_json() + "\n" for r in records))
    capsys.readouterr()
    assert cli(["score", str(folder), "--greedy"]) == 0  # no run.json: the decoding is said here
    assert json.loads(capsys.readouterr().out)["e2e/stage1/all"] == 0.0
