"""Tokens, cost and time of a run before it starts, from the same conversations ``run`` sends.

The estimator walks every selected case through the runner's own ``Conversation`` (so the system
message, the turn order, the images of each turn, the oracle texts and patches are exactly what
``run`` would send), with a stand-in model whose answers are all right or all wrong: where answers
change the route (oracle ``none`` stops at the first wrong answer; ``explicit`` adds oracle texts;
``implicit`` rewrites earlier answers, which breaks the cached prefix) the two bound the run.
Every call re-sends the whole history with its images, as the benchmark does; each answer is
assumed ``answer_tokens`` long (the reference's estimator: 1,000).

Counting: API models count text with tiktoken's ``o200k_base`` encoding when it is available (the
reference uses the GPT-4o encoding for every API model), else about 4 characters a token (marked
approximate); images and caching follow the provider's rules (eval/estimate/pricing.py). Local models
(vllm / transformers backends) count with the model's own processor and chat template when its files
are local: text and image tokens exactly as the model sees them, and the prefix a prefix cache
reuses; with a throughput the wall time follows.

After a run, ``recorded`` replays the answers a run got (results.jsonl) through the same counting,
so ``chexpercept score --details`` can set the estimate against the usage the API reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path as FsPath
from typing import Any, Protocol

from chexpercept.case import Case
from chexpercept.containment import ALLOWED_IMAGE_FORMATS, image_file
from chexpercept.eval.conversation import Conversation
from chexpercept.eval.estimate.pricing import ProviderRules, call_cost, price_for
from chexpercept.eval.protocol import Message, Request, Response
from chexpercept.input_files import IMAGE, open_input
from chexpercept.results import CaseResult
from chexpercept.usage import count
from chexpercept.usage import total as reported_total

SCENARIOS: tuple[str, ...] = ("all_right", "all_wrong")
DEFAULT_ANSWER_TOKENS = 1000


@dataclass(frozen=True)
class CallTokens:
    """Input tokens of one call: text, images, and the part billed (or reused) as a cached prefix."""

    text: int
    image: int
    cached: int

    @property
    def total(self) -> int:
        return self.text + self.image


class TokenCounter(Protocol):
    #: what counts the tokens (recorded with the estimate)
    name: str
    #: False when text tokens are approximated
    exact: bool

    def count(self, request: Request, previous: Request | None) -> CallTokens: ...


@dataclass
class Estimate:
    """Totals of one oracle setting under one scenario (tokens; USD; seconds)."""

    oracle: str
    scenario: str
    cases: int = 0
    calls: int = 0
    input_text_tokens: int = 0
    input_image_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    #: None when the model has no price (local models, unknown API models)
    cost_usd: float | None = None
    cost_usd_without_cache: float | None = None
    #: expected wall time at the given throughput (None: no throughput given)
    seconds: float | None = None
    counter: str = ""
    exact: bool = True

    @property
    def input_tokens(self) -> int:
        return self.input_text_tokens + self.input_image_tokens

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["input_tokens"] = self.input_tokens
        return out


# ------------------------------------------------------------------------------------ counters
class _Approximate:
    """About four characters a token (what API providers quote for English text)."""

    name = "approx. 4 characters per token"
    exact = False

    def __call__(self, text: str) -> int:
        return math.ceil(len(text) / 4)


def text_tokenizer() -> tuple[Callable[[str], int], str, bool]:
    """(count, name, exact): tiktoken's o200k_base when importable and its file loadable, else the
    4-characters approximation (tiktoken downloads its encoding once; offline it may be missing)."""
    try:
        import tiktoken

        encoding = tiktoken.get_encoding("o200k_base")
    except ModuleNotFoundError:
        from chexpercept.extras import install_command

        approx = _Approximate()
        return (
            approx,
            f"{approx.name}; exact counts with tiktoken: {install_command('tiktoken') or 'install tiktoken'}",
            False,
        )
    except Exception:
        approx = _Approximate()
        return approx, approx.name, False
    return (lambda text: len(encoding.encode(text, disallowed_special=()))), "tiktoken o200k_base", True


def image_size(path: FsPath) -> tuple[int, int]:
    """(width, height) from the header of the PNG or JPEG ``path`` (the pixels are not decoded), a
    regular file within chexpercept.input_files.IMAGE."""
    from PIL import Image

    with open_input(path, IMAGE, what="image") as f, Image.open(f, formats=list(ALLOWED_IMAGE_FORMATS)) as im:
        return im.size


class ApiCounter:
    """An API model's view: text tokens per message, each image by the provider's rule, and the
    prefix shared with the conversation's previous call billed as cached."""

    def __init__(
        self,
        root: str | FsPath,
        rules: ProviderRules,
        text: Callable[[str], int] | None = None,
        *,
        answer_tokens: int | None = None,
    ):
        self.root = FsPath(root)
        self.rules = rules
        #: when set, every earlier answer in the history counts as this many tokens (the scenarios'
        #: assumed answer length, as the reference's estimator re-sends it); None: its real text
        self.answer_tokens = answer_tokens
        if text is None:
            text, tok_name, exact = text_tokenizer()
        else:
            tok_name, exact = getattr(text, "name", "given"), bool(getattr(text, "exact", True))
        self.text = text
        self.exact = exact
        self.name = f"{tok_name}; images: {rules.name}"
        self._images: dict[str, int] = {}
        self._messages: dict[Message, tuple[int, int]] = {}

    def _image(self, relative: str) -> int:
        tokens = self._images.get(relative)
        if tokens is None:
            tokens = self._images[relative] = self.rules.image(*image_size(image_file(self.root, relative)))
        return tokens

    def message(self, m: Message) -> tuple[int, int]:
        """(text tokens with the message's chat-format overhead, image tokens) of one message."""
        cached = self._messages.get(m)
        if cached is None:
            if m.role == "assistant" and self.answer_tokens is not None:
                text = self.answer_tokens + self.rules.message_overhead
            else:
                text = self.text(m.text) + self.rules.message_overhead
            cached = self._messages[m] = (text, sum(self._image(p) for p in m.images))
        return cached

    def count(self, request: Request, previous: Request | None) -> CallTokens:
        sizes = [self.message(m) for m in request.messages]
        text = sum(t for t, _ in sizes) + self.rules.reply_overhead
        image = sum(i for _, i in sizes)
        shared = 0
        if previous is not None:
            for mine, theirs, (t, i) in zip(request.messages, previous.messages, sizes):
                if mine != theirs:
                    break
                shared += t + i
        return CallTokens(text, image, self.rules.cached(shared))


# ------------------------------------------------------------------------------------ walking
def _scripted(case: Case, scenario: str) -> Callable[[Request], Response]:
    """A stand-in model: the gold answer (all_right) or a wrong option (all_wrong), as ``Answer: k``."""

    def reply(request: Request) -> Response:
        turn = request.turn
        gold = sorted(turn.answer_index)
        if scenario == "all_right":
            return Response(text="Answer: " + ", ".join(str(g) for g in gold))
        wrong = next((k for k in range(1, len(turn.options) + 1) if [k] != gold), 1)
        return Response(text=f"Answer: {wrong}")

    return reply


def walk(
    cases: Iterable[Case],
    oracle: str,
    answer: Callable[[Case], Callable[[Request], Response]],
    on_call: Callable[[Request, Request | None], None],
    *,
    parse_mode: str = "reference",
    model: str = "",
) -> tuple[int, int]:
    """Run each case's conversation with ``answer(case)(request)`` as the model; ``on_call(request,
    previous request of the same case)`` sees every call. Returns (cases, calls)."""
    n_cases = calls = 0
    for case in cases:
        conversation = Conversation(case, oracle=oracle, parse_mode=parse_mode, model=model)  # type: ignore[arg-type]
        reply = answer(case)
        previous = None
        while not conversation.done:
            request = conversation.pending
            on_call(request, previous)
            calls += 1
            conversation.answer(reply(request))
            previous = request
        n_cases += 1
    return n_cases, calls


def sample_calls(cases: Sequence[Case], oracles: Sequence[str]) -> list[Request]:
    """Calls to check a counter on: every call of one case per path (the one with the most turns
    first), under each scenario and oracle setting, the richest histories (wrong answers, so oracle
    texts and patches) first."""
    by_path: dict[str, Case] = {}
    for case in cases:
        best = by_path.get(case.path.value)
        if best is None or len(case.turns) > len(best.turns):
            by_path[case.path.value] = case
    probes = sorted(by_path.values(), key=lambda c: -len(c.turns))
    order = sorted(oracles, key=lambda o: {"implicit": 0, "explicit": 1}.get(o, 2))
    calls: list[Request] = []
    for scenario in ("all_wrong", "all_right"):
        for oracle in order:
            walk(probes, oracle, lambda case, s=scenario: _scripted(case, s), lambda r, _p: calls.append(r))
    return calls


def _tally(
    estimate: Estimate,
    counter: TokenCounter,
    model_id: str,
    answer_tokens: Callable[[Request], int],
) -> Callable[[Request, Request | None], None]:
    priced = price_for(model_id) is not None
    if priced:
        estimate.cost_usd = estimate.cost_usd_without_cache = 0.0

    def on_call(request: Request, previous: Request | None) -> None:
        tokens = counter.count(request, previous)
        out = answer_tokens(request)
        estimate.input_text_tokens += tokens.text
        estimate.input_image_tokens += tokens.image
        estimate.cached_input_tokens += tokens.cached
        estimate.output_tokens += out
        if priced:
            estimate.cost_usd += call_cost(model_id, tokens.total, tokens.cached, out)  # type: ignore[operator]
            estimate.cost_usd_without_cache += call_cost(model_id, tokens.total, 0, out)  # type: ignore[operator]

    return on_call


def _finish(estimate: Estimate, counter: TokenCounter, tokens_per_second: float | None) -> Estimate:
    estimate.counter, estimate.exact = counter.name, counter.exact
    if estimate.cost_usd is not None:
        estimate.cost_usd = round(estimate.cost_usd, 6)
        estimate.cost_usd_without_cache = round(estimate.cost_usd_without_cache or 0.0, 6)
    if tokens_per_second:
        processed = estimate.input_tokens - estimate.cached_input_tokens + estimate.output_tokens
        estimate.seconds = round(processed / tokens_per_second, 1)
    return estimate


def estimate_oracle(
    cases: Sequence[Case],
    oracle: str,
    counter: TokenCounter,
    *,
    model_id: str,
    scenario: str,
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
    tokens_per_second: float | None = None,
) -> Estimate:
    """The estimate of one oracle setting under ``scenario`` (``all_right`` or ``all_wrong``)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {scenario!r}")
    if answer_tokens < 1:
        raise ValueError(f"--answer-tokens must be at least 1, got {answer_tokens}")
    estimate = Estimate(oracle=oracle, scenario=scenario)
    on_call = _tally(estimate, counter, model_id, lambda _request: answer_tokens)
    estimate.cases, estimate.calls = walk(cases, oracle, lambda case: _scripted(case, scenario), on_call)
    return _finish(estimate, counter, tokens_per_second)


def estimate_bounds(
    cases: Sequence[Case],
    oracle: str,
    counter: TokenCounter,
    *,
    model_id: str,
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
    tokens_per_second: float | None = None,
) -> tuple[Estimate, Estimate]:
    """(lower, upper) estimate of one oracle setting: the two scenarios, ordered by input tokens."""
    pair = [
        estimate_oracle(
            cases, oracle, counter, model_id=model_id, scenario=s,
            answer_tokens=answer_tokens, tokens_per_second=tokens_per_second,
        )
        for s in SCENARIOS
    ]  # fmt: skip
    lo, hi = sorted(pair, key=lambda e: (e.input_tokens, e.cost_usd or 0))
    return lo, hi


def total(estimates: Iterable[Estimate], scenario: str) -> Estimate:
    """The sum of several estimates (e.g. all oracle settings); a cost or time known for none stays None."""
    out = Estimate(oracle="total", scenario=scenario)
    for e in estimates:
        out.cases += e.cases
        out.calls += e.calls
        out.input_text_tokens += e.input_text_tokens
        out.input_image_tokens += e.input_image_tokens
        out.cached_input_tokens += e.cached_input_tokens
        out.output_tokens += e.output_tokens
        for key in ("cost_usd", "cost_usd_without_cache", "seconds"):
            if getattr(e, key) is not None:
                setattr(out, key, round((getattr(out, key) or 0) + getattr(e, key), 6))
    return out


def estimate_recorded(
    cases: Sequence[Case],
    results: Iterable[CaseResult],
    oracle: str,
    counter: TokenCounter,
    *,
    model_id: str,
    parse_mode: str = "reference",
    model: str = "",
) -> Estimate:
    """The estimate of the conversations a run had: its recorded answers replayed (same route, same
    oracle texts and patches), each answer costing the output tokens the run reported for it (the
    estimator's ``DEFAULT_ANSWER_TOKENS`` where the server did not report them)."""
    by_key = {r.key_id: r for r in results}
    chosen = [c for c in cases if c.key_id in by_key]
    estimate = Estimate(oracle=oracle, scenario="recorded")

    def answer(case: Case) -> Callable[[Request], Response]:
        turns = {t.task: t for t in by_key[case.key_id].turns}

        def reply(request: Request) -> Response:
            t = turns[request.task]
            return Response(text=t.response, full_text=t.full_response, refusal=t.refusal)

        return reply

    def output(request: Request) -> int:
        turn = next(t for t in by_key[request.key_id].turns if t.task == request.task)
        reported = count((turn.usage or {}).get("output_tokens"))
        return DEFAULT_ANSWER_TOKENS if reported is None else reported  # unknown: the estimator's guess

    on_call = _tally(estimate, counter, model_id, output)
    estimate.cases, estimate.calls = walk(chosen, oracle, answer, on_call, parse_mode=parse_mode, model=model)
    return _finish(estimate, counter, None)


@dataclass
class Comparison:
    """An estimate beside what a run's API reported for the same conversations."""

    estimated: dict[str, Any]
    actual: dict[str, Any]
    #: (estimated - actual) / actual per quantity (None where actual is 0 or unknown)
    relative_error: dict[str, float | None] = field(default_factory=dict)
    #: quantity -> calls whose server did not report it (its ``actual`` is then None)
    unreported: dict[str, int] = field(default_factory=dict)


def compare(estimate: Estimate, results: Iterable[CaseResult]) -> Comparison:
    """Estimated against reported calls, input, cached and output tokens and cost. A reported total
    is None when any call did not report it (``unreported`` counts those calls), never a sum that
    takes what the server did not say as 0."""
    usages = [t.usage or {} for r in results for t in r.turns]
    actual: dict[str, Any] = {"calls": len(usages)}
    unreported: dict[str, int] = {}
    for key in ("input_tokens", "cached_input_tokens", "output_tokens", "cost_usd"):
        t = reported_total(u.get(key) for u in usages)
        actual[key] = None if t.value is None else (round(t.value, 6) if key == "cost_usd" else t.value)
        if t.unreported:
            unreported[key] = t.unreported
    estimated = {k: estimate.as_dict()[k] for k in actual}
    errors = {
        k: (
            None
            if not actual[k] or estimated[k] is None
            else round((estimated[k] - actual[k]) / actual[k], 4)
        )
        for k in actual
    }
    return Comparison(estimated, actual, errors, unreported)


def usage_estimate(
    counter: ApiCounter, plan: Any, records: Mapping[str, Mapping[str, Any]], oracle: str
) -> dict[str, Any] | None:
    """run.json's ``estimate``: what ``chexpercept estimate`` counts for the conversations a run had
    (its answers replayed, with ``counter``: ``Backend.token_counter``) beside the usage the API
    reported, so the estimator's error is visible in ``chexpercept score --details``. ``plan``: the
    run's ``RunPlan``. A failure here never fails the run: it is a warning and None."""
    import sys

    try:
        results = [CaseResult.from_dict(dict(r)) for r in records.values()]
        model_id = plan.model.model_id
        estimate = estimate_recorded(
            list(plan.cases),
            results,
            oracle,
            counter,
            model_id=model_id,
            parse_mode=plan.parse_mode,
            model=model_id,
        )
        comparison = compare(estimate, results)
    except Exception as e:  # the estimate is a by-product; the run's results are what matter
        print(f"warning: could not estimate this run's tokens for comparison ({e!r})", file=sys.stderr)
        return None
    return {
        "counter": counter.name,
        "exact": counter.exact,
        "estimated": comparison.estimated,
        "actual": comparison.actual,
        "relative_error": comparison.relative_error,
        # calls whose server did not report a figure (its "actual" is then null, never 0)
        "unreported_calls": comparison.unreported,
    }
