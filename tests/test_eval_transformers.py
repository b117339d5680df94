"""The transformers backend end to end on CPU with a tiny random Gemma3 VLM built offline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

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


def walk_to_last_turn(case, answer="Answer: 1"):
    """A case's conversation up to its last turn (the request carrying every image of the case)."""
    conv = Conversation(case, oracle="none")
    requests = [conv.pending]
    while True:
        conv.answer(Response(answer))
        if conv.done:
            return requests
        requests.append(conv.pending)


def tiny_backend(model, bundle, **options):
    backend = TransformersBackend(
        resolve(str(model), backend="transformers"), sampling=Sampling(0.0, 1.0, 3, True), **options
    )
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    return backend


@pytest.fixture(scope="module")
def large_image_bundle(tmp_path_factory):
    """RR cases with 200x200 images, so the tiny model's processor has to shrink them to 56x56."""
    from chexpercept.testing import write_fixture_bundle

    root = write_fixture_bundle(
        tmp_path_factory.mktemp("large") / "bundle", per_cell=2, image_size=200, lesions=("effusion",)
    )
    return read_bundle(root, paths=["RR"])


def test_images_resized_once_give_identical_inputs_and_tokens(tiny_model, large_image_bundle):
    bundle = large_image_bundle
    plain = tiny_backend(tiny_model, bundle, resize_once=False)
    once = tiny_backend(tiny_model, bundle)
    assert (
        once.describe()["images"]
        == "images resized once to 56x56, bilinear (the processor's size and filter)"
    )
    assert "resize_once off" in plain.describe()["images"]
    requests = [r for case in bundle.cases for r in walk_to_last_turn(case)]
    last = requests[-1]
    assert len(last.images) == 7
    assert {once.image(p).size for p in last.images} == {(56, 56)}
    assert {plain.image(p).size for p in last.images} == {(200, 200)}
    a = plain._encode([plain.build_conversation(last)])
    b = once._encode([once.build_conversation(last)])
    assert a.keys() == b.keys() and a["pixel_values"].shape[0] == 7
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the same answers, token for token, over every turn of both cases, batched
    assert [r.text for r in plain.generate(requests)] == [r.text for r in once.generate(requests)]
    # images are kept only while a live conversation uses them
    once.generate(requests[:1])
    assert set(once._images) == set(requests[0].images)


def test_a_resize_that_changes_the_processors_output_is_not_used(tiny_model, large_image_bundle, monkeypatch):
    """The setup check: a wrong filter (nearest instead of the processor's bilinear) is caught."""
    from chexpercept.eval import backend_transformers
    from chexpercept.eval.image_resize import FixedResize

    wrong = FixedResize(width=56, height=56, resample=0)
    monkeypatch.setattr(backend_transformers, "fixed_resize_of", lambda processor: (wrong, ""))
    backend = tiny_backend(tiny_model, large_image_bundle)
    assert backend.resize is None
    assert "changed the processor's output" in backend.describe()["images"]
    path = large_image_bundle.cases[0].turns[0].images[0]
    assert backend.image(path).size == (200, 200)


def test_a_dynamic_size_processor_keeps_the_original_images(tiny_model, large_image_bundle, monkeypatch):
    from transformers import AutoProcessor

    real = AutoProcessor.from_pretrained

    def dynamic(*args, **kwargs):
        processor = real(*args, **kwargs)
        processor.image_processor.size = {"shortest_edge": 56, "longest_edge": 112}
        return processor

    monkeypatch.setattr(AutoProcessor, "from_pretrained", dynamic)
    backend = tiny_backend(tiny_model, large_image_bundle)
    assert backend.resize is None
    assert "not a fixed height and width" in backend.describe()["images"]
