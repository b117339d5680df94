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
approximate); images and caching follow the provider's rules (eval/pricing.py). Local models
(vllm / transformers backends) count with the model's own processor and chat template when its files
are local: text and image tokens exactly as the model sees them, and the prefix a prefix cache
reuses; with a throughput the wall time follows.

After a run, ``recorded`` replays the answers a run got (results.jsonl) through the same counting,
so ``chexpercept score --details`` can set the estimate against the usage the API reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path as FsPath
from typing import Any, Protocol

from chexpercept.case import Case
from chexpercept.containment import image_file, open_image
from chexpercept.results import CaseResult

from .conversation import Conversation
from .pricing import ProviderRules, call_cost, price_for
from .protocol import Message, Request, Response

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
    except Exception:
        approx = _Approximate()
        return approx, approx.name, False
    return (lambda text: len(encoding.encode(text, disallowed_special=()))), "tiktoken o200k_base", True


def image_size(path: FsPath) -> tuple[int, int]:
    """(width, height) from the image header (the pixels are not decoded)."""
    from PIL import Image

    with Image.open(path) as im:
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


class ProcessorCounter:
    """A local model's view: its processor and chat template on the real images (token ids), the
    image tokens counted by the processor's image token, and the prefix reused by a prefix cache
    (the common token-id prefix with the previous call, in blocks of ``block`` tokens, vLLM's 16)."""

    exact = True

    def __init__(
        self,
        root: str | FsPath,
        model_dir: str,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        answer_tokens: int | None = None,
    ):
        from transformers import AutoProcessor

        self.root = FsPath(root)
        #: when set, every earlier answer in the history counts as this many tokens (the scenarios'
        #: assumed answer length): the template is rendered with the stand-in's short answers, and
        #: each one's own tokens are replaced by this length
        self.answer_tokens = answer_tokens
        self._answer_lengths: dict[str, int] = {}
        self.processor = AutoProcessor.from_pretrained(model_dir)
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        token = getattr(self.processor, "image_token", None)
        self.image_token_id = getattr(self.processor, "image_token_id", None)
        if self.image_token_id is None and token is not None:
            self.image_token_id = tokenizer.convert_tokens_to_ids(token)
        self.kwargs = dict(chat_template_kwargs or {})
        self.name = f"{type(self.processor).__name__} of {model_dir}"
        self.block = 16
        #: the last call counted and its token ids (the next call of its case compares with them)
        self._last: tuple[Request, list[int]] | None = None

    def _token_ids(self, request: Request) -> list[int]:
        conversation = []
        for m in request.messages:
            content: list[dict[str, Any]] = [{"type": "text", "text": m.text}]
            for p in m.images:
                with open_image(self.root, p) as im:
                    content.append({"type": "image", "image": im.convert("RGB")})
            conversation.append({"role": m.role, "content": content})
        inputs = self.processor.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=True, return_dict=True, **self.kwargs
        )
        ids = inputs["input_ids"]
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)

    def _answer_extra(self, messages: Sequence[Message]) -> int:
        """Tokens to add so that each assistant message counts as ``answer_tokens`` (0 when unset)."""
        if self.answer_tokens is None:
            return 0
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        extra = 0
        for m in messages:
            if m.role != "assistant":
                continue
            n = self._answer_lengths.get(m.text)
            if n is None:
                n = self._answer_lengths[m.text] = len(
                    tokenizer(m.text, add_special_tokens=False)["input_ids"]
                )
            extra += self.answer_tokens - n
        return extra

    def count(self, request: Request, previous: Request | None) -> CallTokens:
        ids = self._token_ids(request)
        image = sum(1 for t in ids if t == self.image_token_id) if self.image_token_id is not None else 0
        shared = 0
        if previous is not None and self._last is not None and self._last[0] is previous:
            for a, b in zip(ids, self._last[1]):
                if a != b:
                    break
                shared += 1
        self._last = (request, ids)
        if shared and previous is not None:  # the earlier answers the reused prefix holds
            common = []
            for mine, theirs in zip(request.messages, previous.messages):
                if mine != theirs:
                    break
                common.append(mine)
            shared += self._answer_extra(common)
        text = len(ids) - image + self._answer_extra(request.messages)
        return CallTokens(text, image, max(0, shared - shared % self.block))


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
    oracle texts and patches), each answer costing the output tokens the run reported for it."""
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
        return int((turn.usage or {}).get("output_tokens") or 0)

    on_call = _tally(estimate, counter, model_id, output)
    estimate.cases, estimate.calls = walk(chosen, oracle, answer, on_call, parse_mode=parse_mode, model=model)
    return _finish(estimate, counter, None)


@dataclass
class Comparison:
    """An estimate beside what a run's API reported for the same conversations."""

    estimated: dict[str, Any]
    actual: dict[str, Any]
    #: (estimated - actual) / actual per quantity (None where actual is 0)
    relative_error: dict[str, float | None] = field(default_factory=dict)


def compare(estimate: Estimate, results: Iterable[CaseResult]) -> Comparison:
    """Estimated against reported calls, input, cached and output tokens and cost."""
    actual = {"calls": 0, "input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}
    for r in results:
        for t in r.turns:
            actual["calls"] += 1
            usage = t.usage or {}
            for key in ("input_tokens", "cached_input_tokens", "output_tokens", "cost_usd"):
                value = usage.get(key)
                if isinstance(value, (int, float)):
                    actual[key] += value
    actual["cost_usd"] = round(actual["cost_usd"], 6)
    estimated = {k: estimate.as_dict()[k] for k in actual}
    errors = {
        k: (
            None
            if not actual[k] or estimated[k] is None
            else round((estimated[k] - actual[k]) / actual[k], 4)
        )
        for k in actual
    }
    return Comparison(estimated, actual, errors)
