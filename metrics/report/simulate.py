"""Simulated result records (our runner's format) for tests, benchmarks and demos of the report.

A simulated model answers each turn correctly with a given probability, otherwise it names a wrong
option or (rarely) writes something unparseable. Records carry the conversation as a model would have
seen it (system message, user turns with their images, answers patched to the gold under the implicit
oracle). These are not the runner's exact oracle rules: they exist so the report can be built and
checked without a model. Accuracy 1.0 is the oracle baseline (every answer is the gold).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path as FsPath
from typing import Any

from chexpercept import templates
from chexpercept.answers import oracle_answer_text
from chexpercept.bundle import Bundle
from chexpercept.case import Case
from chexpercept.fileio import atomic_file, write_json_atomic
from chexpercept.metrics.simulate import answer_text, wrong_indices
from chexpercept.results import RESULTS_NAME, RUN_NAME, CaseResult, TurnResult, judge_turn
from chexpercept.run_metadata import BundleInfo, RunMetadata, SamplingInfo


def simulate_case(
    case: Case,
    *,
    accuracy: float | Mapping[str, float],
    oracle: str = "implicit",
    unparsed_rate: float = 0.0,
    seed: int = 0,
) -> CaseResult:
    """One case answered by a simulated model (seeded per case, so order does not matter)."""
    rnd = random.Random(f"{seed}:{case.key_id}")
    conversation: list[dict[str, Any]] = [{"role": "system", "text": templates.SYSTEM_MESSAGE, "images": []}]
    turns: list[TurnResult] = []
    for turn in case.turns:
        p = accuracy if isinstance(accuracy, (int, float)) else accuracy.get(turn.task, 0.5)
        gold = list(turn.answer_index)
        roll = rnd.random()
        if roll < p:
            response = answer_text(gold)
        elif roll < p + unparsed_rate * (1 - p):
            response = "I cannot determine this from the image."
        else:
            response = answer_text(wrong_indices(turn, rnd))
        record = judge_turn(turn, response, usage={"input_tokens": 100 * len(turns), "output_tokens": 4})
        if oracle == "implicit" and not record.correct:
            record.patched_to = oracle_answer_text(gold)
        conversation.append({"role": "user", "text": turn.text, "images": list(turn.images)})
        conversation.append({"role": "assistant", "text": record.patched_to or response, "images": []})
        turns.append(record)
    return CaseResult(
        key_id=case.key_id,
        lesion=case.lesion,
        path=case.path.value,
        oracle=oracle,
        turns=turns,
        conversation=conversation,
    )


def simulate_run(
    bundle: Bundle,
    out_root: str | FsPath,
    model: str,
    *,
    accuracy: float | Mapping[str, float],
    oracle: str = "implicit",
    unparsed_rate: float = 0.0,
    seed: int = 0,
) -> FsPath:
    """Write ``out_root/<model>/oracle_<oracle>/{results.jsonl,run.json}`` for a simulated model."""
    run_dir = FsPath(out_root) / model / f"oracle_{oracle}"
    with atomic_file(run_dir / RESULTS_NAME, "w", encoding="utf-8") as f:
        for case in bundle.cases:
            rec = simulate_case(
                case, accuracy=accuracy, oracle=oracle, unparsed_rate=unparsed_rate, seed=seed
            )
            f.write(rec.to_json() + "\n")
    meta = RunMetadata(
        model=model,
        backend="simulated",
        oracle=oracle,
        parse_mode="reference",
        sampling=SamplingInfo(temperature=0.0, top_p=1.0, max_tokens=16, greedy=True),
        seed=seed,
        bundle=BundleInfo(
            path=str(bundle.root), fingerprint=bundle.fingerprint(), synthetic=bundle.synthetic
        ),
        versions={},
        git_commit=None,
        started="2026-01-01T00:00:00Z",
        finished="2026-01-01T00:00:01Z",
    )
    write_json_atomic(run_dir / RUN_NAME, meta.to_json())
    return run_dir


#: simulated models for tests, benchmarks and demos: name -> probability of a correct answer per turn
SAMPLE_MODELS: dict[str, float] = {"oracle": 1.0, "steady": 0.75, "guesser": 0.4}


def write_simulated_runs(
    bundle: Bundle,
    out_root: str | FsPath,
    *,
    models: Mapping[str, float] = SAMPLE_MODELS,
    oracles: tuple[str, ...] = ("implicit",),
    unparsed_rate: float = 0.05,
    seed: int = 0,
) -> list[FsPath]:
    """One simulated run per model and oracle setting; the oracle model never fails to parse."""
    return [
        simulate_run(
            bundle,
            out_root,
            name,
            accuracy=acc,
            oracle=oracle,
            unparsed_rate=0.0 if acc >= 1.0 else unparsed_rate,
            seed=seed,
        )
        for name, acc in models.items()
        for oracle in oracles
    ]
