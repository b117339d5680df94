"""lmms-eval's metrics for CheXpercept: the numbers ``chexpercept score`` gives for the same answers.

``process_results`` turns each case's answers into one item (``case_item``; every metric of the task
gets the same item); each metric's aggregation (``aggregate``) replays every case's answers through
``Conversation`` into the records our runner writes (results.jsonl) and scores them with
``chexpercept.metrics.score_model``: End-to-End and Oracle-Passed stage accuracy and depth, per
route and overall, under the keys of ``FLAT_KEYS``. The items hold answers and names only (no
images, no record), so that lmms-eval's ``--log_samples`` stays small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from chexpercept.case import Case

from .checks import SUPPORTED_MODEL
from .replay import open_release, replay

#: what an item holds besides the answers: the same for every case of a task
SETTINGS = ("release", "oracle", "parse_mode", "model", "greedy")


def metric_keys(oracle: str) -> list[str]:
    """The task's metrics: every stage and depth number (``FLAT_KEYS`` without the sub-tasks);
    without an oracle there are no Oracle-Passed numbers."""
    from chexpercept.metrics import FLAT_KEYS

    keys = [k for k in FLAT_KEYS if not k.startswith("sub/")]
    return keys if oracle != "none" else [k for k in keys if not k.startswith("op/")]


def case_item(case: Case, rounds: object, *, task: str, **settings: Any) -> dict[str, Any]:
    """One case's item for every metric: its answers (one per turn) and the task's ``SETTINGS``.

    Raises ValueError naming the case when the model's output is not one answer per turn (a model
    class whose multi-round output is one string, or that stopped early)."""
    where = f"{task}: case {case.key_id} (route {case.path.value}, {len(case.turns)} turns)"
    if isinstance(rounds, str):
        raise ValueError(
            f"{where}: the model returned one string, not one answer per round: its class cannot run "
            f"multi-round conversations; run it with {SUPPORTED_MODEL}"
        )
    if not isinstance(rounds, (list, tuple)) or not all(isinstance(r, str) for r in rounds):
        raise ValueError(f"{where}: expected one answer (a string) per round, got {type(rounds).__name__}")
    if len(rounds) != len(case.turns):
        raise ValueError(f"{where}: the model returned {len(rounds)} answers")
    return {"key_id": case.key_id, "responses": list(rounds), **{k: settings[k] for k in SETTINGS}}


def aggregate(items: Sequence[Mapping[str, Any]], *, key: str) -> float | None:
    """The metric ``key`` (a ``FLAT_KEYS`` name) over the cases' items; None where it is N/A."""
    return _scores(tuple(_frozen(item) for item in items))[key]


def _frozen(item: Mapping[str, Any]) -> tuple[Any, ...]:
    return (item["key_id"], tuple(item["responses"]), *(item[k] for k in SETTINGS))


@lru_cache(maxsize=2)
def _scores(items: tuple[tuple[Any, ...], ...]) -> dict[str, float | None]:
    """Every flat metric of the cases (computed once for all of a task's metrics)."""
    from chexpercept.metrics import run_from_records, score_model

    settings = {item[2:] for item in items}
    if len(settings) != 1:
        raise ValueError(f"the items mix runs: {sorted(settings, key=str)}")
    ((release, oracle, parse_mode, model, greedy),) = settings
    _, cases = open_release(release)
    records = []
    for key_id, answers, *_ in items:
        conversation = replay(
            cases[key_id], answers, release=release, oracle=oracle, parse_mode=parse_mode, model=model
        )
        records.append(conversation.result())
    run = run_from_records(records, oracle=oracle, greedy=greedy, model=model)
    return dict(score_model([run], mode=parse_mode).flat)
