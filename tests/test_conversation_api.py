"""The public one-conversation API (eval/conversation.py): a loop of your own gives exactly what the
runner records, and the requests are exactly what the backends send."""

from __future__ import annotations

import json

import pytest

from chexpercept.eval.conversation import Conversation, conversations
from chexpercept.eval.run import main


def test_a_hand_written_loop_records_what_the_runner_records(fixture_bundle, tmp_path):
    """The docs' ten-line loop with a model that always answers option 1, against the runner with
    baseline:constant:1: the same record for every case (turns, verdicts, oracle patches, history)."""
    records = {}
    for conv in conversations(fixture_bundle, oracle="implicit"):
        while not conv.done:
            messages = conv.pending.chat_messages(images="data_url")
            assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
            turn = conv.answer("Answer: 1")
            assert turn is not None and turn.parsed == [1]
        records[conv.case.key_id] = json.loads(conv.result().to_json())
    argv = [
        "--data-dir",
        str(fixture_bundle),
        "--model",
        "baseline:constant:1",
        "--output-dir",
        str(tmp_path),
    ]
    assert main([*argv, "--no-progress", "--no-score"]) == 0
    lines = (tmp_path / "baseline-constant-1" / "oracle_implicit" / "results.jsonl").read_text().splitlines()
    ran = {r["key_id"]: r for r in map(json.loads, lines)}
    assert ran.keys() == records.keys()
    for key, record in records.items():
        theirs = dict(ran[key])
        theirs.pop("run")
        record.pop("run")
        assert record == theirs, key


def test_implicit_oracle_patches_the_history_the_model_sees_next(fixture_bundle):
    """A wrong detection answer is replaced by the gold one in the next request's history."""
    conv = next(c for c in conversations(fixture_bundle, oracle="implicit", paths=["RR"]))
    first = conv.answer("Answer: 2")  # the positive case's gold is 1 (Yes)
    assert first is not None and not first.correct
    history = conv.pending.messages
    assert history[2].role == "assistant" and history[2].text == "Answer: 1"
    assert conv.records[0].patched_to == "Answer: 1" and conv.responses == ["Answer: 2"]


def test_request_forms_are_those_the_backends_send(fixture_bundle):
    from chexpercept.eval.backends.openai.backend import OpenAIBackend
    from chexpercept.eval.backends.vllm.backend import VLLMBackend
    from chexpercept.eval.protocol import RunContext, Sampling
    from chexpercept.eval.registry import resolve

    conv = next(iter(conversations(fixture_bundle, oracle="none", paths=["RR"])))
    conv.answer("Answer: 1")
    request = conv.pending
    context = RunContext(root=fixture_bundle, cases=[conv.case])
    from fake_openai import FakeServer

    with FakeServer() as server:  # asked what it is at setup
        api = OpenAIBackend(resolve("gpt-5.4"), sampling=Sampling(1.0, 1.0, 8, False), base_url=server.url)
        api.setup(context)
    assert request.chat_messages(images="data_url") == api.build_payload(request)["messages"]
    engine = VLLMBackend(resolve("medgemma-1.5-4b"), sampling=Sampling(0.0, 1.0, 8, True), image_ids=False)
    engine.root = str(fixture_bundle)
    assert request.chat_messages(images="file_url") == engine.build_messages(request)
    pil = request.chat_messages(images="pil")
    parts = [p for m in pil if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]
    assert len(parts) == len(request.images) and all(p["image"].mode == "RGB" for p in parts)
    with pytest.raises(ValueError, match="images must be"):
        request.chat_messages(images="base64")


def test_selection_by_key_id_and_errors(fixture_bundle):
    every = [c.case.key_id for c in conversations(fixture_bundle, oracle="none")]
    picked = [c.case.key_id for c in conversations(fixture_bundle, oracle="none", key_ids=every[3:5])]
    assert picked == every[3:5]
    with pytest.raises(ValueError, match="not cases of"):
        list(conversations(fixture_bundle, oracle="none", key_ids=["nope"]))
    with pytest.raises(ValueError, match="unknown oracle setting"):
        Conversation(next(iter(conversations(fixture_bundle, oracle="none"))).case, oracle="sometimes")
