"""Benchmark: the batched conversation engine against one conversation at a time (the reference's way).

Same tiny random Gemma3 VLM (`chexpercept make-tiny-model`, transformers backend, CPU), same bundle,
same process. For each answer length it times: a plain loop that runs one conversation to its end,
one request per model call, before starting the next (what the reference runner does); and the
engine, which advances up to --batch-size conversations together and sends each step as one batched
generate call. It checks that every mode gives the same answers token for token, and reports cases
per second and the speed-up. --reference-way adds the loop that also decodes and prepares every
image of the history again on every turn, as the reference does (spec 7.1 item 4); --plain-inputs
adds the engine with the transformers backend's input shortcuts turned off (see its docstring).

Why answer length matters. A turn costs a prefill (the whole history, ~130 to ~1,000 tokens here,
and its images) plus one forward pass per new token. On a CPU the prefill's cost grows with its
tokens whether rows are batched or not, so batching saves little of it; what batching saves is the
fixed cost of each forward pass (Python, the generate loop, mask building, kernel launches), which
the one-at-a-time loop pays for every request and every new token, and the engine once per
micro-batch and new token. The longer the answers, the larger that share, and the larger the
speed-up. The tiny random model never stops early, so --max-new-tokens is the answer length.
Real models: non-thinking VLMs answer these questions in a few to a few hundred tokens ("Answer: 2"
with or without a sentence of reasoning); thinking models in thousands; the paper allowed 8192 new
tokens. On a GPU a batch costs little more than one request, which a CPU cannot show (see
bench/gpu_smoke.sh).

It also counts model calls: one implicit (Oracle-Passed) run against the none + implicit pair the
reference needs for End-to-End and Oracle-Passed numbers, and checks that under greedy decoding the
implicit run's answers equal the none run's up to each case's first wrong answer (so the E2E result
can be read off the implicit run).

    python bench/runner.py                                   # 84 cases; 8, 32, 128 tokens; batch 8 and 64
    python bench/runner.py --lengths 8 --batch-sizes 64 --repeat 1     # a quick subset
    python bench/runner.py --synth --lengths 8 32 --reference-way      # 1024x1024 phantom X-rays
    python bench/runner.py --reference-way --plain-inputs --max-batch-tokens 8192 32768  # bench/RESULTS.md
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
from chexpercept.eval.backend_transformers import DEFAULT_MAX_BATCH_TOKENS, TransformersBackend
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
        "--reference-way",
        action="store_true",
        help="also time the loop that prepares every history image again on every turn",
    )
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
    args = parser.parse_args(argv)

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
    backend = first = make_backend(shortest)  # reused for the shortest length and the model calls
    plain = None
    print(
        f"{len(cases)} cases, {n_turns} turns; tiny Gemma3 on CPU ({torch.get_num_threads()} threads); "
        f"answer lengths {args.lengths}; inputs: {backend.notes}",
        file=sys.stderr,
    )
    load_before = os.getloadavg()
    budgets = {}  # mode -> padded-token budget
    for budget in args.max_batch_tokens:
        for bs in args.batch_sizes:
            budgets[
                f"batch_{bs}" if budget == DEFAULT_MAX_BATCH_TOKENS else f"batch_{bs}_tokens_{budget}"
            ] = budget
    if args.plain_inputs:
        budgets[f"batch_{max(args.batch_sizes)}_plain_inputs"] = DEFAULT_MAX_BATCH_TOKENS
    modes = ["one_at_a_time", *budgets]
    if args.reference_way:
        modes.insert(0, "reference_way")

    def run(mode: str):
        if mode == "reference_way":
            return one_at_a_time(cases, backend, "implicit", reread_images=True)[0], None
        if mode == "one_at_a_time":
            return one_at_a_time(cases, backend, "implicit")[0], None
        results = []
        engine_backend = plain if mode.endswith("_plain_inputs") else backend
        engine_backend.max_batch_tokens = budgets[mode]
        stats = run_conversations(
            cases,
            engine_backend,
            oracle="implicit",
            batch_size=int(mode.split("_")[1]),
            on_finished=results.extend,
        )
        return results, stats

    report = {
        "cases": len(cases),
        "turns": n_turns,
        "bundle": f"chexpercept synth, per cell {args.per_cell}"
        if args.synth
        else f"fixture, {args.image_size}x{args.image_size} noise PNGs, per cell {args.per_cell}",
        "threads": torch.get_num_threads(),
        "max_batch_tokens": budgets,
        "repeats": args.repeat,
        "backend_inputs": backend.notes,
        "lengths": {},
    }
    implicit_at_shortest = stats_at_shortest = None
    for length in sorted(args.lengths):
        backend = first if length == shortest else make_backend(length)
        if args.plain_inputs:
            plain = make_backend(length, fast_inputs=False, image_workers=1)
        run(max(budgets, key=lambda m: (int(m.split("_")[1]), budgets[m])))  # warm-up: the largest tensors
        times: dict[str, list[float]] = {}
        outputs: dict[str, dict] = {}
        calls: dict[str, int] = {}
        new_tokens: dict[str, float] = {}
        steps: dict[str, int] = {}
        # modes alternate, --repeat timings each; the fastest is compared (the least disturbed by
        # other load on the machine), medians are reported too
        for _ in range(args.repeat):
            for mode in modes:
                counter.calls = 0
                start = time.perf_counter()
                results, stats = run(mode)
                times.setdefault(mode, []).append(time.perf_counter() - start)
                outputs[mode] = answers(results)
                calls[mode] = counter.calls
                turns = [t for r in results for t in r.turns]
                new_tokens[mode] = sum(t.usage["output_tokens"] for t in turns) / len(turns)
                if stats is not None:
                    steps[mode] = stats.steps
                    if length == shortest and implicit_at_shortest is None:
                        implicit_at_shortest, stats_at_shortest = results, stats
        base = min(times["one_at_a_time"])
        entry = {}
        for mode in modes:
            best = min(times[mode])
            entry[mode] = {
                "best_seconds": round(best, 2),
                "median_seconds": round(statistics.median(times[mode]), 2),
                "cases_per_s": round(len(cases) / best, 3),
                "speedup_vs_one_at_a_time": round(base / best, 2),
                "generate_calls": calls[mode],
                "mean_new_tokens": round(new_tokens[mode], 2),
                "same_answers_as_one_at_a_time": outputs[mode] == outputs["one_at_a_time"],
            }
            if mode in steps:
                entry[mode]["steps"] = steps[mode]
            if "reference_way" in times:
                entry[mode]["speedup_vs_reference_way"] = round(min(times["reference_way"]) / best, 2)
        report["lengths"][length] = entry
        print(f"max_new_tokens {length}: {json.dumps(entry)}", file=sys.stderr, flush=True)

    # model calls: one implicit run vs the none + implicit pair (at the shortest length)
    backend = first
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
