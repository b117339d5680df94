"""The transformers backend end to end on CPU with a tiny random Gemma3 VLM built offline."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.transformers.backend import TransformersBackend
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.protocol import Response, RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.run import main
from chexpercept.results import iter_results

SELECT = ["--lesions", "effusion", "cardiomegaly", "--max-tokens", "4"]


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
    with pytest.raises(ValueError, match="--max-batch-tokens"):
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


def test_fast_inputs_give_identical_inputs_and_tokens(tiny_model, large_image_bundle):
    """numpy outputs, images resized once and pixel values once per image change nothing the model sees."""
    from chexpercept.eval.backends.transformers.pixel_cache import PixelCache

    bundle = large_image_bundle
    plain = tiny_backend(tiny_model, bundle, fast_inputs=False, image_workers=1)
    fast = tiny_backend(tiny_model, bundle, image_workers=3)  # a step's new images on 3 threads
    notes = fast.describe()
    assert notes["inputs_processor_outputs"] == "numpy arrays, converted to torch once per batch"
    assert notes["inputs_images"] == "resized once to 56x56, bilinear (the processor's size and filter)"
    assert notes["inputs_pixel_values"] == "computed once per image while its conversation is live"
    assert isinstance(fast.processor.image_processor, PixelCache) and fast.tensors == "np"
    assert plain.describe()["inputs_images"] == "off (fast_inputs=False)" and plain.pixel_cache is None
    requests = [r for case in bundle.cases for r in walk_to_last_turn(case)]
    first, last = requests[0], requests[-1]
    assert len(last.images) == 7
    assert {fast.image(p).size for p in last.images} == {(56, 56)}
    assert {plain.image(p).size for p in last.images} == {(200, 200)}
    for _ in range(2):  # the second time from the pixel cache
        a = plain._encode([plain.build_conversation(r) for r in (first, last)])
        b = fast._encode([fast.build_conversation(r) for r in (first, last)])
        assert a.keys() == b.keys() and a["pixel_values"].shape[0] == 8
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert fast.pixel_cache.cached == len({*first.images, *last.images}) == 8
    # the same answers, token for token, over every turn of both cases, batched
    assert [r.text for r in plain.generate(requests)] == [r.text for r in fast.generate(requests)]
    assert fast._pool is not None and plain._pool is None
    # images and their pixel values are kept only while a live conversation uses them
    fast.generate(requests[:1])
    assert set(fast._images) == set(first.images) and fast.pixel_cache.cached == len(first.images)
    fast.close()
    assert fast._pool is None and not fast._images
    with pytest.raises(ValueError, match="image_workers"):
        TransformersBackend(
            resolve("any", backend="transformers"), sampling=Sampling(0, 1, 2, True), image_workers=0
        )


def test_a_resize_that_changes_the_inputs_is_not_used(tiny_model, large_image_bundle, monkeypatch):
    """The setup check: a wrong filter (nearest instead of the processor's bilinear) is caught."""
    from chexpercept.eval.backends.transformers import backend as backend_transformers
    from chexpercept.eval.backends.transformers.image_resize import FixedResize

    wrong = FixedResize(width=56, height=56, resample=0)
    monkeypatch.setattr(backend_transformers, "fixed_resize_of", lambda processor: (wrong, ""))
    backend = tiny_backend(tiny_model, large_image_bundle)
    assert backend.resize is None and backend.pixel_cache is None
    notes = backend.describe()
    assert notes["inputs_images"].startswith("kept at their own size: resizing to 56x56, nearest first")
    assert "changed the model inputs (checked on" in notes["inputs_images"]
    assert notes["inputs_processor_outputs"].startswith("numpy")
    path = large_image_bundle.cases[0].turns[0].images[0]
    assert backend.image(path).size == (200, 200)


def test_pixel_values_that_differ_from_the_processors_are_not_used(
    tiny_model, large_image_bundle, monkeypatch
):
    from chexpercept.eval.backends.transformers import backend as backend_transformers
    from chexpercept.eval.backends.transformers.pixel_cache import PixelCache

    class Off(PixelCache):
        def _output(self, image, kwargs):
            out = dict(super()._output(image, kwargs))
            out["pixel_values"] = out["pixel_values"] + 1e-6
            return out

    monkeypatch.setattr(backend_transformers, "PixelCache", Off)
    backend = tiny_backend(tiny_model, large_image_bundle)
    assert backend.resize is not None and backend.pixel_cache is None
    assert not isinstance(backend.processor.image_processor, PixelCache)
    assert "per turn: computing them once per image changed" in backend.describe()["inputs_pixel_values"]


def patched_processor(monkeypatch, change):
    from transformers import AutoProcessor

    real = AutoProcessor.from_pretrained

    def load(*args, **kwargs):
        processor = real(*args, **kwargs)
        change(processor)
        return processor

    monkeypatch.setattr(AutoProcessor, "from_pretrained", load)


def test_a_dynamic_size_processor_keeps_the_original_images(tiny_model, large_image_bundle, monkeypatch):
    def dynamic(processor):
        processor.image_processor.size = {"shortest_edge": 56, "longest_edge": 112}

    patched_processor(monkeypatch, dynamic)
    backend = tiny_backend(tiny_model, large_image_bundle)
    assert backend.resize is None and backend.pixel_cache is None
    notes = backend.describe()
    assert "not a fixed height and width" in notes["inputs_images"]
    assert notes["inputs_pixel_values"] == "computed per turn (the processor is not fixed-size)"


def test_a_processor_that_cannot_give_numpy_keeps_torch_tensors(tiny_model, large_image_bundle, monkeypatch):
    def torch_only(processor):
        real = processor.apply_chat_template

        def apply(*args, return_tensors=None, **kwargs):
            if return_tensors != "pt":
                raise ValueError("only torch here")
            return real(*args, return_tensors=return_tensors, **kwargs)

        processor.apply_chat_template = apply

    patched_processor(monkeypatch, torch_only)
    backend = tiny_backend(tiny_model, large_image_bundle)
    assert backend.tensors == "pt" and backend.pixel_cache is not None
    note = backend.describe()["inputs_processor_outputs"]
    assert note.startswith("torch tensors: numpy outputs failed: ValueError: only torch here (checked on")
    request = walk_to_last_turn(large_image_bundle.cases[0])[-1]
    assert len(backend.generate([request])) == 1


def test_an_image_that_breaks_after_validation_stops_the_run_naming_the_file(tmp_path, tiny_model, capsys):
    """--check-images exists lets a truncated PNG through; decoding it must stop the run, naming it."""
    from chexpercept.testing import write_fixture_bundle

    bundle = write_fixture_bundle(tmp_path / "bundle", per_cell=1, seed=0)
    case = next(c for c in read_bundle(bundle).cases if c.lesion == "effusion")
    broken = bundle / case.turns[0].images[0]
    broken.write_bytes(broken.read_bytes()[:40])
    code = run_tiny(bundle, tmp_path / "runs", tiny_model, "--check-images", "exists", "--no-score")
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot decode image {broken}" in err and case.key_id in err


def test_a_package_the_model_needs_is_named_not_an_internal_error(fixture_bundle, tmp_path, capsys):
    """A registry-like Qwen2.5-VL with the transformers backend where torchvision is missing (its video
    processor needs it): one line naming the package, never 'internal error ... please report it'."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: the model loads")
    from chexpercept.cli import main as cli
    from chexpercept.eval.run import main as run_main

    model = tmp_path / "qwen"
    assert cli(["make-tiny-model", "--arch", "qwen2.5-vl", "--output-dir", str(model)]) == 0
    argv = ["--data-dir", str(fixture_bundle), "--model", str(model), "--backend", "transformers"]
    assert run_main([*argv, "--output-dir", str(tmp_path / "runs"), "--limit", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "a package it needs is not installed" in err and "Torchvision" in err
    assert "internal error" not in err


POLLUTED = {"repetition_penalty": 50.0, "no_repeat_ngram_size": 1, "top_k": 1, "temperature": 0.1,
            "do_sample": True}  # fmt: skip


def test_a_models_own_generation_config_never_changes_the_decoding(fixture_bundle, tiny_model, tmp_path):
    """A Qwen2.5-VL's generation_config.json (repetition_penalty 1.05) was applied under a run recorded
    as plain greedy decoding, which vLLM's engine decodes without it; Gemma 3's top_k 64 under top_p
    sampling. The model now decodes with the recorded settings only, and run.json names the fields
    its file asked for (``generation_config_ignored``)."""
    import shutil

    own = tmp_path / "own-config"
    shutil.copytree(tiny_model, own)
    config = json.loads((own / "generation_config.json").read_text())
    (own / "generation_config.json").write_text(json.dumps({**config, **POLLUTED}))
    bundle = read_bundle(fixture_bundle, lesions=["effusion"])
    texts, ignored = {}, {}
    for name, folder in (("plain", tiny_model), ("own", own)):
        for sampling in (Sampling(0.0, 1.0, 8, True), Sampling(0.7, 0.9, 8, False)):
            backend = TransformersBackend(resolve(str(folder), backend="transformers"), sampling=sampling)
            backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
            torch.manual_seed(0)
            convs = [Conversation(c, oracle="none") for c in bundle.cases]
            texts[name, sampling.greedy] = [r.text for r in backend.generate([c.pending for c in convs])]
            ignored[name] = backend.describe().get("generation_config_ignored")
            if name == "own" and sampling.greedy:  # the file's config would have changed these answers
                backend.model.generation_config.update(**POLLUTED)
                torch.manual_seed(0)
                polluted = [r.text for r in backend.generate([c.pending for c in convs])]
    assert polluted != texts["plain", True]
    assert texts["own", True] == texts["plain", True] and texts["own", False] == texts["plain", False]
    assert ignored == {"plain": {}, "own": dict(sorted(POLLUTED.items()))}


def test_the_models_own_code_is_part_of_the_identity_and_never_its_own_decoding(
    fixture_bundle, tiny_model, tmp_path, capsys
):
    """--trust-remote-code changes which code computes the answers: a resume that turned it on kept
    the earlier answers under one identity (it was declared as changing none). A folder's
    custom_generate/generate.py replaced the decoding under a run recorded as greedy (red team)."""
    import shutil

    own = tmp_path / "own-code"
    shutil.copytree(tiny_model, own)
    (own / "custom_generate").mkdir()
    (own / "custom_generate" / "generate.py").write_text(
        "from transformers import GenerationMixin\n\n\n"
        "def generate(model, *args, **kwargs):\n"
        "    kwargs['max_new_tokens'] = 1\n"
        "    return GenerationMixin.generate(model, *args, **kwargs)\n"
    )
    out = tmp_path / "runs"
    assert run_tiny(fixture_bundle, out, own, "--limit", "2", "--no-score") == 0
    plain = [
        r.turns[0].response for r in iter_results(out / "own-code" / "oracle_implicit" / "results.jsonl")
    ]
    capsys.readouterr()
    assert run_tiny(fixture_bundle, out, own, "--limit", "2", "--trust-remote-code") == 2
    assert "trust_remote_code" in capsys.readouterr().err
    assert run_tiny(fixture_bundle, out, own, "--limit", "2", "--no-score") == 0
    plain = [
        r.turns[0].response for r in iter_results(out / "own-code" / "oracle_implicit" / "results.jsonl")
    ]
    trusted = tmp_path / "trusted"
    assert run_tiny(fixture_bundle, trusted, own, "--limit", "2", "--trust-remote-code", "--no-score") == 0
    folder = trusted / "own-code" / "oracle_implicit"
    assert [r.turns[0].response for r in iter_results(folder / "results.jsonl")] == plain
    info = json.loads((folder / "run.json").read_text())
    assert info["backend_settings"]["custom_generate_ignored"] is True


def test_an_answer_ends_where_the_models_context_ends(fixture_bundle, tiny_model):
    """A large --max-tokens: the transformers backend generated past the model's context length
    (positions it was never trained on; a model with learned positions fails there), where vLLM's
    engine ends the request at its max_model_len. Each answer now ends where its prompt and answer
    fill the context, row by row in a batch; a prompt that fills it alone gets no answer but an
    error naming both lengths, as vLLM refuses that prompt."""
    from chexpercept.eval.backends.transformers.backend import answer_caps, loaded_context_length

    bundle = read_bundle(fixture_bundle, lesions=["effusion", "cardiomegaly"])
    spec = resolve(str(tiny_model), backend="transformers")
    backend = TransformersBackend(spec, sampling=Sampling(0.0, 1.0, 6, True))
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    config = json.loads((tiny_model / "config.json").read_text())
    assert backend.context_length == config["text_config"]["max_position_embeddings"]
    assert loaded_context_length(backend.model.config) == backend.context_length
    convs = [Conversation(c, oracle="none") for c in bundle.cases]
    for conv in convs[: len(convs) // 2]:  # later turns too: rows of several lengths in one batch
        conv.answer(Response("(1)", {}))
    requests = [c.pending for c in convs if not c.done]
    full = backend.generate(requests)
    prompts = [r.usage["input_tokens"] for r in full]
    assert len(set(prompts)) >= 2 and all(r.usage["output_tokens"] == 6 for r in full)
    backend.context_length = min(prompts) + 3
    capped = backend.generate(requests)
    for before, after, n in zip(full, capped, prompts):
        room = backend.context_length - n
        if room <= 0:
            assert after.error == (
                f"the prompt ({n:,} tokens) fills the model's context of {backend.context_length:,} "
                "tokens: no answer fits"
            )
            continue
        assert after.error is None and after.usage["output_tokens"] == min(6, room)
        assert before.text.startswith(after.text)  # greedy: the same answer, ended sooner
    assert any(r.error for r in capped) and any(0 < r.usage.get("output_tokens", 0) < 6 for r in capped)
    assert answer_caps([10, 20], 8, None) == [8, 8] and answer_caps([10, 20], 8, 25) == [8, 5]


def test_a_resume_of_the_model_folder_spelled_otherwise_goes_on_under_the_identity_it_continues(
    fixture_bundle, tiny_model, tmp_path, monkeypatch, capsys
):
    """A run made with ``--model tiny`` and resumed with ``--model /abs/tiny/``: the resume check took
    the two spellings as one folder (same_model_id), but each new line carried the fingerprint of the
    settings with the new spelling, so the resume then stopped saying its own earlier lines were
    "made by another run" (red team, stop 44). A resume now goes on under the identity it continues,
    in every process."""
    monkeypatch.chdir(tiny_model.parent)
    out = tmp_path / "runs"
    assert run_tiny(fixture_bundle, out, tiny_model.name, "--limit", "1", "--no-score") == 0
    spelled = str(tiny_model) + "/"
    assert run_tiny(fixture_bundle, out, spelled, "--limit", "2", "--no-score") == 0, capsys.readouterr().err
    (folder,) = out.glob("*/oracle_*")
    lines = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["run"] == lines[1]["run"]
    info = json.loads((folder / "run.json").read_text())
    assert info["settings"]["model_id"] == tiny_model.name  # the identity the run continues
    assert run_tiny(fixture_bundle, out, spelled, "--limit", "2", "--no-score") == 0
    # the recorded relative name from another working folder: the same files, so the same model
    # (it was refused, the name read against the current folder; red team round 2, stop 44)
    monkeypatch.chdir(tmp_path)
    assert run_tiny(fixture_bundle, out, os.path.relpath(tiny_model), "--limit", "3", "--no-score") == 0
    assert len((folder / "results.jsonl").read_text().splitlines()) == 3
    from chexpercept.cli import main as cli

    capsys.readouterr()
    assert cli(["score", str(out)]) == 0, capsys.readouterr().err
