"""The transformers backend end to end on CPU with a tiny random Gemma3 VLM built offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from chexpercept.bundle import read_bundle
from chexpercept.cli import main as cli
from chexpercept.eval.backend_transformers import TransformersBackend
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import Response, RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.run import main
from chexpercept.results import iter_results

sys.path.insert(0, str(Path(__file__).parent))
SELECT = ["--lesions", "effusion", "cardiomegaly", "--max-tokens", "4"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "tiny-vlm"
    assert cli(["make-tiny-model", "--out", str(out)]) == 0
    return out


def run_tiny(bundle, out, model, *extra):
    argv = ["--data-dir", str(bundle), "--model", str(model), "--backend", "transformers"]
    return main([*argv, "--output-dir", str(out), "--no-progress", *SELECT, *extra])


def test_make_tiny_model_writes_a_loadable_model(tiny_model):
    names = {p.name for p in tiny_model.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["model_type"] == "gemma3"
    assert sum(p.stat().st_size for p in tiny_model.iterdir()) < 5_000_000


@pytest.fixture(scope="module")
def batched_run(fixture_bundle, tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("batched")
    assert run_tiny(fixture_bundle, out, tiny_model, "--batch-size", "6") == 0
    return out / "tiny-vlm" / "oracle_implicit"


def test_tiny_model_runs_end_to_end(batched_run):
    records = list(iter_results(batched_run / "results.jsonl"))
    assert len(records) == 6
    assert {r.path for r in records} == {"RR", "RF", "LF"}
    for r in records:
        assert r.turns[0].task == "detection"
        for t in r.turns:
            assert isinstance(t.response, str)
            assert t.usage["input_tokens"] > 100 and 0 <= t.usage["output_tokens"] <= 4
        assert r.usage["num_calls"] == len(r.turns)
    # later turns carry the whole history: prompts grow
    rr = next(r for r in records if r.path == "RR" and r.lesion == "effusion")
    sizes = [t.usage["input_tokens"] for t in rr.turns]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    info = json.loads((batched_run / "run.json").read_text())
    assert info["backend"] == "transformers" and info["sampling"]["greedy"] is True
    assert info["sampling"]["max_tokens"] == 4
    assert info["backend_settings"]["device"] == "cpu"


def test_kill_9_and_one_at_a_time_give_the_batched_results(fixture_bundle, tiny_model, batched_run, tmp_path):
    """A crashed run resumes exactly, and left padding is right: different batchings agree token for token."""
    from test_eval_resume import kill_after_lines, start_script

    crashed = tmp_path / "crashed"
    results = crashed / "tiny-vlm" / "oracle_implicit" / "results.jsonl"
    proc = start_script(
        fixture_bundle,
        crashed,
        "--backend",
        "transformers",
        *SELECT,
        "--batch-size",
        "2",
        model=str(tiny_model),
        env_extra={"CHEXPERCEPT_TEST_STEP_DELAY": "0.1"},
    )
    kill_after_lines(proc, results, 2)
    assert 2 <= results.read_bytes().count(b"\n") < 6
    # resume with every step cut into small length-sorted micro-batches
    assert (
        run_tiny(fixture_bundle, crashed, tiny_model, "--batch-size", "4", "--max-batch-tokens", "500") == 0
    )
    assert results.read_bytes() == (batched_run / "results.jsonl").read_bytes()


def test_requests_put_text_first_and_decode_each_image_once(fixture_bundle, tiny_model):
    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["RR"])
    backend = TransformersBackend(
        resolve(str(tiny_model), backend="transformers"), sampling=Sampling(0.0, 1.0, 2, True)
    )
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    conv = Conversation(bundle.cases[0], oracle="none")
    first = backend.build_conversation(conv.pending)
    assert [m["role"] for m in first] == ["system", "user"]
    assert [p["type"] for p in first[1]["content"]] == ["text", "image"]
    image = first[1]["content"][1]["image"]
    (response,) = backend.generate([conv.pending])
    conv.answer(response)
    second = backend.build_conversation(conv.pending)
    assert second[1]["content"][1]["image"] is image  # the live conversation's image is not decoded again
    assert second[2] == {"role": "assistant", "content": [{"type": "text", "text": response.text}]}
    conv.answer(Response("Answer: 1"))
    backend.generate([conv.pending])
    with pytest.raises(ValueError, match="dtype"):
        TransformersBackend(
            resolve(str(tiny_model), backend="transformers"), sampling=Sampling(0, 1, 2, True), dtype="int3"
        )


def test_micro_batches_sort_by_length_within_the_token_budget(fixture_bundle):
    from types import SimpleNamespace

    bundle = read_bundle(fixture_bundle)
    requests = []
    for case in bundle.cases:
        conv = Conversation(case, oracle="none")
        while not conv.done:
            requests.append(conv.pending)
            conv.answer(Response("Answer: 1"))
    backend = TransformersBackend(
        resolve("any", backend="transformers"), sampling=Sampling(0, 1, 2, True), max_batch_tokens=1500
    )
    backend.processor = SimpleNamespace(image_seq_length=4)
    groups = backend.micro_batches(requests)
    assert sorted(i for g in groups for i in g) == list(range(len(requests)))
    sizes = [[backend.estimated_tokens(requests[i]) for i in g] for g in groups]
    flat = [n for g in sizes for n in g]
    assert flat == sorted(flat)
    assert all(len(g) == 1 or len(g) * max(g) <= 1500 for g in sizes)
    assert 1 < len(groups) < len(requests)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        TransformersBackend(
            resolve("any", backend="transformers"), sampling=Sampling(0, 1, 2, True), max_batch_tokens=0
        )
