"""What the conversation engine hands a backend, and what it gets back.

Every backend (vLLM, transformers, OpenAI-compatible, baselines) implements ``Backend``: the engine
hands requests over as they arise (``submit``), each the whole conversation so far (system message,
earlier turns, the new user turn), and takes each answer, the model's raw text, as soon as it is
ready (``completed``). How the requests it holds are batched is the backend's own business: vLLM
adds each to its running engine, the openai backend sends each at once within its in-flight limit,
and a backend that answers a batch at a time (``BatchBackend``: transformers, the baselines) answers
everything handed over since it was last free in one call. Images travel as paths relative to the
bundle root; each backend turns them into what its model needs (file URLs, decoded images, data URLs)
and never re-encodes an image that it has already prepared for a live conversation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from chexpercept.case import Case, Turn
from chexpercept.domains import COUNT, COUNT_OR_NONE, NON_NEGATIVE, SHARE
from chexpercept.eval.backends.options import BackendOptions, NoOptions

if TYPE_CHECKING:
    import argparse

    from chexpercept.eval.registry import ModelSpec
    from chexpercept.eval.runner.preflight import ContextLimits


@dataclass(frozen=True)
class Message:
    """One chat message: role, text, and the images riding on it (relative to the bundle root)."""

    role: str
    text: str
    images: tuple[str, ...] = ()

    def as_record(self) -> dict[str, Any]:
        return {"role": self.role, "text": self.text, "images": list(self.images)}


@dataclass(frozen=True)
class Request:
    """One turn of one case: the full conversation to send, and the turn being asked."""

    key_id: str
    messages: tuple[Message, ...]
    turn: Turn
    #: the release folder the images are read from (``chat_messages``); not part of the request
    root: str | os.PathLike[str] | None = field(default=None, compare=False, repr=False)
    #: turns that follow this one in its conversation (not part of the request): the conversations
    #: with the most turns left are the run's critical path, and a backend that queues requests of
    #: its own (vLLM's render thread) takes theirs first
    turns_after: int = field(default=0, compare=False, repr=False)

    @property
    def task(self) -> str:
        return self.turn.task

    @property
    def request_id(self) -> str:
        """``<key_id>/<task>``: unique within a run (a case asks each task once)."""
        return f"{self.key_id}/{self.turn.task}"

    @property
    def images(self) -> list[str]:
        return [p for m in self.messages for p in m.images]

    def openai_messages(self, image_url: Callable[[str], str]) -> list[dict[str, Any]]:
        """OpenAI-style chat messages (vLLM's LLM.chat and /chat/completions take the same shape):
        system text; user text then its images, each as ``image_url(relative path)``; assistant text."""
        return self.messages_with(lambda p: {"type": "image_url", "image_url": {"url": image_url(p)}})

    def messages_with(self, image_part: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
        """``openai_messages`` with each image's whole content part as ``image_part(relative path)``
        gives it (an image by id, decoded pixels...)."""
        messages: list[dict[str, Any]] = []
        for m in self.messages:
            if m.role == "system":
                messages.append({"role": "system", "content": m.text})
                continue
            content: list[dict[str, Any]] = [{"type": "text", "text": m.text}]
            content += [image_part(p) for p in m.images]
            messages.append({"role": m.role, "content": content})
        return messages

    def chat_messages(
        self, images: str = "data_url", *, root: str | os.PathLike[str] | None = None
    ) -> list[dict[str, Any]]:
        """The request as chat messages, with its images in the form ``images`` names:

        - ``data_url``: OpenAI-compatible ``image_url`` parts with ``data:`` URLs (what the openai
          backend sends to an API);
        - ``file_url``: ``image_url`` parts with ``file://`` URLs of the release's files (vLLM's
          ``LLM.chat`` with ``allowed_local_media_path``);
        - ``pil``: ``{"type": "image", "image": PIL.Image}`` parts, decoded as RGB (transformers'
          ``apply_chat_template``).

        Text and order are those of every backend: system message, then each user turn's text
        followed by its images, and the assistant replies. Images are read inside ``root`` (default:
        the release the conversation was made from), PNG or JPEG only (chexpercept.containment).
        Raises ValueError for an unknown form or a request without a release folder.
        """
        from chexpercept.containment import image_data_url, image_file, open_image

        base = root if root is not None else self.root
        if base is None:
            raise ValueError(f"{self.request_id}: no release folder to read the images from (pass root=)")
        if images == "data_url":
            return self.openai_messages(lambda rel: image_data_url(base, rel))
        if images == "file_url":
            return self.openai_messages(lambda rel: image_file(base, rel).as_uri())
        if images != "pil":
            raise ValueError(f"images must be 'data_url', 'file_url' or 'pil', got {images!r}")

        def decoded(rel: str) -> Any:
            with open_image(base, rel) as f:
                return f.convert("RGB")

        messages = self.openai_messages(lambda rel: rel)
        for message in messages:
            if isinstance(message["content"], list):
                message["content"] = [
                    {"type": "image", "image": decoded(part["image_url"]["url"])}
                    if part["type"] == "image_url"
                    else part
                    for part in message["content"]
                ]
        return messages


@dataclass
class Response:
    """A model's raw answer to one request, with token usage where the backend reports it."""

    #: the reply as the reference records it (and as it goes back into the history)
    text: str
    usage: dict[str, Any] = field(default_factory=dict)
    #: the whole reply as the parser reads it, where ``text`` lost part of it (special-token
    #: reasoning markers, an API's separate reasoning field); see eval/backends/replies.py
    full_text: str | None = None
    #: the model or the service declined to answer (an API's refusal, a content filter): an answer,
    #: scored as unparsed, and counted
    refusal: str | None = None
    #: the request failed (transport, a rejected request): there is no answer. The conversation
    #: stops there and its case stays unfinished (never scored); a rerun retries it
    error: str | None = None


#: the smallest temperature above 0 that samples (vLLM takes anything below it as greedy)
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class Sampling:
    """Decoding parameters as recorded in run.json."""

    #: None when the request leaves it to the server (--request-extra '{"temperature": null}')
    temperature: float | None
    #: None when the request leaves it to the server: the openai backend sends top_p only when
    #: --top-p (or top_p in --request-extra) gives it, as reasoning models reject it and a server's
    #: default need not be 1.0 (Gemini's is 0.95; a ``vllm serve`` takes the model's generation_config)
    top_p: float | None
    max_tokens: int
    #: True when a response is a deterministic function of the conversation (greedy decoding or a
    #: deterministic baseline): then an Oracle-Passed run also yields the exact End-to-End result.
    greedy: bool

    def __post_init__(self) -> None:
        """Every decoding setting inside its domain, wherever it came from (the registry, an option,
        --request-extra): ValueError naming the option. A negative temperature would be recorded as
        sampling while a backend decodes greedily; top_p outside (0, 1] means nothing."""
        t, p = self.temperature, self.top_p
        if t is not None and not NON_NEGATIVE.contains(t):
            raise ValueError(
                f"the temperature must be {NON_NEGATIVE.describe()} (0: greedy), got {t!r} "
                "(--temperature, or temperature in --request-extra)"
            )
        if p is not None and not SHARE.contains(p):
            raise ValueError(
                f"top_p must be {SHARE.describe()}, got {p!r} (--top-p, or top_p in --request-extra)"
            )
        if t is not None and 0 < t < MIN_TEMPERATURE:
            raise ValueError(
                f"the temperature {t!r} is above 0 but below {MIN_TEMPERATURE:g}, where vLLM decodes "
                "greedily and transformers' sampling overflows: give 0 for greedy decoding"
            )
        if self.greedy and t != 0:  # recorded greedy, decoded sampling: End-to-End taken from Oracle-Passed
            raise ValueError(f"greedy decoding needs temperature 0, got {t!r}")
        if not COUNT_OR_NONE.contains(self.max_tokens):  # 0: a baseline, which decodes nothing
            raise ValueError(f"--max-tokens must be {COUNT.describe()}, got {self.max_tokens!r}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "greedy": self.greedy,
        }


@dataclass
class RunContext:
    """What a backend may need to know about the whole run before the first request."""

    root: FsPath
    #: every selected case of the run (all shards), e.g. for baseline:prior or image limits
    cases: Sequence[Case]
    #: the run's seed: None where none is applied (the openai backend sends none unless one was given:
    #: ``chexpercept.eval.runner.plan.seed_for``); a local backend applies ``local_seed``
    seed: int | None = None
    #: process index and count under accelerate (one backend per process)
    process_index: int = 0
    num_processes: int = 1
    #: the same among the processes of this machine (multi-node runs): devices are split by these
    local_process_index: int | None = None
    local_num_processes: int | None = None

    @property
    def local_seed(self) -> int:
        """The seed a local engine or a baseline applies: the run's, 0 when none was given."""
        return 0 if self.seed is None else self.seed

    @property
    def local_index(self) -> int:
        return self.process_index if self.local_process_index is None else self.local_process_index

    @property
    def local_count(self) -> int:
        return self.num_processes if self.local_num_processes is None else self.local_num_processes

    @property
    def max_images_per_case(self) -> int:
        """The most images any selected conversation carries (vLLM's limit_mm_per_prompt)."""
        return max((sum(len(t.images) for t in c.turns) for c in self.cases), default=1)


class BackendError(RuntimeError):
    """A backend could not answer a request; the message names the case and the turn."""


#: one answered request: the request as handed over, and the backend's answer to it
Completion = tuple[Request, Response]


class Backend(Protocol):
    """What the engine and the runner call on a backend (``BackendBase`` gives the defaults)."""

    #: the name recorded in run.json ("vllm", "transformers", "openai", "baseline")
    name: str
    #: the most conversations live at once when --batch-size is not given
    default_batch_size: int

    def setup(self, context: RunContext) -> None: ...

    def submit(self, requests: Sequence[Request]) -> None:
        """Hand requests over; each one is answered exactly once by a later ``completed``.

        A request the backend cannot take (one the engine rejects: too long, too many images) is
        answered with a ``Response`` whose ``error`` says why; it never raises for one request.
        """
        ...

    def completed(self) -> list[Completion]:
        """The answers that are ready: at least one (waits until one is), every one that is ready.

        Raises BackendError only for what ends the whole run (the engine died, every request
        would fail the same way); only called while a submitted request is unanswered.
        """
        ...

    def release(self, key_ids: Sequence[str]) -> None:
        """These conversations have ended (finished or failed): drop what was kept for them."""
        ...

    def prefetch(self, images: Sequence[str]) -> None:
        """Images (relative to the bundle root) that requests will carry soon, soonest first: a
        backend may prepare them ahead of need, within its memory budget; never required."""
        ...

    def sampling(self) -> Sampling: ...

    def identity(self, context: RunContext) -> dict[str, Any]:
        """Everything of this backend that can change an answer, as resolved for this run (the
        options that do, what it derives from the selected cases); part of the run's identity,
        asked before ``setup`` (a resume is refused before any engine loads)."""
        ...

    def identity_facts(self) -> Any:
        """What the backend learned from outside while making its ``identity`` (the openai backend:
        what its server said it is), as JSON; the main process makes the run's identity and tells
        every other process these facts, so that each sends what the identity records."""
        ...

    def use_identity_facts(self, facts: Any) -> None:
        """Take the main process's ``identity_facts`` instead of learning them again (called before
        ``setup`` in every other process of a run)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Backend settings for run.json (engine arguments, chat kwargs, dtype...)."""
        ...

    def close(self) -> None:
        """Stop the engine and free what it holds; a second call does nothing (a run that ends early
        closes its backend before its last line, and again on the way out)."""
        ...


class BackendBase:
    """What every backend class provides besides answering requests, with the defaults.

    A backend declares its options once (``Options``, a ``BackendOptions`` dataclass: flags, help,
    checks, and which options can change an answer) and is built from them by ``from_plan``. The
    runner calls the hooks below on every backend; a backend overrides those that apply to it.
    """

    name: ClassVar[str] = ""
    default_batch_size: ClassVar[int] = 64
    Options: ClassVar[type[BackendOptions]] = NoOptions
    #: the libraries that build this backend's prompts from the images and texts and run its model
    #: (distribution names): their versions are part of a run's identity, since another version can
    #: change an answer. None for an API (its client sends the same request whatever its version)
    #: or a baseline.
    engine_packages: ClassVar[tuple[str, ...]] = ()
    #: whether the run's model options (``chexpercept.eval.backends.MODEL_OPTIONS``: --model-id,
    #: --temperature, --top-p, --max-tokens, --no-thinking, --chat-template-kwargs) reach a model; a
    #: baseline writes its answers itself
    reads_model_options: ClassVar[bool] = True
    options: BackendOptions

    @classmethod
    def add_options(cls, group: argparse._ArgumentGroup) -> None:
        """This backend's flags, in its group of ``chexpercept run --help``."""
        cls.Options.add_to(group)

    @classmethod
    def from_plan(
        cls,
        spec: ModelSpec,
        options: BackendOptions,
        *,
        sampling: Sampling,
        chat_template_kwargs: dict[str, Any],
        on_error: str = "stop",
    ) -> Any:
        """The backend for ``spec`` with ``options`` (this backend's ``Options``), the resolved
        decoding and chat template variables, and the run's error policy (``--on-error``)."""
        return cls(  # type: ignore[call-arg]
            spec,
            sampling=sampling,
            options=options,
            chat_template_kwargs=chat_template_kwargs,
            on_error=on_error,
        )

    def setup(self, context: RunContext) -> None:
        """Load the model or start the engine (called once, before the first request)."""

    def release(self, key_ids: Sequence[str]) -> None:
        """Nothing kept per conversation by default."""

    def prefetch(self, images: Sequence[str]) -> None:
        """Nothing prepared ahead by default."""

    def new_session(self) -> None:
        """Counts start again (a command running several oracle settings records each one's)."""

    def context_limits(self, context: RunContext) -> ContextLimits | None:
        """The engine's context length and images per prompt as they will be, for the preflight
        check before it loads; None: no limit to check (an API, a baseline)."""
        return None

    def model_dir(self) -> str | None:
        """The local folder of the model's processor and weights (the preflight counts tokens with
        its processor); None where there is none."""
        return None

    def token_counter(self, root: FsPath) -> Any:
        """A counter of the tokens an API bills for this run's requests (eval/estimate/count.py), to
        compare with the usage the API reported; None when the backend reports no billed usage."""
        return None

    def identity(self, context: RunContext) -> dict[str, Any]:
        return self.options.answers()

    def identity_facts(self) -> Any:
        return None  # nothing learned from outside: every process makes the same identity

    def use_identity_facts(self, facts: Any) -> None:
        pass

    def usage_summary(self, records: Mapping[str, Mapping[str, Any]]) -> str | None:
        """A line on what the backend's service reported using over ``records`` (results.jsonl's
        records), said at the end of a run; None where there is nothing to say."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"options": self.options.record()}

    def close(self) -> None:
        """Free what the backend holds."""


class BatchBackend(BackendBase):
    """The ``Backend`` interface for a backend that answers a batch at a time (``generate``).

    Whatever was handed over since the backend was last free is answered in one ``generate`` call,
    which may split it as it must (the transformers backend by length, within its token budget).
    While every live conversation waits for its answer that is every live conversation, so a
    backend may drop what it caches for conversations not asked in a call (they have ended).
    """

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        raise NotImplementedError

    def submit(self, requests: Sequence[Request]) -> None:
        self.__dict__.setdefault("_pending", []).extend(requests)

    def completed(self) -> list[Completion]:
        batch: list[Request] = self.__dict__.pop("_pending", [])
        if not batch:
            raise BackendError(f"{type(self).__name__}: completed() called with no request handed over")
        responses = self.generate(batch)
        if len(responses) != len(batch):
            raise BackendError(
                f"backend {getattr(self, 'name', type(self).__name__)!r} returned {len(responses)} "
                f"answers for {len(batch)} requests"
            )
        return list(zip(batch, responses))

    def release(self, key_ids: Sequence[str]) -> None:
        """Nothing to drop here: ``generate`` keeps only what the requests of its call use."""


class _BatchAdapter(BatchBackend):
    """A backend object that only has ``generate`` (e.g. a test's fake), seen through BatchBackend."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.name = getattr(backend, "name", type(backend).__name__)

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        return self.backend.generate(requests)


def streaming(backend: Any) -> Backend:
    """``backend`` itself when it has the ``Backend`` interface, else its ``generate`` behind
    BatchBackend."""
    if callable(getattr(backend, "submit", None)) and callable(getattr(backend, "completed", None)):
        return backend
    return _BatchAdapter(backend)  # type: ignore[return-value]


def answer_all(backend: Any, requests: Iterable[Request]) -> list[Response]:
    """Submit ``requests`` at once and wait for every answer; the answers in request order (for
    checks and benchmarks that need no conversation engine)."""
    requests = list(requests)
    live = streaming(backend)
    live.submit(requests)
    answers: dict[int, Response] = {}
    positions = {id(r): i for i, r in enumerate(requests)}
    while len(answers) < len(requests):
        for request, response in live.completed():
            answers[positions[id(request)]] = response
    return [answers[i] for i in range(len(requests))]
