"""Benchmark: the batched conversation engine against one conversation at a time (the reference's way).

Same tiny random Gemma3 VLM (transformers backend, CPU), same phantom bundle, same process: first a
plain loop that runs one conversation to its end, one request per call, before starting the next
(what the reference runner does); then the engine, which advances up to --batch-size
conversations together and sends each step as one batched generate call. It checks that both give
the same answers, and reports cases per second and the speed-up.

It also counts model calls: one implicit (Oracle-Passed) run against the none + implicit pair the
reference needs for End-to-End and Oracle-Passed numbers, and checks that under greedy decoding the
implicit run's answers equal the none run's up to each case's first wrong answer (so the E2E result
can be read off the implicit run).

    python bench/runner.py                      # defaults: 4 cases per cell (84 cases), batch 64
    python bench/runner.py --per-cell 3 --batch-sizes 8 64 --repeat 1
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
from chexpercept.eval.backend_transformers import TransformersBackend
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve
from chexpercept.eval.tiny_model import build_tiny_model
from chexpercept.testing import write_fixture_bundle


def one_at_a_time(cases, backend, oracle, *, reread_images=False):
    """The reference's loop: each conversation to its end, one request per model call.

    reread_images: also read and decode every image of the history again on every turn, as the
    reference does (it re-encodes them per call; spec 7.1 item 4).
    """
    results, calls = [], 0
    for case in cases:
        conv = Conversation(case, oracle=oracle)
        while not conv.done:
            if reread_images:
                backend._images.clear()
            (response,) = backend.generate([conv.pending])
            conv.answer(response)
            calls += 1
        results.append(conv.result())
    return results, calls


def answers(results):
    return {r.key_id: [t.response for t in r.turns] for r in results}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-cell", type=int, default=4, help="cases per (lesion, path) cell (21 cells)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64])
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=256, help="side of the fixture bundle's noise PNGs")
    parser.add_argument(
        "--synth",
        action="store_true",
        help="use a phantom bundle from chexpercept synth (1024x1024 X-ray-like images) instead of the fixture",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timings per mode (the fastest is compared)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args(argv)

    import torch

    work = Path(tempfile.mkdtemp(prefix="chexpercept-bench-runner-"))
    model = build_tiny_model(work / "tiny-vlm")
    bundle = read_bundle(
        write_fixture_bundle(work / "bundle", per_cell=args.per_cell, image_size=args.image_size)
    )
    cases = bundle.cases
    n_turns = sum(len(c.turns) for c in cases)
    sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=args.max_tokens, greedy=True)
    backend = TransformersBackend(resolve(str(model), backend="transformers"), sampling=sampling)
    backend.setup(RunContext(root=bundle.root, cases=cases))
    print(
        f"{len(cases)} cases, {n_turns} turns; tiny Gemma3 on CPU ({torch.get_num_threads()} threads); "
        f"max_new_tokens {args.max_tokens}",
        file=sys.stderr,
    )
    backend.generate([Conversation(cases[0], oracle="implicit").pending])  # warm-up

    # Modes alternate and each is timed --repeat times; the fastest time of each is compared
    # (the least disturbed by other load on the machine), medians are reported too.
    times: dict[str, list[float]] = {}
    outputs: dict[str, dict] = {}
    stats_of: dict[int, object] = {}
    implicit = None
    for _ in range(args.repeat):
        for mode in ["reference_way", "one_at_a_time", *[f"batch_{bs}" for bs in args.batch_sizes]]:
            start = time.perf_counter()
            if mode == "reference_way":
                results, _calls = one_at_a_time(cases, backend, "implicit", reread_images=True)
            elif mode == "one_at_a_time":
                results, _calls = one_at_a_time(cases, backend, "implicit")
            else:
                bs = int(mode.split("_")[1])
                results = []
                stats_of[bs] = run_conversations(
                    cases, backend, oracle="implicit", batch_size=bs, on_finished=results.extend
                )
                implicit = results
            times.setdefault(mode, []).append(time.perf_counter() - start)
            outputs[mode] = answers(results)

    def summary(mode: str, what: str) -> dict:
        best = min(times[mode])
        return {
            "what": what,
            "best_seconds": round(best, 2),
            "median_seconds": round(statistics.median(times[mode]), 2),
            "cases_per_s": round(len(cases) / best, 3),
            "same_answers_as_one_at_a_time": outputs[mode] == outputs["one_at_a_time"],
        }

    report = {
        "cases": len(cases),
        "turns": n_turns,
        "bundle": "chexpercept synth (1024x1024)"
        if args.synth
        else f"fixture, {args.image_size}x{args.image_size} noise",
        "max_new_tokens": args.max_tokens,
        "threads": torch.get_num_threads(),
        "repeats": args.repeat,
        "reference_way": summary(
            "reference_way", "one conversation at a time, every image of the history decoded again each turn"
        ),
        "one_at_a_time": summary(
            "one_at_a_time", "one conversation at a time, images decoded once per conversation"
        ),
        "batched": {},
    }
    for bs in args.batch_sizes:
        mode = f"batch_{bs}"
        entry = summary(mode, f"engine, up to {bs} conversations per step")
        entry["speedup_vs_one_at_a_time"] = round(min(times["one_at_a_time"]) / min(times[mode]), 2)
        entry["speedup_vs_reference_way"] = round(min(times["reference_way"]) / min(times[mode]), 2)
        entry["steps"] = stats_of[bs].steps
        report["batched"][bs] = entry

    # model calls: one implicit run vs the none + implicit pair
    none_results = []
    none_stats = run_conversations(
        cases, backend, oracle="none", batch_size=max(args.batch_sizes), on_finished=none_results.extend
    )
    none_by_key = {r.key_id: r for r in none_results}
    agree = 0
    for r in implicit:
        first_wrong = next((i for i, t in enumerate(r.turns) if not t.correct), len(r.turns) - 1)
        prefix = [t.response for t in r.turns[: first_wrong + 1]]
        agree += prefix == [t.response for t in none_by_key[r.key_id].turns[: first_wrong + 1]]
    implicit_calls = stats_of[max(args.batch_sizes)].requests
    report["model_calls"] = {
        "implicit_run": implicit_calls,
        "none_run": none_stats.requests,
        "none_plus_implicit": none_stats.requests + implicit_calls,
        "cases_whose_e2e_prefix_matches": f"{agree}/{len(cases)}",
    }
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
