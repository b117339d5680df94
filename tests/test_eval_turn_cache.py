"""The turn cache: which tokens a turn takes from its conversation's last turn, and that the
answers stay those of computing every turn from scratch."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.transformers.backend import TransformersBackend
from chexpercept.eval.backends.transformers.prefill_masks import (
    FULL,
    SLIDING,
    prefill_masks,
    same_as_model,
    window_start,
)
from chexpercept.eval.backends.transformers.turn_cache import (
    TurnCache,
    common_prefix,
    image_runs,
    outside_runs,
)
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.results import iter_results

IMAGE, STOP, PAD = 9, 1, 0


def left_padded(rows):
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), PAD, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    return ids, mask


def fake_generate(plan, ids, new_tokens, layers=2):
    """generate's outputs for a plan: sequences and a cache whose every key/value is its slot
    number plus 1000 x its row, so where each stored value came from can be read back."""
    sequences = torch.cat([torch.as_tensor(ids), torch.as_tensor(new_tokens)], dim=1)
    slots = sequences.shape[1] - 1  # the last new token is never fed
    values = torch.arange(slots, dtype=torch.float32)[None, :] + 1000 * torch.arange(len(ids))[:, None]
    kv = values[:, None, :, None]  # [batch, heads=1, slots, dim=1]
    return sequences, SimpleNamespace(layers=[SimpleNamespace(keys=kv, values=-kv) for _ in range(layers)])


def test_token_helpers():
    ids = np.array([5, 9, 9, 6, 9, 7, 9])
    assert image_runs(ids, IMAGE) == [(1, 3), (4, 5), (6, 7)]
    assert image_runs(np.array([5, 6]), IMAGE) == []
    assert common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5])) == 2
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 4])) == 2
    assert (
        outside_runs(2, [(1, 3)]) == 1 and outside_runs(3, [(1, 3)]) == 3 and outside_runs(1, [(1, 3)]) == 1
    )


def test_a_turn_reuses_its_history_and_a_first_turn_the_shared_start():
    cache = TurnCache(IMAGE, [STOP])
    a1, b1 = [5, 6, 9, 9, 7, 8], [5, 6, 7]
    ids, mask = left_padded([a1, b1])
    plan = cache.plan(["a", "b"], ids, mask, [["a.png"], []])
    assert (plan.past, plan.reused_tokens, plan.new_images) == (0, 0, [True])
    # a answers 11 then stops (the pad after it is not kept); b answers 12, 13 (14 never fed)
    sequences, out = fake_generate(plan, ids, [[11, STOP, PAD], [12, 13, 14]])
    cache.store(plan, sequences, out)
    assert len(cache) == 2

    # next turn: a re-sends its answer; b's answer comes back tokenized differently; c starts
    # with the same two tokens and another image where a had its image
    a2 = [*a1, 11, STOP, 20, 21]
    b2 = [*b1, 12, 99, 30]
    c1 = [5, 6, 9, 9, 40]
    ids, mask = left_padded([a2, b2, c1])
    plan = cache.plan(["a", "b", "c"], ids, mask, [["a.png"], [], ["c.png"]])
    # new parts: a 2, b 2 (from the 99), c 3 (its image differs from a's): all rows compute
    # the last 3 slots, so a takes 7 tokens from the cache, b 3, c 2 (the shared start)
    assert [r.reused for r in plan.rows] == [7, 3, 2]
    assert (plan.width, plan.past) == (10, 7)
    assert plan.new_images == [False, True]  # a's image is cached, c's is computed
    assert plan.rows[2].source is cache._stored["a"] or plan.rows[2].source is cache._stored["b"]
    kv = cache.cache_for(plan).layers[0].keys[:, 0, :, 0]
    assert kv[0].tolist() == [0, 1, 2, 3, 4, 5, 6]  # a's own slots 0..6
    assert kv[1].tolist() == [0, 0, 0, 0, 1003, 1004, 1005]  # b's tokens sat at slots 3.. in row 1
    donor = kv[2, 5:].tolist()
    assert kv[2, :5].tolist() == [0] * 5 and donor in ([0, 1], [1003, 1004])
    assert cache.stats.reused_tokens == 12 and cache.stats.prompt_tokens == 9 + 10 + 6 + 5

    cache.keep_only(["a"])
    assert len(cache) == 1


def test_sliding_window_layers_keep_every_slot_but_attend_over_their_window():
    from transformers.cache_utils import DynamicSlidingWindowLayer

    cache = TurnCache(IMAGE, [STOP], windows=[4, None])
    ids, mask = left_padded([[5, 6, 7, 8, 8, 8, 8, 8]])
    plan = cache.plan(["a"], ids, mask, [[]])
    assert cache.cache_for(plan).get_seq_length() == 0
    cache.store(plan, *fake_generate(plan, ids, [[11, 12]]))
    ids, mask = left_padded([[5, 6, 7, 8, 8, 8, 8, 8, 11, 20, 21]])
    plan = cache.plan(["a"], ids, mask, [[]])
    assert plan.past == 9
    kv = cache.cache_for(plan)
    sliding, full = kv.layers
    assert isinstance(sliding, DynamicSlidingWindowLayer) and not full.is_sliding
    assert kv.get_seq_length() == 9 and sliding.get_mask_sizes(2) == (5, 6)
    new = torch.full((1, 1, 2, 1), -7.0)
    keys, _ = sliding.update(new, new)
    assert keys[0, 0, :, 0].tolist() == [6, 7, 8, -7, -7]  # the window (3 slots) and the new ones
    assert sliding.keys.shape[2] == 11  # every slot kept for the turn cache
    keys, _ = full.update(new, new)
    assert keys.shape[2] == 11


def test_turns_beyond_the_memory_budget_are_not_kept():
    # each token's keys and values: 2 layers x (keys + values) x 1 head x 1 value x 4 bytes
    cache = TurnCache(IMAGE, [STOP], max_bytes=170)
    ids, mask = left_padded([[5, 6, 7, 8, 8, 8], [5, 6, 7]])
    plan = cache.plan(["a", "b"], ids, mask, [[], []])
    cache.store(plan, *fake_generate(plan, ids, [[11, 12, 13], [12, 13, 14]]))
    # a keeps 8 tokens (128 bytes); b's 5 (80 bytes) would pass the budget
    assert len(cache) == 1 and cache.nbytes == 128 and cache.stats.not_kept == 1
    ids, mask = left_padded([[5, 6, 7, 8, 8, 8, 11, 12, 20], [5, 6, 7, 12, 13, 20]])
    plan = cache.plan(["a", "b"], ids, mask, [[], []])
    assert plan.rows[0].source is cache._stored["a"] and plan.rows[1].source is cache._stored["a"]
    # a's next turn replaces its own (its old entry no longer counts against the budget)
    cache.store(plan, *fake_generate(plan, ids, [[STOP, PAD], [STOP, PAD]]))
    assert set(cache._stored) == {"a"} and cache.nbytes == 160 and cache.stats.not_kept == 2


def test_the_common_cut_never_splits_an_image():
    cache = TurnCache(IMAGE, [STOP])
    a1, b1 = [5, 6, 7, 8, 8], [5, 6, 7, 8, 8]
    ids, mask = left_padded([a1, b1])
    plan = cache.plan(["a", "b"], ids, mask, [[], []])
    cache.store(plan, *fake_generate(plan, ids, [[STOP, PAD], [STOP, PAD]]))
    # a's new part is 2 tokens, b's 5 (an image then 3 tokens): b's cut at len-5 is fine, but a's
    # cut would fall inside its own image run, so the whole batch moves back to the run's start
    a2 = [*a1, 9, 9, 9, 4, 4]
    b2 = [*a1, 3, 9, 9, 4, 4]
    ids, mask = left_padded([a2, b2])
    plan = cache.plan(["a", "b"], ids, mask, [["x.png"], ["y.png"]])
    assert [r.reused for r in plan.rows] == [5, 5]
    assert plan.new_images == [True, True]
    for row in plan.rows:
        assert all(not start < row.reused < end for start, end in row.runs)


def test_a_batch_whose_image_tokens_do_not_map_onto_its_images_is_not_planned():
    cache = TurnCache(IMAGE, [STOP])
    ids, mask = left_padded([[5, 9, 9, 6]])
    assert cache.plan(["a"], ids, mask, [["a.png", "b.png"]]) is None
    ids = np.array([[5, 6, PAD, 7]])
    assert cache.plan(["a"], ids, np.array([[1, 1, 0, 1]]), [[]]) is None  # not left padding


# ---------------------------------------------------------------------------- masks, tiny model
@pytest.fixture(scope="module")
def effusion(fixture_bundle):
    return read_bundle(fixture_bundle, lesions=["effusion"])


def tiny_backend(model, bundle, max_tokens=3, **options):
    backend = TransformersBackend(
        resolve(str(model), backend="transformers"),
        sampling=Sampling(0.0, 1.0, max_tokens, True),
        **options,
    )
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    return backend


def test_broadcast_masks_equal_the_models_own(tiny_model, effusion):
    from test_eval_transformers import walk_to_last_turn

    backend = tiny_backend(tiny_model, effusion)
    rr = next(c for c in effusion.cases if c.path == "RR")
    requests = walk_to_last_turn(rr)
    inputs = backend._encode([backend.build_conversation(r) for r in (requests[0], requests[-1])])
    mask, types = inputs["attention_mask"], inputs["token_type_ids"]
    width = mask.shape[1]
    assert (types == 1).any(dim=1).all()  # both rows hold images
    for start in (0, 1, 40, width // 2, width - 2):
        assert same_as_model(backend.model, mask, types, start, width - 1) == ""
    window = backend.model.config.text_config.sliding_window
    start = width // 2
    whole = prefill_masks(mask, types, start, width - 1, window)
    first = window_start(start, window)
    cut = prefill_masks(mask, types, start, width - 1, window, sliding_from=first, kinds=[SLIDING])
    assert set(cut) == {SLIDING} and set(whole) == {FULL, SLIDING}
    assert torch.equal(cut[SLIDING], whole[SLIDING][..., first:])
    assert not whole[SLIDING][..., :first].any()  # what the prefill leaves out is masked anyway
    with pytest.raises(ValueError, match="leave out"):
        prefill_masks(mask, types, start, width - 1, window, sliding_from=first + 1)


# ---------------------------------------------------------------------------- the backend
def answers(results):
    return {r.key_id: [(t.response, t.usage) for t in r.turns] for r in results}


@pytest.mark.parametrize(
    ("oracle", "attention"), [("implicit", None), ("explicit", None), ("implicit", "eager")]
)
def test_reused_turns_answer_as_fresh_ones(tiny_model, fixture_bundle, oracle, attention):
    """Same responses with and without the turn cache; with eager attention the prefill of a
    reused turn runs inside generate with the model's own masks."""
    bundle = read_bundle(fixture_bundle)
    runs = {}
    for turn_cache in (True, False):
        backend = tiny_backend(
            tiny_model, bundle, max_tokens=6, no_turn_cache=not turn_cache, attn_implementation=attention
        )
        results = []
        run_conversations(bundle.cases, backend, oracle=oracle, batch_size=8, on_finished=results.extend)
        runs[turn_cache] = (answers(results), backend.describe())
    (cached, on), (fresh, off) = runs[True], runs[False]
    assert cached == fresh  # every response and its token counts
    how = "the model's own prefill masks" if attention == "eager" else "masks built by broadcasting"
    assert on["turn_cache"].startswith("on: ") and how in on["turn_cache"]
    assert off["turn_cache"] == "off (--no-turn-cache)" and "turn_cache_reused_tokens" not in off
    assert on["turn_cache_reused_tokens"] > 0.5 * on["turn_cache_prompt_tokens"]
    assert on["turn_cache_turns_not_kept"] == 0 and on["turn_cache_gib"] > 0


def test_a_full_memory_budget_computes_turns_from_scratch(tiny_model, fixture_bundle):
    bundle = read_bundle(fixture_bundle)
    results = {}
    for gib in (4e-4, None):  # 420 KiB: one or two conversations of the tiny model (2 KiB a token)
        backend = tiny_backend(tiny_model, bundle, max_tokens=4, turn_cache_gib=gib)
        found = []
        run_conversations(bundle.cases, backend, oracle="implicit", batch_size=8, on_finished=found.extend)
        results[gib] = (answers(found), backend.describe())
    (small, tight), (_, roomy) = results[4e-4], results[None]
    assert small == results[None][0]
    assert tight["turn_cache"].startswith("on: ") and tight["turn_cache_turns_not_kept"] > 0
    assert 0 < tight["turn_cache_reused_tokens"] < roomy["turn_cache_reused_tokens"]
    with pytest.raises(ValueError, match="--turn-cache-gib must be a number above 0 and at most 1048576"):
        TransformersBackend(
            resolve("any", backend="transformers"), sampling=Sampling(0, 1, 2, True), turn_cache_gib=0
        )


def test_a_cache_that_would_change_the_answers_is_not_used(tiny_model, effusion, monkeypatch):
    real = TurnCache.cache_for

    def corrupted(self, plan):
        cache = real(self, plan)
        for layer in cache.layers:
            if layer.is_initialized:  # a reused turn's keys
                layer.keys = torch.randn_like(layer.keys) * 100
        return cache

    monkeypatch.setattr(TurnCache, "cache_for", corrupted)
    backend = tiny_backend(tiny_model, effusion, max_tokens=16)
    assert backend.turn_cache is None
    assert backend.describe()["turn_cache"].startswith("off: reusing the cache changed the answers")
    (response,) = backend.generate([walk_first(effusion)])  # the plain path still answers
    assert response.usage["output_tokens"] == 16


def walk_first(bundle):
    from chexpercept.eval.conversation import Conversation

    return Conversation(bundle.cases[0], oracle="none").pending


def test_run_records_the_turn_cache_and_no_turn_cache_gives_the_same_results(
    fixture_bundle, tiny_model, tmp_path
):
    from test_eval_transformers import run_tiny

    for name, extra in (("cached", ()), ("fresh", ("--no-turn-cache",))):
        assert run_tiny(fixture_bundle, tmp_path / name, tiny_model, "--batch-size", "6", *extra) == 0
    folders = {name: tmp_path / name / "tiny-vlm" / "oracle_implicit" for name in ("cached", "fresh")}
    settings = {k: json.loads((f / "run.json").read_text())["backend_settings"] for k, f in folders.items()}
    assert settings["cached"]["turn_cache"].startswith("on: ")
    assert settings["cached"]["turn_cache_reused_tokens"] > 0
    assert settings["fresh"]["turn_cache"] == "off (--no-turn-cache)"
    assert (folders["cached"] / "results.jsonl").read_bytes() == (
        folders["fresh"] / "results.jsonl"
    ).read_bytes()
    assert len(list(iter_results(folders["cached"] / "results.jsonl"))) == 6
