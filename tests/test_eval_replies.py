"""What the backends hand the parser: reasoning markers that are special tokens are kept beside the
reply as the reference records it (issue: field case 1, "what the backends hand the parser")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from chexpercept.answers import parse_answer
from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.replies import MarkerDecoder, join_reasoning
from chexpercept.eval.backends.vllm.backend import VLLMBackend
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve

GEMMA4_MARKERS = ["<|channel>", "<channel|>"]


@pytest.fixture(scope="module")
def tokenizers(tiny_model):
    """The tiny Gemma 3 tokenizer as it is (MedGemma's <unused94>/<unused95>: ordinary tokens, as in
    the real one), and a copy with Gemma 4's channel markers added as special tokens."""
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_model)
    special = AutoTokenizer.from_pretrained(tiny_model)
    special.add_special_tokens({"additional_special_tokens": GEMMA4_MARKERS})
    return plain, special


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_ordinary_markers_survive_decoding_so_nothing_is_added(tokenizers):
    plain, _ = tokenizers
    text = "<unused94>thought\nAnswer: 1<unused95>Answer: 2"
    token_ids = ids(plain, text)
    assert plain.decode(token_ids, skip_special_tokens=True) == text
    decoder = MarkerDecoder(plain)
    assert not decoder.active and decoder.full_text(token_ids, text) is None


def test_special_markers_are_kept_for_the_parser(tokenizers):
    _, special = tokenizers
    reply = "<|channel>thought\nDraft: Answer: 1<channel|>Answer: 2<end_of_turn>"
    token_ids = ids(special, reply)
    recorded = special.decode(token_ids, skip_special_tokens=True)  # what the reference records
    assert recorded == "thought\nDraft: Answer: 1Answer: 2"
    decoder = MarkerDecoder(special)
    assert decoder.active and set(decoder.markers.values()) == set(GEMMA4_MARKERS)
    full = decoder.full_text(token_ids, recorded)
    assert full == "<|channel>thought\nDraft: Answer: 1<channel|>Answer: 2"  # other specials dropped
    # strict mode reads the answer outside the thought only with the markers
    assert parse_answer(full, mode="strict").indices == (2,)
    cut = decoder.full_text(ids(special, "<|channel>thought\nDraft: Answer: 1"), "thought\nDraft: Answer: 1")
    assert parse_answer(cut, mode="strict").indices == (-1,)
    assert parse_answer("thought\nDraft: Answer: 1", mode="strict").indices == (1,)  # what it would read
    # a reply without markers needs nothing more
    assert decoder.full_text(ids(special, "Answer: 2"), "Answer: 2") is None


def test_the_vllm_backend_keeps_special_markers(tokenizers, fixture_bundle):
    _, special = tokenizers
    reply = "<|channel>thought\nAnswer: 1<channel|>Answer: 2"
    token_ids = ids(special, reply)
    recorded = special.decode(token_ids, skip_special_tokens=True)

    class LLM:
        def __init__(self, **kwargs):
            pass

        def get_tokenizer(self):
            return special

        def chat(self, messages, **kwargs):
            completion = SimpleNamespace(text=recorded, token_ids=token_ids, finish_reason="stop")
            return [
                SimpleNamespace(prompt_token_ids=[1], num_cached_tokens=0, outputs=[completion])
                for _ in messages
            ]

    bundle = read_bundle(fixture_bundle, lesions=["effusion"], paths=["LF"])
    backend = VLLMBackend(
        resolve("gemma4-31b"),
        sampling=Sampling(0.0, 1.0, 16, True),
        llm_class=LLM,
        sampling_params_class=lambda **kw: kw,
        platform="cpu",
    )
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    records = []
    run_conversations(
        bundle.cases, backend, oracle="none", parse_mode="strict", batch_size=4, on_finished=records.extend
    )
    turn = records[0].turns[0]
    assert turn.response == recorded and turn.full_response == reply
    assert turn.parsed == [2]


def test_api_reasoning_fields_are_put_back_between_the_familys_markers():
    assert join_reasoning("r", "Answer: 2", "Qwen/Qwen3.6-27B") == "<think>r</think>Answer: 2"
    assert join_reasoning("r", None, "Qwen/Qwen3.6-27B") == "<think>r"  # never finished
    assert join_reasoning("r", "Answer: 2", "google/medgemma-27b-it") == "<unused94>r<unused95>Answer: 2"
    assert join_reasoning("r", "", "my-model") == "<think>r</think>"
    assert join_reasoning(None, "Answer: 2", "Qwen/Qwen3.6-27B") is None
