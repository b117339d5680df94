"""The openai backend against replies and errors as real APIs send them (issue: field cases 3-6).

A loopback server reproduces each quirk: failed requests must never become answers, answers outside
``message.content`` must be kept, back-off hints in every form must be honoured, a request field
must be removable, and API models outside the registry must not get a temperature their family
rejects.
"""

from __future__ import annotations

import email.utils
import json
import time

import pytest
from fake_openai import FakeServer, backend_for, run_cases

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.openai.backend import OpenAIBackend, RetryPolicy
from chexpercept.eval.backends.openai.retries import parse_duration, retry_hint
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.run import EXIT_UNFINISHED, main
from chexpercept.metrics import score_path
from chexpercept.results import iter_results, read_failures

BAD_SETTING = {
    "status": 400,
    "body": {
        "error": {
            "message": "Unsupported value: 'temperature' does not support 0 with this model.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "unsupported_value",
        }
    },
}
AZURE_FILTER = {
    "status": 400,
    "body": {
        "error": {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
            "code": "content_filter",
            "innererror": {"code": "ResponsibleAIPolicyViolation"},
        }
    },
}


def lf_effusion(bundle_dir):
    return read_bundle(bundle_dir, lesions=["effusion"], paths=["LF"])  # one case, one turn


def cli(bundle_dir, out, server, *extra, model="local-vlm"):
    argv = ["--data-dir", str(bundle_dir), "--model", model, "--backend", "openai", "--base-url", server.url]
    return main(
        [*argv, "--output-dir", str(out), "--no-progress", "--paths", "LF", "--max-retries", "0", *extra]
    )


# ---------------------------------------------------------------------------- 3. failed requests
def test_a_rejected_request_is_never_scored_and_a_rerun_retries_it(fixture_bundle, tmp_path, capsys):
    folder = tmp_path / "local-vlm" / "oracle_implicit"
    with FakeServer(failures=[BAD_SETTING, BAD_SETTING]) as server:
        rc = cli(fixture_bundle, tmp_path, server, "--on-error", "record")
    err = capsys.readouterr().err
    assert rc == EXIT_UNFINISHED
    assert "2 of 7 cases are unfinished because a request failed" in err and "rerun the same command" in err
    failures = read_failures(folder / "failures.jsonl")
    assert len(failures) == 2 and all("HTTP 400" in f.error and "temperature" in f.error for f in failures)
    finished = {r.key_id for r in iter_results(folder / "results.jsonl")}
    assert len(finished) == 5 and not {f.key_id for f in failures} & finished
    info = json.loads((folder / "run.json").read_text())
    assert info["finished"] is None and info["unfinished_cases"] == 2
    # score counts and names them, and scores only the model's answers
    report = score_path(folder)
    assert report.counts["cases"] == 5 and report.counts["unfinished_cases"] == {"implicit": 2}
    note = next(n for n in report.notes if "failures.jsonl" in n)
    assert "2 cases have no result because a request failed" in note and failures[0].key_id in note
    # so does the report
    from chexpercept.metrics.report.build import write_report

    out = write_report(tmp_path, tmp_path / "report", n_resamples=0, plots=False)
    assert any("2 cases have no result because a request failed" in n for n in out.notes)
    assert "2 cases have no result because a request failed" in out.index_html.read_text()
    # the rerun retries exactly those two and completes the run
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, "--on-error", "record") == 0
        assert len(server.requests) == 2
    assert len(list(iter_results(folder / "results.jsonl"))) == 7
    assert json.loads((folder / "run.json").read_text())["finished"]
    assert not any("failures.jsonl" in n for n in score_path(folder).notes)


def test_a_transport_failure_stops_the_run_by_default(fixture_bundle, tmp_path, capsys):
    with FakeServer(failures=[503] * 5) as server:
        rc = cli(fixture_bundle, tmp_path, server)
    err = capsys.readouterr().err
    assert rc == 2 and "rerun the same command" in err and "--on-error record" in err
    results = tmp_path / "local-vlm" / "oracle_implicit" / "results.jsonl"
    assert not results.exists() or all(r.turns[0].response == "Answer: 1" for r in iter_results(results))


def test_a_content_filter_rejection_is_recorded_as_a_refusal(fixture_bundle):
    bundle = lf_effusion(fixture_bundle)
    with FakeServer(failures=[AZURE_FILTER]) as server:
        (record,) = run_cases(backend_for(server, on_error="record"), bundle)
    turn = record.turns[0]
    assert turn.refusal.startswith("content filter: HTTP 400") and turn.response == ""
    assert turn.parse_status == "unparsed" and not turn.correct
    # without --on-error record the run stops and says how to record them
    with FakeServer(failures=[AZURE_FILTER]) as server, pytest.raises(Exception, match="--on-error record"):
        run_cases(backend_for(server), bundle)


def test_api_models_outside_the_registry_get_the_papers_api_temperature():
    for model_id in (
        "gpt-5-mini",
        "gpt-5.4-2026-03-05-custom",
        "o3",
        "o4-mini",
        "openai/gpt-5",
        "gemini-2.5-pro",
    ):
        assert resolve(model_id, backend="openai").sampling["temperature"] == 1.0, model_id
    for model_id in ("local-vlm", "Qwen/Qwen2.5-VL-7B-Instruct", "gpt-4o", "solo3-vlm"):
        assert resolve(model_id, backend="openai").sampling["temperature"] == 0.0, model_id
    # open models keep greedy decoding on every backend
    assert resolve("google/medgemma-1.5-4b-it", backend="vllm").sampling["temperature"] == 0.0


# ----------------------------------------------------------------- 4. answers outside content
def test_reasoning_outside_content_is_kept_and_parsed_by_the_familys_rules(fixture_bundle):
    bundle = lf_effusion(fixture_bundle)
    replies = [
        # vLLM serve --reasoning-parser qwen3 (vLLM < 0.16), cut off by the token limit
        {
            "message": {"content": None, "reasoning_content": "Draft: Answer: 1\nWait"},
            "finish_reason": "length",
        },
        # the same with vLLM >= 0.16's field name, reasoning finished
        {"message": {"content": "\n\nAnswer: 2", "reasoning": "Draft: Answer: 1"}},
    ]
    for reply, response, full, strict, reference in [
        (replies[0], "", "<think>Draft: Answer: 1\nWait", [-1], ([1], "reasoning")),
        (replies[1], "\n\nAnswer: 2", "<think>Draft: Answer: 1</think>\n\nAnswer: 2", [2], ([2], "answer")),
    ]:
        for mode in ("strict", "reference"):
            with FakeServer(failures=[reply]) as server:
                backend = backend_for(server, model="qwen3.6-27b", on_error="record")
                backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
                records = []
                run_conversations(
                    bundle.cases,
                    backend,
                    oracle="none",
                    parse_mode=mode,
                    batch_size=1,
                    on_finished=records.extend,
                )
            turn = records[0].turns[0]
            assert turn.response == response and turn.full_response == full
            if mode == "strict":
                assert turn.parsed == strict
            else:
                assert (turn.parsed, turn.parse_status) == reference


def test_a_refusal_is_kept_and_counted(fixture_bundle, tmp_path):
    refusal = {"message": {"content": None, "refusal": "I can't help with interpreting this image."}}
    with FakeServer(failures=[refusal]) as server:
        assert cli(fixture_bundle, tmp_path, server, "--no-score") == 0
    folder = tmp_path / "local-vlm" / "oracle_implicit"
    refused = [t for r in iter_results(folder / "results.jsonl") for t in r.turns if t.refusal]
    assert len(refused) == 1 and refused[0].refusal == "I can't help with interpreting this image."
    assert refused[0].parse_status == "unparsed"
    report = score_path(folder)
    assert report.parse["implicit"]["detection"]["refused"] == 1
    assert any("1 answers were refusals" in n for n in report.notes)


def test_a_run_whose_answers_keep_coming_back_empty_warns(fixture_bundle, tmp_path, capsys):
    empty = {"message": {"content": None}}
    with FakeServer(failures=[empty] * 40) as server:
        assert cli(fixture_bundle, tmp_path, server, "--paths", "LF", "RF", "--no-score") == 0
    err = capsys.readouterr().err
    assert err.count("came back empty") == 1 and "reasoning parser" in err


# ---------------------------------------------------------------------------- 5. back-off hints
def test_every_form_of_back_off_hint_is_read():
    now = time.time()
    date = email.utils.formatdate(now + 5, usegmt=True)
    assert retry_hint({"Retry-After": "7"}) == 7.0
    assert retry_hint({"Retry-After": date}, now=now) == pytest.approx(5.0, abs=1.0)
    assert retry_hint({"retry-after-ms": "1500", "Retry-After": "9"}) == 1.5  # ms first (OpenAI SDK)
    gemini = [
        {
            "error": {
                "code": 429,
                "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}],
            }
        }
    ]
    assert retry_hint({}, json.dumps(gemini)) == 37.0  # OpenAI-compatible endpoint: a list
    assert retry_hint({}, json.dumps(gemini[0])) == 37.0  # native API: an object
    headers = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}
    assert retry_hint(headers) == 360.0
    assert retry_hint({}) is None and retry_hint({"Retry-After": "soon"}) is None
    assert (
        parse_duration("20ms") == 0.02
        and parse_duration("1h2m3.5s") == 3723.5
        and parse_duration("x") is None
    )


@pytest.mark.parametrize(
    "headers,body,wait",
    [
        ({"Retry-After": "__DATE__"}, {"error": "rate limited"}, 1.0),
        ({"retry-after-ms": "1200"}, {"error": "rate limited"}, 1.2),
        ({"Retry-After": "1"}, {"error": "rate limited"}, 1.0),
        ({}, [{"error": {"code": 429, "details": [{"retryDelay": "1.3s"}]}}], 1.3),
        ({"x-ratelimit-reset-requests": "1100ms"}, {"error": "rate limited"}, 1.1),
    ],
)
def test_the_wait_honours_the_servers_hint(fixture_bundle, headers, body, wait):
    if headers.get("Retry-After") == "__DATE__":  # an HTTP date 2 s ahead (whole seconds: 1 to 2 s)
        headers = {"Retry-After": email.utils.formatdate(time.time() + 2, usegmt=True)}
    bundle = lf_effusion(fixture_bundle)
    policy = RetryPolicy(max_retries=1, base_delay=0.01, max_delay=30)  # without the hint: 10 ms
    with FakeServer(failures=[{"status": 429, "headers": headers, "body": body}]) as server:
        (record,) = run_cases(backend_for(server, retry=policy), bundle)
    assert record.turns[0].usage["attempts"] == 2
    assert server.times[1] - server.times[0] >= wait * 0.9


# ------------------------------------------------------------------- 6. removing a request field
def test_a_null_in_request_extra_removes_the_field(fixture_bundle, tmp_path):
    with FakeServer() as server:
        extra = '{"max_completion_tokens": null, "max_tokens": 64, "seed": 3}'
        assert cli(fixture_bundle, tmp_path, server, "--request-extra", extra, "--no-score") == 0
        spec = resolve("gpt-5.4")
        backend = OpenAIBackend(
            spec,
            sampling=Sampling(**spec.sampling, greedy=False),
            base_url=server.url,
            request_extra={"reasoning_effort": None, "temperature": None},
        )
        backend.setup(RunContext(root=read_bundle(fixture_bundle).root, cases=[]))
    body = server.requests[0]["body"]
    assert "max_completion_tokens" not in body and body["max_tokens"] == 64 and body["seed"] == 3
    payload = backend.build_payload(Conversation(read_bundle(fixture_bundle).cases[0], oracle="none").pending)
    assert "reasoning_effort" not in payload and "temperature" not in payload
    assert payload["frequency_penalty"] == 0.0  # the registry's other fields stay


# ------------------------------------------------------------------ found by a tester, siblings
def test_a_filtered_reply_with_text_is_still_no_answer(fixture_bundle):
    bundle = lf_effusion(fixture_bundle)
    filtered = {"message": {"content": "Answer: 1"}, "finish_reason": "content_filter"}
    with FakeServer(failures=[filtered]) as server:
        (record,) = run_cases(backend_for(server), bundle)
    turn = record.turns[0]
    assert turn.refusal and turn.response == "Answer: 1" and turn.parsed == [-1] and not turn.correct


@pytest.mark.parametrize(
    "content,text",
    [
        ([{"type": "text", "text": None}], ""),
        (["Answer: 2"], "Answer: 2"),
        ([{"type": "text", "text": "Answer: "}, {"type": "text", "text": "2"}], "Answer: 2"),
    ],
)
def test_content_parts_in_every_shape(fixture_bundle, content, text):
    bundle = lf_effusion(fixture_bundle)
    with FakeServer(failures=[{"message": {"content": content}}]) as server:
        (record,) = run_cases(backend_for(server), bundle)
    assert record.turns[0].response == text


def test_a_reply_cut_off_mid_body_is_retried(fixture_bundle):
    bundle = lf_effusion(fixture_bundle)
    cut = {"raw": b'{"choices": [{"message": {"content": "Ans', "content_length": 500}
    with FakeServer(failures=[cut]) as server:
        (record,) = run_cases(backend_for(server), bundle)
    assert record.turns[0].usage["attempts"] == 2 and record.turns[0].response == "Answer: 1"


def test_an_error_inside_a_200_reply_is_retried_or_failed(fixture_bundle):
    bundle = lf_effusion(fixture_bundle)
    passing = {"raw": json.dumps({"error": {"code": 502, "message": "upstream error"}}).encode()}
    with FakeServer(failures=[passing]) as server:
        (record,) = run_cases(backend_for(server), bundle)
    assert record.turns[0].usage["attempts"] == 2
    lasting = {"raw": json.dumps({"error": {"code": 400, "message": "bad model"}}).encode()}
    with FakeServer(failures=[lasting]) as server, pytest.raises(Exception, match="error in the reply"):
        run_cases(backend_for(server), bundle)


def test_a_wrong_key_or_url_stops_the_run_even_with_on_error_record(fixture_bundle, tmp_path, capsys):
    unauthorized = {"status": 401, "body": {"error": {"message": "Incorrect API key provided"}}}
    with FakeServer(failures=[unauthorized] * 10) as server:
        rc = cli(fixture_bundle, tmp_path, server, "--on-error", "record")
        assert len(server.requests) <= 8  # the first step's requests, not the whole benchmark
    assert rc == 2 and "Every request would fail the same way" in capsys.readouterr().err
    assert not (tmp_path / "local-vlm" / "oracle_implicit" / "failures.jsonl").exists()


def test_a_flagged_prompt_is_a_refusal(fixture_bundle):
    flagged = {
        "status": 400,
        "body": {
            "error": {
                "message": "Invalid prompt: flagged as potentially violating our usage policy",
                "code": "invalid_prompt",
            }
        },
    }
    with FakeServer(failures=[flagged]) as server:
        (record,) = run_cases(backend_for(server, on_error="record"), lf_effusion(fixture_bundle))
    assert record.turns[0].refusal.startswith("content filter") and record.turns[0].parsed == [-1]


@pytest.mark.parametrize(
    "extra,sent",
    [('{"max_completion_tokens": 64}', {"max_completion_tokens": 64}),
     ('{"max_completion_tokens": null, "max_tokens": 48}', {"max_tokens": 48}),
     ('{"max_completion_tokens": 32, "max_tokens": 32}', {"max_completion_tokens": 32, "max_tokens": 32})],
)  # fmt: skip
def test_the_answer_length_run_json_records_is_the_one_sent(fixture_bundle, tmp_path, extra, sent):
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, "--request-extra", extra, "--no-score") == 0
    body = server.requests[0]["body"]
    assert {k: body[k] for k in ("max_completion_tokens", "max_tokens") if k in body} == sent
    info = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
    assert info["sampling"]["max_tokens"] == next(iter(sent.values()))


@pytest.mark.parametrize(
    "model,extra,top_p",
    [("gpt-5.4", [], None),  # the registry's API model: none sent (the reference sends none)
     ("gpt-5.4", ["--top-p", "0.9"], 0.9),
     ("gpt-5.4", ["--top-p", "1"], 1.0),  # given: sent, though it is most APIs' default
     ("local-vlm", [], 1.0),  # another model, decoded as open models are: top_p 1 sent
     ("local-vlm", ["--request-extra", '{"top_p": null}'], None),
     ("local-vlm", ["--request-extra", '{"top_p": 0.8}'], 0.8)],
)  # fmt: skip
def test_the_top_p_run_json_records_is_the_one_sent(fixture_bundle, tmp_path, model, extra, top_p):
    """top_p 1.0 was left out of every request ("every API's default") while run.json and the Hub
    card said 1.0: the server's own applied (Gemini's is 0.95; a ``vllm serve`` takes the model's
    generation_config). A top_p is now sent whenever run.json records one, and where none is sent
    run.json records None, the server's default (red team, stop 43)."""
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, *extra, "--limit", "1", "--no-score", model=model) == 0
    body = server.requests[0]["body"]
    assert body.get("top_p") == top_p and (top_p is not None or "top_p" not in body)
    (info,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/oracle_implicit/run.json")]
    assert info["sampling"]["top_p"] == top_p and info["settings"]["sampling"]["top_p"] == top_p


def test_a_resume_under_another_top_p_is_refused_saying_what_earlier_versions_recorded(
    fixture_bundle, tmp_path, capsys
):
    with FakeServer() as server:
        first = ["--request-extra", '{"top_p": null}', "--limit", "1", "--no-score"]
        assert cli(fixture_bundle, tmp_path, server, *first) == 0
        capsys.readouterr()
        assert cli(fixture_bundle, tmp_path, server, "--limit", "2", "--no-score") == 2
        err = capsys.readouterr().err  # made by this very version: no earlier version is blamed
        assert "sampling.top_p: None -> 1.0" in err and "where it sent none" not in err, err
        made_by_an_earlier_version(tmp_path)
        assert cli(fixture_bundle, tmp_path, server, "--limit", "2", "--no-score") == 2
    err = capsys.readouterr().err
    assert "sampling.top_p: None -> 1.0" in err and "recorded top_p 1.0 where it sent none" in err, err


def made_by_an_earlier_version(out):
    """Every run.json under ``out`` says its last session was made by an earlier version."""
    for path in out.glob("*/oracle_*/run.json"):
        info = json.loads(path.read_text())
        info["sessions"][-1]["versions"]["chexpercept"] = "0.0.1"
        path.write_text(json.dumps(info))


@pytest.mark.parametrize(
    "extra, seed",
    [
        ([], None),  # none given: none sent, none recorded (run.json said 0 before)
        (["--seed", "0"], 0),
        (["--seed", "7"], 7),
        (["--request-extra", '{"seed": 9}'], 9),
        (["--seed", "9", "--request-extra", '{"seed": 9}'], 9),
        (["--request-extra", '{"seed": null}'], None),
    ],
)
def test_the_seed_run_json_records_is_the_one_sent(fixture_bundle, tmp_path, extra, seed):
    """The openai backend never sent a seed while run.json and the run's identity recorded --seed
    (0 by default): a rerun with the same --seed and a temperature drew other answers than the
    record promised. A seed is now sent whenever run.json records one, and where none is sent
    run.json records None: the server's own randomness."""
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, *extra, "--limit", "1", "--no-score") == 0
    body = server.requests[0]["body"]
    assert body.get("seed") == seed and (seed is not None or "seed" not in body)
    (info,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/oracle_implicit/run.json")]
    assert info.get("seed") == seed and info["settings"]["seed"] == seed


@pytest.mark.parametrize(
    "extra, says",
    [
        (
            ["--seed", "1", "--request-extra", '{"seed": 2}'],
            "--seed 1 and seed 2 in --request-extra: give one",
        ),
        (["--seed", "1", "--request-extra", '{"seed": null}'], "--seed 1 and seed None"),
        (["--request-extra", '{"seed": -1}'], "seed in --request-extra must be"),
        (["--request-extra", '{"seed": "3"}'], "seed in --request-extra must be"),
        (["--request-extra", '{"seed": 1.5}'], "seed in --request-extra must be"),
        (["--request-extra", '{"seed": true}'], "seed in --request-extra must be"),
    ],
)
def test_a_seed_run_json_could_not_record_is_refused_before_any_request(
    fixture_bundle, tmp_path, capsys, extra, says
):
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, *extra, "--limit", "1") == 2
    assert not server.requests and says in capsys.readouterr().err
    assert not list(tmp_path.glob("*/oracle_*/run.json"))


def test_a_resume_of_an_api_run_that_recorded_an_unsent_seed_is_refused_saying_why(
    fixture_bundle, tmp_path, capsys
):
    """An API run of an earlier version recorded seed 0 where it sent none: its answers were made
    without a seed, which the identity now says (None); a resume is refused naming why."""
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, "--seed", "0", "--limit", "1", "--no-score") == 0
        made_by_an_earlier_version(tmp_path)
        capsys.readouterr()
        assert cli(fixture_bundle, tmp_path, server, "--limit", "2", "--no-score") == 2
    err = capsys.readouterr().err
    assert "seed: 0 -> None" in err and "recorded seed 0 (or --seed) where it sent none" in err, err


def test_a_vllm_server_gets_the_neutral_value_of_every_field_it_would_fill_from_the_generation_config(
    fixture_bundle, tmp_path, capsys
):
    """A vllm serve fills each sampling field a request leaves out from the model's
    generation_config.json (Qwen2.5-VL's repetition_penalty 1.05 under a run recorded as greedy; a
    server restarted with another --generation-config changed answers under the same identity: red
    team, stop 44). Towards a server that says it is vLLM the run sends the neutral value of each
    (VLLM_NEUTRAL_SAMPLING, as the offline engine applies none), a field --request-extra sets wins,
    and the run's identity holds them; a server that is not vLLM gets none of them."""
    from chexpercept.eval.backends.openai.image_ids import VLLM_NEUTRAL_SAMPLING

    with FakeServer(vllm=True) as server:
        extra = ["--request-extra", '{"repetition_penalty": 1.2}', "--limit", "1", "--no-score"]
        assert cli(fixture_bundle, tmp_path / "vllm", server, *extra) == 0
    bodies = [r["body"] for r in server.requests]
    assert bodies and all(b["repetition_penalty"] == 1.2 for b in bodies)
    for key, value in VLLM_NEUTRAL_SAMPLING.items():
        if key != "repetition_penalty":
            assert all(b[key] == value for b in bodies), key
    (info,) = [json.loads(p.read_text()) for p in (tmp_path / "vllm").glob("*/oracle_implicit/run.json")]
    sent = info["settings"]["backend_identity"]["request_fields"]
    assert sent == {**VLLM_NEUTRAL_SAMPLING, "repetition_penalty": 1.2}
    with FakeServer() as server:  # not vLLM: an OpenAI API refuses fields it does not know
        assert cli(fixture_bundle, tmp_path / "api", server, "--limit", "1", "--no-score") == 0
    assert not any(key in r["body"] for r in server.requests for key in VLLM_NEUTRAL_SAMPLING)
    # the same folder, now answered by a server that is not vLLM: the resume is refused
    capsys.readouterr()
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path / "vllm", server, "--limit", "2", "--no-score") == 2
    assert "request_fields.top_k: -1 -> (absent)" in capsys.readouterr().err


def test_another_checkpoint_served_under_the_same_name_at_the_same_url_stops_the_resume(
    fixture_bundle, tmp_path, capsys
):
    """vllm serve restarted on another checkpoint under the same --served-model-name and port: the
    resume went on without a word, mixing the two checkpoints' answers (red team, stop 44). What the
    server says it loaded the model from (vLLM's ``root`` in GET /models) is part of the identity."""
    with FakeServer(vllm=True) as server:
        server.roots["local-vlm"] = "/ckpt/step1000"
        assert cli(fixture_bundle, tmp_path, server, "--limit", "1", "--no-score") == 0
        assert cli(fixture_bundle, tmp_path, server, "--limit", "2", "--no-score") == 0  # the same: goes on
        server.roots["local-vlm"] = "/ckpt/step9000"
        capsys.readouterr()
        assert cli(fixture_bundle, tmp_path, server, "--limit", "3", "--no-score") == 2
    err = capsys.readouterr().err
    assert "backend_identity.served_root: '/ckpt/step1000' -> '/ckpt/step9000'" in err, err
    (info,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/oracle_implicit/run.json")]
    assert info["settings"]["backend_identity"]["served_root"] == "/ckpt/step1000"


def test_the_same_body_resumes_and_a_refusal_blames_no_earlier_version_of_this_one(
    fixture_bundle, tmp_path, capsys
):
    """{"seed": null} without --seed sends what no field sends, yet was refused as another identity,
    and explained as "not recorded by the version that made that run" although this version made it
    (red team, stop 44). A null that removes nothing is no field; an earlier version is blamed only
    where another one made the run."""
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path, server, "--limit", "1", "--no-score") == 0
        extra = ["--request-extra", '{"seed": null, "logprobs": null}', "--limit", "2", "--no-score"]
        assert cli(fixture_bundle, tmp_path, server, *extra) == 0
        capsys.readouterr()
        assert cli(fixture_bundle, tmp_path, server, "--seed", "3", "--limit", "3", "--no-score") == 2
    err = capsys.readouterr().err
    assert "seed: None -> 3" in err and "earlier version" not in err and "not recorded by" not in err, err


def test_request_extra_sampling_is_what_run_json_records(fixture_bundle, tmp_path):
    with FakeServer() as server:
        assert (
            cli(fixture_bundle, tmp_path, server, "--request-extra", '{"temperature": null}', "--no-score")
            == 0
        )
    info = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
    assert "temperature" not in server.requests[0]["body"]
    assert info["sampling"]["temperature"] is None and info["sampling"]["greedy"] is False
    assert retry_hint({"retry-after-ms": "nan", "Retry-After": "2"}) == 2.0


def test_the_chat_template_variables_run_json_records_are_sent(fixture_bundle, tmp_path, capsys):
    """--no-thinking on the openai backend was recorded in run.json and in the run's identity but
    never sent: a vLLM server thought while the run said thinking was off (red team, stop 42)."""
    with FakeServer() as server:
        extra = ["--no-thinking", "--chat-template-kwargs", '{"x": 1}', "--no-score", "--limit", "1"]
        assert cli(fixture_bundle, tmp_path, server, *extra) == 0
    body = server.requests[0]["body"]
    assert body["chat_template_kwargs"] == {"enable_thinking": False, "x": 1}
    info = json.loads((tmp_path / "local-vlm" / "oracle_implicit" / "run.json").read_text())
    assert info["settings"]["chat_template_kwargs"] == body["chat_template_kwargs"]
    twice = ["--no-thinking", "--request-extra", '{"chat_template_kwargs": {"enable_thinking": true}}']
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path / "twice", server, *twice, "--limit", "1") == 2
    assert "may not set chat_template_kwargs" in capsys.readouterr().err  # run.json would not say it
    clash = ["--no-thinking", "--chat-template-kwargs", '{"enable_thinking": true}', "--limit", "1"]
    with FakeServer() as server:
        assert cli(fixture_bundle, tmp_path / "clash", server, *clash) == 2
    assert "--no-thinking and enable_thinking true" in capsys.readouterr().err


def test_a_reply_holding_half_a_character_is_recorded_not_the_end_of_the_run(fixture_bundle, tmp_path):
    """A reply whose JSON holds a lone surrogate (``"\\udcff"``: half of a UTF-16 pair, no character)
    ended the whole run when the answer was written, and every rerun ended the same way (red team,
    stop 43). It is read as invalid UTF-8 bytes are: U+FFFD in its place."""
    with FakeServer(reply=lambda body: "Answer: 1 \udcff") as server:
        assert cli(fixture_bundle, tmp_path, server, "--limit", "1", "--no-score") == 0
    (record,) = [
        json.loads(line) for line in (tmp_path / "local-vlm" / "oracle_implicit" / "results.jsonl").open()
    ]
    assert record["turns"][0]["response"] == "Answer: 1 \ufffd"


@pytest.mark.parametrize(
    "statuses, delay, vllm",
    [
        ([503, 502], 0.0, True),  # busy twice, then it says: a vLLM
        ([500], 0.0, True),
        ([], 1.0, None),  # never within the time allowed
        ([503, 503, 503], 0.0, None),  # never says
        ([404], 0.0, False),  # an answer: it lists no models (not vLLM)
        ([501], 0.0, False),
        ([307, 401], 0.0, True),  # a redirect, a key refused there alone: nothing said (round 2)
        ([403, 403, 403], 0.0, None),
        ([b"<html>sign in</html>", b""], 0.0, True),  # a 200 that is no listing says nothing
        ([b"{}", b"{}", b"{}"], 0.0, None),
    ],
)
def test_a_server_that_does_not_say_what_it_is_is_never_taken_for_another(
    fixture_bundle, tmp_path, capsys, monkeypatch, statuses, delay, vllm
):
    """A vLLM whose GET /v1/models failed once (a 503 while busy) or answered late was run as a
    server that is not vLLM, without a word: its requests left out the neutral sampling fields (so it
    decoded with the model's generation config) and run.json recorded no field (red team, stop 45).
    What a server does not say is unknown: it is asked again (ASK_WAITS), and a server that never
    says stops the run before any request; a status that is an answer (404, 501) is a server that is
    no vLLM."""
    from chexpercept.eval.backends.openai import backend as openai_backend
    from chexpercept.eval.backends.openai.image_ids import VLLM_NEUTRAL_SAMPLING

    monkeypatch.setattr(openai_backend, "ASK_SECONDS", 0.5)
    monkeypatch.setattr(openai_backend, "ASK_WAITS", (0.0, 0.1, 0.2))
    with FakeServer(vllm=True) as server:
        server.models_status = [s for s in statuses if isinstance(s, int)]
        server.models_bodies = [s for s in statuses if isinstance(s, bytes)]
        server.models_delay = delay
        status = cli(fixture_bundle, tmp_path, server, "--limit", "1", "--no-score")
    err = capsys.readouterr().err
    if vllm is None:
        assert status == 2 and "did not say what it is" in err and "nothing was sent" in err, err
        assert not server.requests and not list(tmp_path.glob("*/oracle_*"))
        return
    assert status == 0, err
    (info,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/oracle_implicit/run.json")]
    fields = info["settings"]["backend_identity"]["request_fields"]
    assert fields == (VLLM_NEUTRAL_SAMPLING if vllm else {})
    assert all({k: b["body"].get(k) for k in fields} == fields for b in server.requests)
    assert server.models_before == len(statuses) + 1 - (not vllm)


@pytest.mark.parametrize("on_error", ["record", "stop"])
def test_a_case_whose_record_no_reader_takes_is_never_written(
    fixture_bundle, tmp_path, capsys, monkeypatch, on_error
):
    """A server's replies of 60 MB made a results line of 1 GB, longer than the 64 MiB a results
    line may hold: every rerun and ``score`` then refused the file (red team, stop 45). Every
    JSON-lines record goes through ``input_files.json_line``, and a finished case whose record is
    over the bound is that case's failure (--on-error record: in failures.jsonl, the others saved;
    stop: the run ends naming it); nothing unreadable is written, and a rerun resumes. The bound is
    lowered here to 20 KB (replies of 30 KB) to keep the test small."""
    from chexpercept import input_files

    monkeypatch.setattr(input_files, "MAX_LINE", 20_000)
    folder = tmp_path / "local-vlm" / "oracle_implicit"
    with FakeServer(reply=lambda body: "Answer: 1 " + "x" * 30_000) as server:
        status = cli(fixture_bundle, tmp_path, server, "--limit", "2", "--on-error", on_error, "--no-score")
    err = capsys.readouterr().err
    assert "a line of a results file may hold" in err, err[-2000:]
    assert not (folder / "results.jsonl").is_file() or not (folder / "results.jsonl").read_text()
    if on_error == "record":
        assert status == EXIT_UNFINISHED
        failures = read_failures(folder / "failures.jsonl")
        assert len(failures) == 2 and all("--max-tokens bounds them" in f.error for f in failures)
    else:
        assert status == 2 and "--on-error record records such a case" in err
    with FakeServer() as server:  # the same command, short replies: it resumes and finishes
        assert (
            cli(fixture_bundle, tmp_path, server, "--limit", "2", "--on-error", on_error, "--no-score") == 0
        )
    assert len(list(iter_results(folder / "results.jsonl"))) == 2


@pytest.mark.parametrize("sign", ["503", "cache miss", "none", "same path"])
def test_a_server_restarted_on_another_checkpoint_mid_run_has_no_answer_taken(
    fixture_bundle, tmp_path, capsys, sign
):
    """vllm serve restarted on another checkpoint in the middle of a run: the run went on and kept
    the new checkpoint's answers under the first one's identity (red team, stop 45). After a sign
    that the server may have restarted (a connection lost, a gateway's 502/503/504, an image id it
    no longer holds), it is asked what it is before any answer is taken, and the run stops where it
    now says another root: no answer of the new checkpoint is saved, and the ones before are.
    ``none``: a restart with no sign at all (left alone at stop 45): its next answer came over a new
    connection, as every answer from a restarted server does (this fake closes each connection
    after its reply, as a server closes idle ones), and one no question has vouched for is taken
    only after the server is asked again. ``same path`` (round 2): restarted on the same path, whose
    files were written over (or a link pointed elsewhere): the files are compared too."""
    state = {"n": 0, "switch": 12}
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"step": 1000}')
    first, then = ("/ckpt/step1000", "/ckpt/step9000") if sign != "same path" else (str(checkpoint),) * 2

    def reply(body):
        state["n"] += 1
        if state["n"] == state["switch"]:  # restarted on another checkpoint after this answer
            server.roots["local-vlm"] = then
            (checkpoint / "config.json").write_text('{"step": 9000}')
            if sign == "503":
                server.failures.append(503)
            elif sign == "cache miss":
                server.forget()
        return "Answer: 1" if state["n"] <= state["switch"] else "Answer: 2"

    with FakeServer(vllm=True, reply=reply) as server:
        server.roots["local-vlm"] = first
        extra = [
            "--paths",
            "RR",
            "--batch-size",
            "1",
            "--concurrency",
            "1",
            "--no-score",
            "--max-retries",
            "3",
        ]
        status = main(
            ["--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai", "--base-url",
             server.url, "--output-dir", str(tmp_path), "--no-progress", *extra]
        )  # fmt: skip
    err = capsys.readouterr().err
    if sign == "same path":
        assert status == 2 and f"restarted serving {checkpoint}, whose files have changed" in err, err[-3000:]
    else:
        assert status == 2 and "now says it is vLLM serving /ckpt/step9000" in err, err[-3000:]
        assert "the run began with vLLM serving /ckpt/step1000" in err
    results = tmp_path / "local-vlm" / "oracle_implicit" / "results.jsonl"
    saved = list(iter_results(results)) if results.is_file() else []
    assert state["n"] >= state["switch"]  # the server restarted: none of its answers since was taken
    assert saved and all(t.response == "Answer: 1" for r in saved for t in r.turns)


def test_a_kept_alive_connection_is_vouched_for_once(fixture_bundle, tmp_path, capsys):
    """The other side of the rule above: an answer over a connection that a question has vouched
    for is taken without asking again (vllm serve keeps its connections open), so the server is
    asked about once per connection, not once per answer; and a run against a server that is no
    vLLM (no ``root`` to tell checkpoints apart) never asks during the run."""
    for vllm in (True, False):
        with FakeServer(vllm=vllm, keep_alive=True) as server:
            status = cli(
                fixture_bundle,
                tmp_path / str(vllm),
                server,
                "--concurrency",
                "4",
                "--no-score",
                "--paths",
                "RR",
                "RF",
                "LF",
            )
            assert status == 0, capsys.readouterr().err
            during = server.models_asked - server.models_before
            assert len(server.requests) > 40
            if vllm:
                assert 1 <= during <= 8, during  # a question per new connection at most (4 and the first)
            else:
                assert during == 0


def test_a_server_whose_listing_fails_a_while_mid_run_is_waited_out_and_slow_questions_are_each_timed(
    fixture_bundle, tmp_path, capsys, monkeypatch
):
    """After a 503 in the middle of a run, /models answering 503 for a few seconds ended the run with
    "nothing was sent" though answers were saved (red team, stop 45): in the middle of a run the
    question is asked over minutes (RECHECK_WAITS), as a request's retries are. And /models and
    /version are each timed (ASK_SECONDS per request): two slow answers within it are answers."""
    from chexpercept.eval.backends.openai import backend as openai_backend

    monkeypatch.setattr(openai_backend, "ASK_SECONDS", 1.0)
    monkeypatch.setattr(openai_backend, "RECHECK_WAITS", (0.0, 0.2, 0.5, 1.0))
    state = {"n": 0}

    def reply(body):
        state["n"] += 1
        if state["n"] == 2:  # a 503 next, and then /models fails three times before it answers
            server.failures.append(503)
            server.models_status = [503, 503, 503]
        return "Answer: 1"

    with FakeServer(vllm=True, reply=reply) as server:
        server.models_delay = 0.6  # each question slower than half the time allowed
        extra = [
            "--batch-size",
            "1",
            "--concurrency",
            "1",
            "--limit",
            "3",
            "--no-score",
            "--max-retries",
            "3",
        ]
        status = cli(fixture_bundle, tmp_path, server, *extra)
    err = capsys.readouterr().err
    assert status == 0, err[-3000:]
    assert server.models_asked >= 5  # once before the run, then four times after the 503


@pytest.mark.parametrize("kind", ["auto", "other", "vllm"])
def test_a_gateway_that_serves_chat_alone_runs_once_the_user_says_what_it_is(
    fixture_bundle, tmp_path, capsys, kind
):
    """A gateway whose GET /v1/models answers 403 (it serves chat alone) could not run at all once
    such an answer said nothing (red team, stop 45): the refusal names --server-kind, and with it the
    server is not asked; what is sent follows what the user said, and run.json records it."""
    from chexpercept.eval.backends.openai.image_ids import VLLM_NEUTRAL_SAMPLING

    with FakeServer() as server:
        server.models_status = [403] * 20
        extra = ["--limit", "1", "--no-score"] + ([] if kind == "auto" else ["--server-kind", kind])
        status = cli(fixture_bundle, tmp_path, server, *extra)
    err = capsys.readouterr().err
    if kind == "auto":
        assert status == 2 and "--server-kind vllm or other" in err, err
        return
    assert status == 0, err
    assert server.models_asked == 0
    (info,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/oracle_implicit/run.json")]
    fields = info["settings"]["backend_identity"]["request_fields"]
    assert fields == (VLLM_NEUTRAL_SAMPLING if kind == "vllm" else {})
    assert all({k: r["body"].get(k) for k in fields} == fields for r in server.requests)
