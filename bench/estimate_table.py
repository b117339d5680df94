"""The README's table of ``chexpercept estimate`` for every API model of the registry, on a phantom
bundle of the release's composition (2,100 cases, 10,400 questions, 1024 x 1024 images).

    python bench/estimate_table.py [--answer-tokens 1000]

Prints one markdown table (all three oracle settings together, the range of the all-right and
all-wrong scenarios) and the time the estimates took. Phantom questions use the release's templates,
so their lengths are close to the release's; the numbers are estimates, not measurements.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from chexpercept.bundle import read_bundle
from chexpercept.eval.estimate.command import _cell
from chexpercept.eval.estimate.count import ApiCounter, estimate_bounds, total
from chexpercept.eval.estimate.pricing import rules_for
from chexpercept.eval.registry import REGISTRY
from chexpercept.results import ORACLE_SETTINGS
from chexpercept.testing import write_fixture_bundle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answer-tokens", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_fixture_bundle(tmp, per_cell=100, image_size=1024, image_style="smooth", image_pool=16)
        bundle = read_bundle(tmp, check_images="exists")
        questions = sum(len(c.tasks) for c in bundle.cases)
        print(f"phantom bundle: {len(bundle.cases):,} cases, {questions:,} questions")
        print()
        print(
            "| model | counted by | calls (3 settings) | input tokens | cached input | output tokens | USD | USD without caching |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for spec in REGISTRY.values():
            if spec.backend != "openai":
                continue
            start = time.perf_counter()
            counter = ApiCounter(bundle.root, rules_for(spec.model_id), answer_tokens=args.answer_tokens)
            bounds = [
                estimate_bounds(
                    bundle.cases, o, counter, model_id=spec.model_id, answer_tokens=args.answer_tokens
                )
                for o in ORACLE_SETTINGS
            ]
            lo, hi = total((b[0] for b in bounds), "min"), total((b[1] for b in bounds), "max")
            print(
                f"| {spec.display} | {counter.rules.name} | {_cell(lo.calls, hi.calls)} "
                f"| {_cell(lo.input_tokens, hi.input_tokens)} "
                f"| {_cell(lo.cached_input_tokens, hi.cached_input_tokens)} | {_cell(lo.output_tokens, hi.output_tokens)} "
                f"| {_cell(lo.cost_usd, hi.cost_usd, '{:,.0f}')} "
                f"| {_cell(lo.cost_usd_without_cache, hi.cost_usd_without_cache, '{:,.0f}')} |"
                f"  <!-- {time.perf_counter() - start:.1f} s, text: {'exact' if counter.exact else 'approx'} -->"
            )


if __name__ == "__main__":
    main()
