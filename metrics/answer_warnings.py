"""Loud warnings when a model's answers could not be read: its numbers then measure the answer
format, not perception.

A turn whose answer the parser cannot read is scored as wrong, so a model whose replies are never in
the expected form scores 0.0 everywhere, which looks like a result. ``answer_warnings(scores)`` takes
one model's ``ModelScores`` (``score_model``, ``score_path``) and returns a warning for every run and
kind of unreadable answer whose share of a task's answers exceeds ``threshold``:

- ``unparsed``: nothing in the reply reads as an answer (likely: the chat template, ``--max-tokens``
  cutting the reply off, or the parse mode);
- ``refused``: the model or the service declined (a refusal, a content filter);
- ``reasoning``: (reference parsing) the answer was read from inside reasoning that never finished
  (a reply cut off by the token limit) or that the parser does not recognise.

The same function serves ``chexpercept score``, ``chexpercept report`` (banners, and the parse-rate
table of its summary page) and the end of ``chexpercept run``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from chexpercept.escape import shell_word, terminal
from chexpercept.vocab import TASKS

if TYPE_CHECKING:  # annotations only (model_scores imports this module inside a method)
    from .model_scores import ModelScores

#: a token budget this large that replies still use up means a model that does not stop
LARGE_BUDGET = 4096

#: a warning is raised when more than this share of a task's answers is of one unreadable kind
DEFAULT_THRESHOLD = 0.10
KINDS: tuple[str, ...] = ("unparsed", "refused", "reasoning")

_WHAT = {
    "unparsed": "could not be read as an answer (scored as wrong)",
    "refused": "were refusals or content-filter rejections (scored as wrong)",
    "reasoning": "were read from inside reasoning that never finished or that the parser does not recognise",
}


@dataclass(frozen=True)
class TaskShare:
    """How many of one task's answers are of one kind."""

    task: str
    count: int
    n: int

    @property
    def share(self) -> float:
        return self.count / self.n if self.n else 0.0


@dataclass(frozen=True)
class AnswerWarning:
    """One run's answers of one unreadable ``kind``, over the tasks where they exceed the threshold."""

    model: str
    #: oracle setting of the run
    oracle: str
    kind: str
    tasks: tuple[TaskShare, ...]
    #: tasks the run asked (so "every task" can be said)
    asked: int
    parse_mode: str
    #: where to look: the run's folder, when known
    path: str | None = None
    #: the run's --max-tokens, when recorded
    max_tokens: int | None = None
    #: of the unreadable answers, how many used the whole token budget (cut off)
    at_token_limit: int = 0
    #: other runs of the model with exactly this finding, (oracle setting, folder): ``merge_warnings``
    also: tuple[tuple[str, str | None], ...] = ()

    @property
    def runs(self) -> tuple[tuple[str, str | None], ...]:
        """(oracle setting, folder) of every run this warning is about."""
        return ((self.oracle, self.path), *self.also)

    @property
    def count(self) -> int:
        return sum(t.count for t in self.tasks)

    @property
    def share(self) -> float:
        """The largest share over the tasks listed."""
        return max((t.share for t in self.tasks), default=0.0)

    def causes(self) -> list[str]:
        """Likely causes, most likely first (from what the run recorded)."""
        out = []
        limit = f"--max-tokens {self.max_tokens}" if self.max_tokens else "--max-tokens"
        if self.kind == "refused":
            return [
                "the model or the endpoint declined (a content filter, a safety policy): read the "
                "`refusal` field of the turns; a filtered endpoint cannot be scored fairly"
            ]
        if self.at_token_limit and self.max_tokens and self.max_tokens >= LARGE_BUDGET:
            out.append(
                f"{self.at_token_limit} of these replies used the whole token budget ({limit}): the model "
                "never stopped, and a larger budget will not make it stop; check its chat template and "
                "stop tokens (a random or broken model writes until the budget is spent; a smaller "
                "--max-tokens only makes such a run shorter)"
            )
        elif self.at_token_limit:
            out.append(
                f"{self.at_token_limit} of these replies used the whole token budget ({limit}): they were "
                "cut off before the answer; raise --max-tokens (reasoning models need thousands)"
            )
        if self.kind == "reasoning":
            out.append(
                f"replies cut off inside their reasoning ({limit} too low), or a reasoning format the "
                "parser does not know; --parse-mode strict refuses these answers"
            )
            return out
        if not self.at_token_limit:
            out.append(f"replies cut off by {limit} before the answer")
        out.append(
            "the chat template or prompt format (the model never writes 'Answer: <n>'; for vllm serve, "
            "a reasoning parser that moves the reply out of message.content)"
        )
        if self.parse_mode == "strict":
            out.append(
                "--parse-mode strict, which reads only 'Answer: ...' statements outside reasoning; compare "
                "with --parse-mode reference"
            )
        return out

    def where(self) -> str:
        paths = [p for _, p in self.runs if p]
        if paths:
            files = " and ".join(f"{p}/results.jsonl" for p in paths)
            return (
                f"the raw replies: `response` in {terminal(files)}, per case: "
                f"chexpercept score {shell_word(paths[0])} --details --cases, or the report's Cases tab"
            )
        return "the raw replies (per case: return_cases=True, or chexpercept score RUN --details --cases)"

    def headline(self) -> str:
        """What was found, in one sentence."""
        every = len(self.tasks) == self.asked and self.asked > 1
        tasks = ", ".join(f"{t.task} {t.count}/{t.n}" for t in self.tasks)
        scope = f"in every task ({tasks})" if every else f"in {tasks}"
        low = min(t.share for t in self.tasks)
        pct = f"{self.share:.0%}" if low == self.share else f"{low:.0%}-{self.share:.0%}"
        *others, last = [o for o, _ in self.runs]
        runs = f"oracle {', '.join(others)} and {last} runs" if others else f"oracle {last} run"
        return (
            f"{terminal(self.model)}, {runs} ({self.parse_mode} parsing): {pct} of the answers "
            f"{_WHAT[self.kind]} {scope}. Its numbers measure the answer format, not perception."
        )

    def text(self) -> str:
        """The warning as one paragraph: what was found, the likely causes, where to look."""
        return f"{self.headline()} Likely: {'; or '.join(self.causes())}. Look at {self.where()}."

    def lines(self) -> list[str]:
        """The warning as the command line prints it: the headline, then one line per cause."""
        return [
            f"WARNING: {self.headline()}",
            *(f"  likely: {c}" for c in self.causes()),
            f"  look at: {self.where()}",
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "oracle": self.oracle,
            "kind": self.kind,
            "count": self.count,
            "tasks": {t.task: {"count": t.count, "n": t.n, "share": t.share} for t in self.tasks},
            "path": self.path,
            "max_tokens": self.max_tokens,
            "at_token_limit": self.at_token_limit,
            "runs": [{"oracle": o, "path": p} for o, p in self.runs],
            "causes": self.causes(),
            "text": self.text(),
        }


def _kind_count(stats: Mapping[str, Any], kind: str) -> int:
    """Answers of ``kind`` in one task's parse statistics (``ModelScores.parse[setting][task]``)."""
    if kind == "refused":
        return int(stats.get("refused", 0))
    if kind == "reasoning":
        return int(stats.get("from_reasoning", 0))
    unparsed = round(float(stats.get("unparsed", 0.0)) * int(stats["n"]))
    return max(0, unparsed - int(stats.get("refused", 0)))  # refusals are unparsed too: counted apart


def answer_warnings(scores: ModelScores, *, threshold: float = DEFAULT_THRESHOLD) -> list[AnswerWarning]:
    """Every (run, kind) whose share of unreadable answers exceeds ``threshold`` in some task.

    scores: one model's ``ModelScores``; reads ``parse`` (per oracle setting, per task: n, unparsed
    share, refused and from_reasoning counts, at_token_limit) and ``runs`` (folder, parse mode,
    max_tokens). threshold: a share in [0, 1). Returns warnings in oracle-setting order, then kind.
    """
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be a share in [0, 1), got {threshold}")
    rows = {r.get("oracle"): r for r in scores.runs}
    out = []
    for setting, per_task in scores.parse.items():
        row = rows.get(setting, {})
        for kind in KINDS:
            over = tuple(
                TaskShare(task, c, int(per_task[task]["n"]))
                for task in TASKS
                if task in per_task
                and (c := _kind_count(per_task[task], kind)) > threshold * int(per_task[task]["n"])
            )
            if not over:
                continue
            limit = sum(int(per_task[t.task].get("at_token_limit", {}).get(kind, 0)) for t in over)
            out.append(
                AnswerWarning(
                    model=scores.name,
                    oracle=setting,
                    kind=kind,
                    tasks=over,
                    asked=len(per_task),
                    parse_mode=scores.mode,
                    path=row.get("path"),
                    max_tokens=row.get("max_tokens"),
                    at_token_limit=limit,
                )
            )
    return out


def merge_warnings(warnings: Sequence[AnswerWarning]) -> list[AnswerWarning]:
    """The warnings with each finding said once: warnings of one model's runs that found exactly the
    same (kind, tasks and counts, parse mode, token budget) become one naming every run."""
    merged: dict[tuple[Any, ...], AnswerWarning] = {}
    for w in warnings:
        key = (w.model, w.kind, w.tasks, w.asked, w.parse_mode, w.max_tokens, w.at_token_limit)
        first = merged.get(key)
        merged[key] = w if first is None else replace(first, also=(*first.also, *w.runs))
    return list(merged.values())


def warning_lines(scores: ModelScores, *, threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """``answer_warnings`` as the lines the command line prints, each finding once
    (``merge_warnings``; each warning's first line starts with WARNING)."""
    return [line for w in merge_warnings(answer_warnings(scores, threshold=threshold)) for line in w.lines()]


def parse_rate_table(reports: Mapping[str, ModelScores] | Sequence[ModelScores]) -> str:
    """Markdown: per model and run, the share of each task's answers read, unparsed, refused and
    read from reasoning (the report's summary page)."""
    items = list(reports.values()) if isinstance(reports, Mapping) else list(reports)
    lines = [
        "| Model | Oracle | Task | Answers | Read | Unparsed | Refused | From reasoning | Cut off |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rep in items:
        for setting, per_task in rep.parse.items():
            for task in TASKS:
                s = per_task.get(task)
                if s is None:
                    continue
                n = int(s["n"])
                unparsed = _kind_count(s, "unparsed")
                refused = _kind_count(s, "refused")
                reasoning = _kind_count(s, "reasoning")
                cut = sum(int(v) for v in s.get("at_token_limit", {}).values())
                read = n - unparsed - refused
                lines.append(
                    f"| {rep.name} | {setting} | {task} | {n} | {read / n:.0%} | {unparsed / n:.0%} "
                    f"| {refused / n:.0%} | {reasoning / n:.0%} | {cut} |"
                )
    return "\n".join(lines) + "\n"
