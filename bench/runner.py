"""Benchmark: the batched conversation engine against one conversation at a time (the reference's way).

Same tiny random Gemma3 VLM (`chexpercept make-tiny-model`, transformers backend, CPU), same bundle,
same process, same answers token for token in every mode (checked). For each answer length it
times these modes and reports cases per second and the speed-ups:

* reference_way: what the reference runner does (spec 3.3, 3.9, 7.1 item 4): one conversation to
  its end before the next, one request per model call, every turn's whole conversation computed
  from scratch, every image of the history read, decoded and prepared again on every turn, the
  processor asked for torch tensors (the transformers backend with no_turn_cache=True,
  fast_inputs=False, image_workers=1).
* one_at_a_time: the same loop through our backend as the engine uses it (turn cache, images
  decoded once per conversation, input shortcuts): what batching adds is the rest.
* batch_N: the engine: up to N live conversations, each step one batch (cut into micro-batches
  within --max-batch-tokens padded tokens), each conversation's keys and values kept for its next
  turn (the turn cache), so a turn computes only its new tokens.
* batch_N_no_turn_cache: the engine computing every turn's whole conversation (what the turn
  cache adds).
* batch_N_plain_inputs (--plain-inputs): the engine with the backend's input shortcuts off.

Why answer length matters. A turn costs a prefill (its new tokens with the turn cache, the whole
history of ~130 to ~1,000 tokens without) plus one forward pass per new token. On a CPU a prefill
costs about the same per token batched or not; what batching saves is the fixed cost of each
forward pass (Python, the generate loop, kernel launches), paid per request and new token one at a
time and per micro-batch and new token in the engine. The tiny random model never stops early, so
the answer length is --lengths. Real models: non-thinking VLMs answer these questions in a few to
a few hundred tokens ("Answer: 2", with or without a sentence of reasoning); thinking models in
thousands; the paper allowed 8192 new tokens. On a GPU a batch costs little more than one request,
which a CPU cannot show (see bench/gpu_smoke.sh).

It also counts model calls: one implicit (Oracle-Passed) run against the none + implicit pair the
reference needs for End-to-End and Oracle-Passed numbers, and checks that under greedy decoding the
implicit run's answers equal the none run's up to each case's first wrong answer (so the E2E result
can be read off the implicit run).

    python bench/runner.py                                   # 84 cases; 8, 32, 128 tokens; batch 8 and 64
    python bench/runner.py --lengths 8 --batch-sizes 64 --repeat 1     # a quick subset
    python bench/runner.py --synth --lengths 8 32                      # 1024x1024 phantom X-rays
    python bench/runner.py --plain-inputs --max-batch-tokens 8192 32768 --json runner.json  # bench/RESULTS.md
    .venv-vllm/bin/python bench/runner.py --vllm --synth --per-cell 4 --lengths 8 32 128   # vLLM's engine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from chexpercept.bundle import read_bundle
from chexpercept.eval.backends.transformers.backend import DEFAULT_MAX_BATCH_TOKENS, TransformersBackend
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.tiny_model import build_tiny_model
from chexpercept.testing import write_fixture_bundle


def one_at_a_time(cases, backend, oracle, *, reread_images=False):
    """The reference's loop: each conversation to its end, one request per model call.

    reread_images: also read, decode and prepare every image of the history again on every turn,
    as the reference does (it re-encodes them per call; spec 7.1 item 4).
    """
    results, calls = [], 0
    for case in cases:
        conv = Conversation(case, oracle=oracle)
        while not conv.done:
            if reread_images:
                backend._images.clear()  # new image objects: the pixel cache misses too
            (response,) = backend.generate([conv.pending])
            conv.answer(response)
            calls += 1
        results.append(conv.result())
    return results, calls


def answers(results):
    return {r.key_id: [t.response for t in r.turns] for r in results}


class CallCounter:
    """Counts the generate calls backends make to the model (their micro-batches)."""

    def __init__(self):
        self.calls = 0

    def wrap(self, backend: TransformersBackend) -> TransformersBackend:
        inner = backend._generate

        def counted(requests):
            self.calls += 1
            return inner(requests)

        backend._generate = counted
        return backend


def make_bundle(work: Path, args) -> Path:
    if args.synth:
        from chexpercept.builder.synth import synthesize

        return synthesize(work / "bundle", per_cell=args.per_cell, seed=0)
    return write_fixture_bundle(work / "bundle", per_cell=args.per_cell, image_size=args.image_size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-cell", type=int, default=4, help="cases per (lesion, path) cell (21 cells)")
    parser.add_argument(
        "--lengths", type=int, nargs="+", default=[8, 32, 128], help="answer lengths (max_new_tokens)"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument(
        "--plain-inputs",
        action="store_true",
        help="also time the largest batch with the backend's input shortcuts off (fast_inputs=False, "
        "image_workers=1), to show what they save",
    )
    parser.add_argument("--image-size", type=int, default=256, help="side of the fixture bundle's noise PNGs")
    parser.add_argument(
        "--synth",
        action="store_true",
        help="use a phantom bundle from chexpercept synth (1024x1024 X-ray-like images) instead of the fixture",
    )
    parser.add_argument("--repeat", type=int, default=2, help="timings per mode (the fastest is compared)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument(
        "--max-batch-tokens",
        type=int,
        nargs="+",
        default=[DEFAULT_MAX_BATCH_TOKENS],
        help="the transformers backend's padded-token budgets per generate call (eval/run.py's option); "
        "each batch size is timed with each",
    )
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="time vLLM's real engine instead (needs vLLM): (a) our engine over the vllm backend, (b) the "
        "same requests replayed straight into LLM.chat, (c) the transformers backend with its turn "
        "cache; see bench/runner_vllm.py",
    )
    parser.add_argument(
        "--arch", default="gemma3", choices=("gemma3", "qwen2.5-vl"), help="--vllm: tiny model architecture"
    )
    parser.add_argument(
        "--vllm-batch-size",
        type=int,
        default=256,
        help="--vllm: live conversations (the vllm backend's default)",
    )
    args = parser.parse_args(argv)
    if args.vllm:
        import runner_vllm

        return runner_vllm.main(args)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="chexpercept-bench-runner-"))
    model = build_tiny_model(work / "tiny-vlm")
    bundle = read_bundle(make_bundle(work, args))
    cases = bundle.cases
    n_turns = sum(len(c.turns) for c in cases)

    counter = CallCounter()

    def make_backend(length: int, **options) -> TransformersBackend:
        backend = TransformersBackend(
            resolve(str(model), backend="transformers"),
            sampling=Sampling(temperature=0.0, top_p=1.0, max_tokens=length, greedy=True),
            **options,
        )
        backend.setup(RunContext(root=bundle.root, cases=cases))
        return counter.wrap(backend)

    shortest = min(args.lengths)
    largest = max(args.batch_sizes)
    load_before = os.getloadavg()
    budgets = {}  # engine mode -> padded-token budget
    for budget in args.max_batch_tokens:
        for bs in args.batch_sizes:
            budgets[
                f"batch_{bs}" if budget == DEFAULT_MAX_BATCH_TOKENS else f"batch_{bs}_tokens_{budget}"
            ] = budget
    budgets[f"batch_{largest}_no_turn_cache"] = DEFAULT_MAX_BATCH_TOKENS
    if args.plain_inputs:
        budgets[f"batch_{largest}_plain_inputs"] = DEFAULT_MAX_BATCH_TOKENS
    modes = ["reference_way", "one_at_a_time", *budgets]

    def make_backends(length: int) -> dict[str, TransformersBackend]:
        """The backend each mode uses: ours; ours without the turn cache; the reference's way (no
        turn cache, no input shortcuts); ours with the input shortcuts off."""
        backends = {
            "ours": make_backend(length),
            "fresh": make_backend(length, no_turn_cache=True),
            "reference": make_backend(length, no_turn_cache=True, fast_inputs=False, image_workers=1),
        }
        if args.plain_inputs:
            backends["plain"] = make_backend(length, fast_inputs=False, image_workers=1)
        return backends

    backends = first = make_backends(shortest)  # reused for the shortest length and the model calls
    print(
        f"{len(cases)} cases, {n_turns} turns; tiny Gemma3 on CPU ({torch.get_num_threads()} threads); "
        f"answer lengths {args.lengths}; inputs: {backends['ours'].notes}; "
        f"turn cache: {backends['ours'].turn_cache_note}",
        file=sys.stderr,
    )

    def run(mode: str):
        if mode == "reference_way":
            return one_at_a_time(cases, backends["reference"], "implicit", reread_images=True)[0], None, None
        if mode == "one_at_a_time":
            return one_at_a_time(cases, backends["ours"], "implicit")[0], None, None
        results = []
        if mode.endswith("_plain_inputs"):
            engine_backend = backends["plain"]
        elif mode.endswith("_no_turn_cache"):
            engine_backend = backends["fresh"]
        else:
            engine_backend = backends["ours"]
        engine_backend.max_batch_tokens = budgets[mode]
        cache = engine_backend.turn_cache
        before = (cache.stats.prompt_tokens, cache.stats.reused_tokens) if cache else (0, 0)
        stats = run_conversations(
            cases,
            engine_backend,
            oracle="implicit",
            batch_size=int(mode.split("_")[1]),
            on_finished=results.extend,
        )
        reused = None
        if cache is not None:  # the share of prompt tokens taken from the turn cache
            prompt, taken = cache.stats.prompt_tokens - before[0], cache.stats.reused_tokens - before[1]
            reused = f"{taken}/{prompt}"
        return results, stats, reused

    report = {
        "cases": len(cases),
        "turns": n_turns,
        "bundle": f"chexpercept synth, per cell {args.per_cell}"
        if args.synth
        else f"fixture, {args.image_size}x{args.image_size} noise PNGs, per cell {args.per_cell}",
        "threads": torch.get_num_threads(),
        "max_batch_tokens": budgets,
        "repeats": args.repeat,
        "backend_inputs": backends["ours"].notes,
        "turn_cache": backends["ours"].turn_cache_note,
        "lengths": {},
    }
    implicit_at_shortest = stats_at_shortest = None
    for length in sorted(args.lengths):
        backends = first if length == shortest else make_backends(length)
        run(max(budgets, key=lambda m: (int(m.split("_")[1]), budgets[m])))  # warm-up: the largest tensors
        times: dict[str, list[float]] = {}
        outputs: dict[str, dict] = {}
        calls: dict[str, int] = {}
        new_tokens: dict[str, float] = {}
        steps: dict[str, int] = {}
        reused: dict[str, str] = {}
        # modes alternate, --repeat timings each; the fastest is compared (the least disturbed by
        # other load on the machine), medians are reported too
        for _ in range(args.repeat):
            for mode in modes:
                counter.calls = 0
                start = time.perf_counter()
                results, stats, reused[mode] = run(mode)
                times.setdefault(mode, []).append(time.perf_counter() - start)
                outputs[mode] = answers(results)
                calls[mode] = counter.calls
                turns = [t for r in results for t in r.turns]
                new_tokens[mode] = sum(t.usage["output_tokens"] for t in turns) / len(turns)
                if stats is not None:
                    steps[mode] = stats.rounds
                    if length == shortest and implicit_at_shortest is None:
                        implicit_at_shortest, stats_at_shortest = results, stats
        base = min(times["reference_way"])
        ours = min(times["one_at_a_time"])
        entry = {}
        for mode in modes:
            best = min(times[mode])
            entry[mode] = {
                "best_seconds": round(best, 2),
                "median_seconds": round(statistics.median(times[mode]), 2),
                "cases_per_s": round(len(cases) / best, 3),
                "speedup_vs_reference_way": round(base / best, 2),
                "speedup_vs_one_at_a_time": round(ours / best, 2),
                "generate_calls": calls[mode],
                "mean_new_tokens": round(new_tokens[mode], 2),
                "same_answers_as_reference_way": outputs[mode] == outputs["reference_way"],
            }
            if mode in steps:
                entry[mode]["steps"] = steps[mode]
            if reused[mode]:
                entry[mode]["prompt_tokens_from_turn_cache"] = reused[mode]
        report["lengths"][length] = entry
        print(f"max_new_tokens {length}: {json.dumps(entry)}", file=sys.stderr, flush=True)

    # model calls: one implicit run vs the none + implicit pair (at the shortest length)
    backend = first["ours"]
    backend.max_batch_tokens = DEFAULT_MAX_BATCH_TOKENS
    none_results = []
    none_stats = run_conversations(
        cases, backend, oracle="none", batch_size=max(args.batch_sizes), on_finished=none_results.extend
    )
    none_by_key = {r.key_id: r for r in none_results}
    agree = 0
    for r in implicit_at_shortest:
        first_wrong = next((i for i, t in enumerate(r.turns) if not t.correct), len(r.turns) - 1)
        prefix = [t.response for t in r.turns[: first_wrong + 1]]
        agree += prefix == [t.response for t in none_by_key[r.key_id].turns[: first_wrong + 1]]
    report["model_calls"] = {
        "implicit_run": stats_at_shortest.requests,
        "none_run": none_stats.requests,
        "none_plus_implicit": none_stats.requests + stats_at_shortest.requests,
        "cases_whose_e2e_prefix_matches": f"{agree}/{len(cases)}",
    }
    report["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
