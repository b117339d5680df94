"""The scorer and the metrics: per-turn correctness for each case, and our scorer's numbers over
the run.

Each case's score is a dict of its turns, ``{task: 1.0 or 0.0}`` (the verdict our ``Conversation``
gave, with the run's parse mode), its answer every turn's parsed options, and its metadata the
case's record (the results.jsonl record our runner writes). The metric ``chexpercept`` gives the
End-to-End and Oracle-Passed stage accuracies and the depth per route: ``chexpercept.metrics``'
``score_model`` over those records, the numbers ``chexpercept score`` prints under the same flat
keys (``e2e/stage<k>/all``, ``op/stage<k>/all``, ``depth/<route>``). A number that does not apply
(e.g. End-to-End from a sampled Oracle-Passed run) is left out.
"""

from __future__ import annotations

from typing import Any

from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, metric, scorer
from inspect_ai.solver import TaskState

from chexpercept.results import CaseResult

from .solver import GREEDY_KEY, RECORD_KEY

#: the flat metrics (chexpercept.metrics.FLAT_KEYS) the task reports
METRIC_KEYS: tuple[str, ...] = (
    *(f"e2e/stage{k}/all" for k in (1, 2, 3, 4)),
    *(f"op/stage{k}/all" for k in (2, 3, 4)),
    *(f"depth/{p}" for p in ("RR", "RF", "LF")),
)


def records(scores: list[SampleScore]) -> tuple[list[CaseResult], bool]:
    """The case records in ``scores`` (one per case), and whether every one was decoded greedily."""
    out: list[CaseResult] = []
    greedy = True
    for s in scores:
        meta = s.score.metadata or {}
        if "record" in meta:
            out.append(CaseResult.from_dict(meta["record"]))
            greedy = greedy and bool(meta.get("greedy"))
    return out, greedy


def check_one_run(cases: list[CaseResult]) -> None:
    """ValueError when the records were made by different evals (their ``run`` fields differ: another
    model, settings, release or prompts): an ``inspect eval-retry`` over a release changed in place
    kept the finished samples of the old release beside retried ones of the new (red team, stop 48).
    chexpercept.results' one rule (``check_one_identity``) decides."""
    from chexpercept.results import check_one_identity

    check_one_identity("the eval's samples", [(n, c.key_id, c.run) for n, c in enumerate(cases, 1)])


def flat_metrics(cases: list[CaseResult], *, greedy: bool) -> dict[str, float]:
    """Our scorer's numbers for the records of one oracle setting (``METRIC_KEYS``; N/A left out)."""
    from chexpercept.metrics import run_from_records, score_model

    if not cases:
        return {}
    scores = score_model([run_from_records(cases, oracle=cases[0].oracle, greedy=greedy)])
    return {k: float(v) for k in METRIC_KEYS if (v := scores.flat.get(k)) is not None}


@metric(name="chexpercept")
def stage_metrics() -> Metric:
    """End-to-End and Oracle-Passed stage accuracies and depth, from the records (``flat_metrics``)."""

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        cases, greedy = records(scores)
        check_one_run(cases)
        return flat_metrics(cases, greedy=greedy)

    return compute


def explanation(record: dict[str, Any]) -> str:
    """The case's turns as a markdown table, for ``inspect view``."""
    rows = ["| turn | answer | gold | correct | oracle |", "|---|---|---|---|---|"]
    for t in record["turns"]:
        oracle = "patched" if t.get("patched_to") else ("told" if t.get("oracle_text") else "")
        parsed = ",".join(map(str, t["parsed"])) or f"({t['parse_status']})"
        gold = ",".join(map(str, t["gold"]))
        rows.append(f"| {t['task']} | {parsed} | {gold} | {'yes' if t['correct'] else 'no'} | {oracle} |")
    return "\n".join(rows)


@scorer(metrics=[stage_metrics()], name="chexpercept_turns")
def turns_scorer() -> Scorer:
    """Per-turn correctness of each case, judged by our Conversation (parse mode of the task)."""

    async def score(state: TaskState, target: Target) -> Score:
        record = state.store.get(RECORD_KEY)
        if record is None:
            raise RuntimeError(f"case {state.sample_id}: the conversation left no record to score")
        return Score(
            value={t["task"]: 1.0 if t["correct"] else 0.0 for t in record["turns"]},
            answer="; ".join(
                f"{t['task']}: {','.join(map(str, t['parsed'])) or '-'}" for t in record["turns"]
            ),
            explanation=explanation(record),
            metadata={"record": record, "greedy": bool(state.store.get(GREEDY_KEY))},
        )

    return score


def log_records(log: Any) -> list[CaseResult]:
    """The case records of an Inspect eval log (``inspect_ai.log.read_eval_log``): what our runner
    would have written to results.jsonl, for ``chexpercept score`` and the report."""
    out = []
    for sample in log.samples or []:
        for s in (sample.scores or {}).values():
            if s.metadata and "record" in s.metadata:
                out.append(CaseResult.from_dict(s.metadata["record"]))
                break
    return out
