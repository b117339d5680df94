"""Before the engine loads: does every selected conversation fit the engine's limits?

A conversation re-sends its whole history on every turn, so its last turn carries every image of the
case and every earlier answer. With a reasoning model whose answers run to ``--max-tokens`` that can
exceed the engine's ``max_model_len``; vLLM then refuses the request (``VLLMValidationError``) after
minutes of engine start-up. This check counts, with the model's own processor and chat template, the
prompt of each selected case's largest turn twice:

* worst: every earlier answer ``--max-tokens`` long (the history of a model that always runs long);
* least: every earlier answer a short ``Answer: k`` (no real answer is shorter).

and compares both with the limits (``max_model_len``, ``limit_mm_per_prompt``, from the engine
arguments the run will use, else the model's config.json). A case whose least prompt does not fit
cannot run at all; one whose worst does not may fail when answers run long. The report names the
cases and what to change. The stand-in answers walk the runner's own ``Conversation`` (as
``chexpercept estimate`` does), so the turns, images and oracle texts are those the run sends.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from chexpercept.case import Case
from chexpercept.eval.estimate.count import SCENARIOS, _scripted, walk
from chexpercept.eval.protocol import Request
from chexpercept.input_json import read_json

#: config.json keys that bound a model's context (the first found wins; text_config first)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


@dataclass(frozen=True)
class ContextLimits:
    """What one request may hold, and where each limit comes from (for the report)."""

    max_model_len: int | None
    max_model_len_source: str = ""
    max_images: int | None = None
    max_images_source: str = ""
    #: how to raise each limit, with ``{n}`` for the value (None: it cannot be raised here)
    raise_length: str | None = None
    raise_images: str | None = None


def model_context_length(model_dir: str | FsPath) -> tuple[int, str] | None:
    """(tokens, "config.json <key>") of a local model folder's context length, or None."""
    path = FsPath(model_dir) / "config.json"
    try:
        config = read_json(path, what="model config.json")
    except (OSError, ValueError):  # missing, not a regular file, too large or deep, not JSON
        return None
    if not isinstance(config, dict):
        return None
    for section, prefix in ((config.get("text_config") or {}, "text_config."), (config, "")):
        for key in CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value, f"{path.name} {prefix}{key}"
    return None


@dataclass
class CaseFit:
    """One case's largest turn against the limits."""

    key_id: str
    route: str
    task: str
    images: int
    answers: int
    #: prompt tokens with --max-tokens answers (None: tokens not counted, images checked alone)
    worst: int | None
    least: int | None = None


@dataclass
class FitReport:
    limits: ContextLimits
    max_tokens: int
    checked: int = 0
    seconds: float = 0.0
    largest: CaseFit | None = None
    #: cases that cannot run whatever the answers (too many images, or too long with short answers)
    cannot: list[CaseFit] = field(default_factory=list)
    #: cases that fit with short answers but not with --max-tokens ones
    may_not: list[CaseFit] = field(default_factory=list)
    #: why prompt tokens were not counted (no processor to count with): images were checked alone
    uncounted: str = ""

    @property
    def ok(self) -> bool:
        return not self.cannot and not self.may_not

    def lines(self) -> list[str]:
        """The report as lines for the terminal."""
        lim = self.limits
        head = f"preflight: {self.checked} case(s) checked against "
        head += (
            f"a context of {lim.max_model_len:,} tokens ({lim.max_model_len_source})"
            if lim.max_model_len
            else "no known context length"
        )
        if lim.max_images is not None:
            head += f", at most {lim.max_images} image(s) per prompt ({lim.max_images_source})"
        if self.uncounted:
            head += f"; prompt tokens NOT checked ({self.uncounted})"
        if self.largest is not None and self.largest.worst is not None:
            big = self.largest
            head += (
                f"; the largest prompt: {big.worst:,} tokens with --max-tokens {self.max_tokens} answers "
                f"({big.key_id}, turn {big.task})"
            )
        out = [head + f" [{self.seconds:.1f} s]"]
        if self.cannot:
            out.append(
                f"  {len(self.cannot)} case(s) cannot run at all: "
                + "; ".join(self._why(f) for f in self.cannot[:5])
            )
        if self.may_not:
            out.append(
                f"  {len(self.may_not)} case(s) fit only if their answers stay short of --max-tokens "
                f"{self.max_tokens}: " + "; ".join(self._why(f) for f in self.may_not[:5])
            )
        if not self.ok:
            out.append("  to change it: " + "; or ".join(self._remedies()))
        return out

    def _why(self, fit: CaseFit) -> str:
        lim = self.limits
        if lim.max_images is not None and fit.images > lim.max_images:
            return f"{fit.key_id} ({fit.route}) sends {fit.images} images at turn {fit.task}"
        least = f", {fit.least:,} even with short answers" if fit.least is not None else ""
        return f"{fit.key_id} ({fit.route}) needs up to {fit.worst:,} prompt tokens at turn {fit.task}{least}"

    def _remedies(self) -> list[str]:
        lim = self.limits
        cases = self.cannot + self.may_not
        out = []
        counted = [f for f in cases if f.worst is not None]
        if lim.max_model_len and any(f.worst >= lim.max_model_len for f in counted):
            need = 1024 * math.ceil((max(f.worst for f in counted) + self.max_tokens) / 1024)
            if lim.raise_length:
                out.append(f"allow a context of at least {need} tokens ({lim.raise_length.format(n=need)})")
            fitting = [
                f for f in counted if f.least is not None and f.least < lim.max_model_len and f.answers
            ]
            if fitting:
                room = min((lim.max_model_len - f.least) // (f.answers + 1) for f in fitting)
                if room > 0:
                    out.append(f"lower --max-tokens to about {room}")
        if lim.max_images is not None and any(f.images > lim.max_images for f in cases):
            most = max(f.images for f in cases)
            if lim.raise_images:
                out.append(f"allow {most} images per prompt ({lim.raise_images.format(n=most)})")
        routes = sorted({f.route for f in cases})
        out.append(f"leave these cases out (--paths, --lesions; they are {', '.join(routes)} cases)")
        out.append("pass --on-error record to run the rest and list them in failures.jsonl")
        return out


def largest_request(case: Case, oracle: str) -> tuple[Request, int]:
    """(the largest turn's request of ``case``, the most images any of its turns sends) over the
    stand-in answers (all right, all wrong): later turns carry more history, so it is a last one."""
    calls: list[Request] = []
    last: list[Request] = []
    for scenario in SCENARIOS:
        walk([case], oracle, lambda c, s=scenario: _scripted(c, s), lambda r, _previous: calls.append(r))
        last.append(calls[-1])
    images = max(len(r.images) for r in calls)
    return max(last, key=lambda r: (len(r.messages), sum(len(m.text) for m in r.messages))), images


def check_fit(
    cases: Sequence[Case],
    counter: Any,
    limits: ContextLimits,
    *,
    oracle: str,
    max_tokens: int,
    uncounted: str = "",
) -> FitReport:
    """Every case's largest turn against ``limits``.

    counter: a ProcessorCounter (eval/estimate/local_tokens.py; checked here on a sample of the requests) whose
    ``answer_tokens`` is set to ``max_tokens`` for the worst case and to None for the least; None
    when there is no processor to count with (``uncounted`` says why): then the images per prompt
    are checked alone, which needs no processor.
    """
    report = FitReport(limits=limits, max_tokens=max_tokens, uncounted=uncounted if counter is None else "")
    start = time.perf_counter()
    largest = [(case, *largest_request(case, oracle)) for case in cases]
    check = getattr(counter, "check", None)
    if callable(check):  # the counter's fast ways, checked against the processor on a sample
        check([request for _case, request, _images in largest])
    for case, request, images in largest:
        answers = sum(1 for m in request.messages if m.role == "assistant")
        worst = None
        if counter is not None:
            counter.answer_tokens = max_tokens
            worst = counter.count(request, None).total
        fit = CaseFit(case.key_id, case.path.value, request.task, images, answers, worst)
        report.checked += 1
        if worst is not None and (report.largest is None or worst > (report.largest.worst or 0)):
            report.largest = fit
        too_many = limits.max_images is not None and images > limits.max_images
        too_long = limits.max_model_len is not None and worst is not None and worst >= limits.max_model_len
        if not (too_many or too_long):
            continue
        if counter is not None:
            counter.answer_tokens = None
            fit.least = counter.count(request, None).total
        if too_many or (limits.max_model_len is not None and (fit.least or 0) >= limits.max_model_len):
            report.cannot.append(fit)
        else:
            report.may_not.append(fit)
    report.seconds = time.perf_counter() - start
    return report
