"""Any OpenAI-compatible chat endpoint (vLLM serve, Azure OpenAI v1, Gemini's OpenAI endpoint).

Each request goes out as soon as the engine hands it over (a conversation's next turn as soon as its
answer is in), on an asyncio event loop of its own (aiohttp), with at most ``--concurrency`` in
flight: an adaptive limit that halves on a 429 and grows back by about one per round trip (AIMD,
eval/backends/openai/inflight.py; the limits taken are in run.json). Each attempt has a deadline
(``--timeout``, from sending to the reply's last byte, however slowly the bytes trickle). Retries
with exponential backoff on 408, 409, 429, 5xx, timeouts, dropped connections and replies cut off
mid-body (a bad Content-Length, a cut chunked body, or a close-delimited body that is not complete
JSON), waiting as long as the server's back-off hint says where it gives one (every form the
supported APIs send: ``retry-after-ms``, ``Retry-After`` in seconds or as an HTTP date, Google's
``RetryInfo.retryDelay`` in the error body, OpenAI's ``x-ratelimit-reset-*``; eval/backends/openai/retries.py reads
them against the server's clock, and a wait too long to take ends the request naming it). Redirects
are not followed (the images go to the endpoint given and nowhere else). The model the server says
it answered with is recorded per turn (``usage.served_model``; a warning when it is not the one asked
for: proxies fall back silently). Token usage is read from each reply and priced with the paper's
price table (spec 3.10); a count the reply leaves out is None, never 0 (chexpercept.usage). Images
go as data URLs, encoded once per file while a conversation that shows it is live. A secret in the
base URL (``user:password@``, ``?api-key=``) is shown redacted everywhere (chexpercept.redaction).

The client's own work stays off the run's critical path (issue 31): each image's data URL is read,
checked and encoded once, as a JSON string, on worker threads ahead of need, and kept for the
conversation's later turns within a memory budget (eval/backends/prefetch.py); a request's body is
the JSON of its short fields with those strings spliced in (the bytes ``json.dumps`` would give,
without scanning megabytes of base64 again on every turn), built on a thread of its own, so neither
the engine's thread nor the event loop waits for it, and sent in those pieces, never joined into one
more copy of the whole (``pieces_payload``).

What a reply can be, and what becomes of it:

* an answer: ``message.content`` (text or text parts), with the model's reasoning put back in front
  of it where the server returns it apart (``reasoning``, or ``reasoning_content`` before vLLM 0.16;
  eval/backends/replies.py), so the parser reads it by the model family's rules;
* the model or the service declining: ``message.refusal``, ``finish_reason: content_filter``, or a
  request rejected by a content filter (Azure's HTTP 400 ``content_filter``, with
  ``--on-error record``): an answer that is no option, scored as unparsed and counted as a refusal;
* a failed request (transport errors and 5xx after the retries, any other rejected request such as
  a 400 for a setting the model does not accept): no answer. The run's ``--on-error stop`` (default)
  stops the run; ``--on-error record`` leaves that case unfinished (failures.jsonl) and goes on with
  the others. Either way it is never scored, and rerunning the command retries it.

Data protection: the PhysioNet credentialed data use agreement forbids sending the data to ordinary
public APIs, so any endpoint that is not on this machine (loopback) is refused unless the user
states, with ``--dua-compliant-endpoint``, that it is covered (e.g. a deployment with human review
and data retention switched off, as PhysioNet's guidance on online services describes). Without
that flag the images go to the endpoint named and nowhere else (chexpercept.peer): never through a
proxy from the environment, and each new connection must reach a loopback socket of this account.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import math
import os
import queue
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from chexpercept.containment import ContainmentError, Tree, image_file, read_image
from chexpercept.domains import COUNT, COUNT_OR_NONE, POSITIVE
from chexpercept.escape import shell_word, shown, terminal
from chexpercept.eval.backends.occupancy import InFlightClock, WorkLedger, ratio, schedule_record
from chexpercept.eval.backends.openai.image_ids import (
    ASK_SECONDS,
    ASK_WAITS,
    MODELS_REPLY_LIMIT,
    RECHECK_WAITS,
    VLLM_NEUTRAL_SAMPLING,
    ImageIds,
    ServerSays,
    is_cache_miss,
    is_listing,
    refuses_ids,
    says_vllm,
    served_root,
    unsaid,
    why_not_vllm,
)
from chexpercept.eval.backends.openai.inflight import OK, OTHER, THROTTLED, AdaptiveLimit
from chexpercept.eval.backends.openai.retries import (
    RetryPolicy,
    ServerPause,
    WaitHint,
    WaitNotices,
    error_objects,
    read_wait_hint,
)
from chexpercept.eval.backends.options import BackendOptions, env_var_name, json_object, option
from chexpercept.eval.backends.prefetch import ImagePrefetch
from chexpercept.eval.backends.replies import (
    ReplyShapeError,
    join_reasoning,
    merge_stream,
    read_chat_reply,
    unfinished,
)
from chexpercept.eval.estimate.pricing import call_cost, price_for
from chexpercept.eval.protocol import (
    BackendBase,
    BackendError,
    Completion,
    Request,
    Response,
    RunContext,
    Sampling,
)
from chexpercept.eval.registry import ModelSpec
from chexpercept.input_files import REPLY
from chexpercept.input_json import JsonInputError, loads
from chexpercept.peer import DUA_FLAG, PeerRefused, is_loopback_host, route
from chexpercept.peer_http import images_session
from chexpercept.redaction import (
    has_secret,
    redact_text,
    redact_url,
    register_secret,
    register_secrets_in,
)
from chexpercept.usage import call_usage, usage_line

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
#: encoded images kept for the later turns of live conversations, at most (a 1024x1024 PNG X-ray is
#: about 1 MiB as a data URL); beyond it the least recently used are encoded again when needed
IMAGE_BUDGET = 256 << 20
#: threads that read and encode images, and that build request bodies
IMAGE_WORKERS = 2
BODY_WORKERS = 2
#: where an image's data URL goes in a body (a JSON string that no message text can contain)
_IMAGE_SLOT = "\x00chexpercept-image-{}\x00"
_IMAGE_SLOT_JSON = re.compile(rb'"\\u0000chexpercept-image-(\d+)\\u0000"')
#: a wrong key, a forbidden resource or a wrong URL: every request would fail the same way, so the
#: run stops at once whatever --on-error says
RUN_LEVEL_STATUS = frozenset({401, 403, 404})

DUA_REFUSAL = (
    "refusing to send CheXpercept images to {host}: it is not this machine (loopback). "
    "The PhysioNet credentialed data use agreement forbids sending MIMIC-derived data to ordinary "
    "public APIs. If this endpoint is covered by an arrangement that the agreement allows (for "
    "example an Azure OpenAI or Vertex AI deployment with human review and data retention opted "
    "out), rerun with --dua-compliant-endpoint to say so."
)


SECRET_IN_URL = (
    "--base-url carries a secret (a user:password@ part or a key in its query string); run.json and "
    "every message show it as ***, but a command line can be seen by the other users of this machine "
    "(ps) and stays in your shell history: put the key in an environment variable and name it with "
    "--api-key-env instead"
)


def is_loopback(base_url: str) -> bool:
    return is_loopback_host(urlsplit(base_url).hostname or "")


def check_endpoint(base_url: str, *, dua_compliant: bool) -> None:
    """Raise unless the endpoint is loopback or the user vouched for it."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            "--base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, "
            f"got {redact_url(base_url)!r}"
        )
    if not dua_compliant and not is_loopback(base_url):
        raise PermissionError(DUA_REFUSAL.format(host=parts.hostname))


def read_usage(usage: Any) -> dict[str, int | None]:
    """OpenAI usage fields -> input/cached/output/thinking/total tokens (spec 3.10); a figure the
    reply does not give (no ``usage`` object, no ``prompt_tokens_details``...), or that contradicts
    another (cached over the prompt: ``chexpercept.usage.call_usage``), is None, never 0."""
    usage = usage if isinstance(usage, dict) else {}
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    prompt_details = prompt_details if isinstance(prompt_details, dict) else {}
    completion_details = completion_details if isinstance(completion_details, dict) else {}
    return call_usage(
        {
            "input_tokens": usage.get("prompt_tokens"),
            "cached_input_tokens": prompt_details.get("cached_tokens"),
            "output_tokens": usage.get("completion_tokens"),
            "thinking_tokens": completion_details.get("reasoning_tokens"),
            "total_tokens": usage.get("total_tokens"),
        }
    )


@dataclass(frozen=True)
class Via:
    """How a reply came: its connection (aiohttp's protocol object, one per TCP connection; None
    where aiohttp did not say) and when its headers arrived (time.monotonic())."""

    connection: Any
    arrived: float


class _Retryable(Exception):
    def __init__(self, message: str, hint: WaitHint | None = None, *, status: int | None = None):
        super().__init__(message)
        #: the wait the server asked for (eval/backends/openai/retries.py), if it asked
        self.hint = hint
        self.status = status


class _Filtered(Exception):
    """The service rejected the request with a content filter: its verdict on the content."""


class _Resend(Exception):
    """The request named images by id and must go again with their pixels: the server no longer
    holds one (a cache miss), or it ``refused`` the form (eval/backends/openai/image_ids.py)."""

    def __init__(self, message: str, *, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class _RunLevel(Exception):
    """An error that every request of the run would meet (authentication, a wrong URL); ``advice``:
    what to check, when the message does not say it."""

    def __init__(self, message: str, advice: str = "check --base-url, the model id and the API key"):
        super().__init__(message)
        self.advice = advice


#: error codes of requests rejected for their content: Azure OpenAI's content filter, OpenAI's
#: usage-policy check ("invalid_prompt": the prompt was flagged)
CONTENT_FILTER_CODES = frozenset({"content_filter", "ResponsibleAIPolicyViolation", "invalid_prompt"})


def refuses_files(status: int, text: str) -> bool:
    """Whether an error reply says that the server reads no file:// URL, or none in the bundle
    (vLLM: "Cannot load local files without `--allowed-local-media-path`", a 500; "The file path ...
    must be a subpath of `--allowed-local-media-path ...`", a 400)."""
    return status >= 400 and "--allowed-local-media-path" in text


def _is_content_filter(body: str) -> bool:
    """An error body saying a content filter rejected the request (Azure OpenAI's 400)."""
    for error in error_objects(body):
        inner = error.get("innererror")
        codes = {
            str(error.get("code") or ""),
            str(inner.get("code") or "") if isinstance(inner, dict) else "",
        }
        if codes & CONTENT_FILTER_CODES:
            return True
    return False


#: the variable the API key is read from when --api-key-env is not given (unset: no key, as a local
#: ``vllm serve`` wants); a variable named on purpose must be set
DEFAULT_KEY_ENV = "OPENAI_API_KEY"


def api_key_from_env(name: str | None) -> str | None:
    """The API key in environment variable ``name`` (``--api-key-env``), or in OPENAI_API_KEY when no
    name is given (unset or blank there: no key, as a local ``vllm serve`` wants). A variable named on
    purpose must hold a key: unset, blank, or holding a control character (a pasted line break, which
    no HTTP header can carry) is refused before anything is sent; the key itself is never shown."""
    value = os.environ.get(name or DEFAULT_KEY_ENV)
    if value is not None and value.strip() and not any(c < " " or c == "\x7f" for c in value):
        return value
    if name is None and not (value or "").strip():
        return None  # the default variable, unset or blank: no key
    what = "is not set" if value is None else "is blank" if not value.strip() else "holds a control character"
    raise ValueError(
        f"the environment variable {name or DEFAULT_KEY_ENV}{' that --api-key-env names' if name else ''} "
        f"{what} in this process, so no usable key could be sent; export the key in it"
        + (", or leave --api-key-env out for a server that needs no key" if name else "")
    )


#: the fields a request body holds before the request fields go over it (``_payload``): a null in
#: --request-extra removes one of them, and is recorded
BODY_FIELDS = frozenset(
    {"model", "messages", "max_completion_tokens", "temperature", "top_p", "chat_template_kwargs"}
)

#: --image-urls: how an image's pixels travel (base64 in the request, or the server reads the file)
IMAGE_URLS = ("data", "file")
#: --server-kind: what the server is, asked (auto) or said by the user
SERVER_KINDS = ("auto", "vllm", "other")


@dataclass(frozen=True)
class OpenAIOptions(BackendOptions):
    """The openai backend's options (``chexpercept run --help``, group "openai backend")."""

    base_url: str | None = option(help="endpoint, e.g. http://127.0.0.1:8000/v1 (vllm serve)", answers=False)
    api_key_env: str | None = option(
        default=None,
        help=f"name of the environment variable holding the API key (never the key itself); a variable "
        f"named here must be set. Default: {DEFAULT_KEY_ENV}, if set (a local vllm serve needs no key)",
        check=env_var_name,
        answers=False,
        echo=False,
    )
    api_key_header: str = option(
        default="Authorization", help="'Authorization' (Bearer) or e.g. 'api-key' (Azure)", answers=False
    )
    concurrency: int = option(
        default=8,
        type=COUNT,
        answers=False,
        help="most requests in flight at once (default 8); halved on a 429 and raised back as "
        "answers come (the limits taken are in run.json)",
    )
    timeout: float = option(
        default=600.0,
        type=POSITIVE,
        answers=False,
        help="seconds one attempt may take, from sending to the reply's last byte (default 600)",
    )
    max_retries: int = option(
        default=6,
        type=COUNT_OR_NONE,
        answers=False,
        help="retries on 429, 5xx, timeouts (default 6)",
    )
    request_extra: dict[str, Any] | None = option(
        type=json_object, help="extra request fields as JSON (e.g. reasoning_effort)"
    )
    image_ids: str = option(
        default="auto",
        choices=("auto", "on", "off"),
        answers=False,
        help="send an image the server already holds by its id alone, without its pixels (vLLM's "
        "multimodal uuids; a later turn then carries only its new images): auto (when /models says "
        "the server is vLLM), on, off (default auto)",
    )
    server_kind: str = option(
        default="auto",
        choices=SERVER_KINDS,
        answers=False,
        help="what the server is: auto (asked: GET /v1/models, before the run; default), vllm or other "
        "(said here, not asked: a gateway that serves chat only). A vLLM is sent the neutral value of "
        "each sampling field it would take from the model's generation config (recorded in run.json)",
    )
    image_urls: str = option(
        default="data",
        choices=IMAGE_URLS,
        answers=False,
        help="how an image's pixels are sent: data (data: URLs, base64 in the request; default) or "
        "file (file:// URLs of the bundle's files, read by the server itself: a vllm serve on this "
        "machine started with --allowed-local-media-path at or above the bundle folder; the client "
        "then sends no pixels)",
    )
    dua_compliant_endpoint: bool = option(
        switch=True,
        answers=False,
        help="state that a non-local endpoint is allowed by the PhysioNet data use agreement",
    )


class OpenAIBackend(BackendBase):
    name = "openai"
    default_batch_size = 64
    Options = OpenAIOptions

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sampling: Sampling,
        options: OpenAIOptions | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        on_error: str = "stop",
        api_key: str | None = None,
        retry: RetryPolicy | None = None,
        **fields: Any,
    ):
        """``options`` (or its ``fields`` as keywords); ``api_key``: the key itself (default: the
        variable ``options.api_key_env`` names). ``chat_template_kwargs`` (``--no-thinking``,
        ``--chat-template-kwargs``) goes in every request as the body's ``chat_template_kwargs``, as
        vLLM's and SGLang's servers read it: run.json records it, so the server must get it."""
        options = options or OpenAIOptions(**fields)
        self.options = options
        if not options.base_url:
            raise ValueError(
                "the openai backend needs --base-url (e.g. http://127.0.0.1:8000/v1 for vllm serve)"
            )
        base_url = options.base_url
        if has_secret(base_url):
            print(f"note: {SECRET_IN_URL}", file=sys.stderr)
        check_endpoint(base_url, dua_compliant=options.dua_compliant_endpoint)
        if options.image_urls == "file" and not is_loopback_host(urlsplit(base_url).hostname or ""):
            raise ValueError(
                f"--image-urls file needs a server on this machine that reads the bundle's files "
                f"itself, at a loopback --base-url (e.g. http://127.0.0.1:8000/v1); {redact_url(base_url)} "
                "is not one: use --image-urls data"
            )
        #: proxies and peers as chexpercept.peer decides (checked for each new connection)
        self.route = route(
            base_url,
            what="CheXpercept images",
            declared=options.dua_compliant_endpoint,
            vouch=f"rerun with {DUA_FLAG}",
        )
        if on_error not in ("stop", "record"):
            raise ValueError(f"on_error must be 'stop' or 'record', got {on_error!r}")
        self.spec = spec
        self._sampling = sampling
        parts = urlsplit(base_url)  # the path goes before a query string (Azure's ?api-version=)
        self.url = urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions"))
        #: the endpoint as messages and run.json show it (chexpercept.redaction: no secret)
        self.shown_url, self.shown_base_url = redact_url(self.url), redact_url(base_url)
        self.api_key = api_key if api_key is not None else api_key_from_env(options.api_key_env)
        self.api_key_header = options.api_key_header
        self.concurrency = options.concurrency
        self.timeout = options.timeout
        self.retry = retry or RetryPolicy(max_retries=options.max_retries)
        #: whether the endpoint has answered once (HTTP, any status): until then a connection refused or
        #: a name that does not resolve ends the run at once instead of being retried
        self._reached = False
        #: when (time.monotonic()) the last sign came that the server may have restarted since it said
        #: what it is (a connection lost, a gateway's 502/503/504, an image id it no longer holds): no
        #: answer is taken before it is asked again (``_still_the_same``)
        self._sign_at = -math.inf
        #: when the last question that the server answered as the run's identity records began
        #: (``_ask_again``), and the question being asked; the connections a question vouched for
        self._said_at = -math.inf
        self._reasked: Any = None
        self._vouched: weakref.WeakSet[Any] = weakref.WeakSet()
        #: what the files at the server's ``root`` held when it first said it (``_content_of``)
        self._root_content: Any = None
        #: set when a server asks for a wait longer than the policy takes (eval/backends/openai/retries.py)
        self.pause, self.notices = ServerPause(), WaitNotices()
        self.extra_body = spec.request_fields(options.request_extra)
        #: the fields put over the body's own: ``extra_body``, and the run's seed once ``setup`` knows it
        self.fields = self.extra_body
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if self.chat_template_kwargs and "chat_template_kwargs" in self.extra_body:
            raise ValueError(
                "chat template variables given twice (--no-thinking or --chat-template-kwargs, and "
                "chat_template_kwargs in --request-extra): give them once"
            )
        # this run's known secrets are masked in every text it prints or writes (chexpercept.redaction)
        register_secret(self.api_key)
        register_secret(parts.password)
        if parts.password is not None:  # it travels as HTTP Basic credentials: user:password in base64
            basic = f"{unquote(parts.username or '')}:{unquote(parts.password)}".encode()
            register_secret(base64.b64encode(basic).decode("ascii"))
        register_secrets_in(self.extra_body)
        #: what a content-filter rejection is: the end of the run (stop) or a refusal (record)
        self.on_error = on_error
        self.root = ""
        self._tree: Tree | None = None
        #: each image's data URL as a JSON string, encoded ahead of need and kept while its
        #: conversation may send its pixels again (within IMAGE_BUDGET): until its conversation ends,
        #: or, by id, until the server holds it
        self.images = ImagePrefetch(
            self._encoded,
            lambda pieces: sum(map(len, pieces)),
            budget=IMAGE_BUDGET,
            workers=IMAGE_WORKERS,
            name="chexpercept-encode",
        )
        #: images a vLLM server holds, sent by id alone (eval/backends/openai/image_ids.py)
        self.ids = ImageIds(options.image_ids)
        self._asked_server: Any = None
        #: what the server said it is (``_server``): asked once, before the run's identity is made
        self._server_says: ServerSays | None = None
        #: bytes of the request bodies sent, every attempt counted
        self.bytes_sent = 0
        self._builders: ThreadPoolExecutor | None = None
        self.retries = 0
        self.limit = AdaptiveLimit(self.concurrency)
        self.clock = InFlightClock()
        #: seconds of each conversation's answered attempts (the floor's work)
        self.ledger = WorkLedger()
        #: served model name -> turns it answered (what the server says it answered with)
        self.served: dict[str, int] = {}
        self._loop: _LoopThread | None = None
        self._done: queue.SimpleQueue[tuple[Request, Response | BaseException]] = queue.SimpleQueue()
        self._outstanding = 0

    def identity(self, context: RunContext) -> dict[str, Any]:
        """What is sent besides the conversation and the decoding: every request field; and where the
        server says what it loaded the model from (vLLM's ``root``), that: another checkpoint served
        under the same name at the same URL is another model (red team, stop 44)."""
        root = self._server().root
        return {"request_fields": self._fields(context), **({"served_root": root} if root else {})}

    def identity_facts(self) -> dict[str, Any] | None:
        """What the server said it is (``ServerSays``), as the identity was made of it: told to the
        other processes of a data-parallel run, which send what it records (a server behind a
        balancer may tell each process otherwise)."""
        return None if self._server_says is None else asdict(self._server_says)

    def use_identity_facts(self, facts: Any) -> None:
        if facts is not None:
            self._server_says = ServerSays(**facts)
            self._root_content = _content_of(self._server_says.root)

    def _fields(self, context: RunContext) -> dict[str, Any]:
        """The request fields put over the body's own: ``--request-extra``'s (with the registry's); the
        run's seed where one is given (``chexpercept.eval.runner.plan.seed_for``: None, the default,
        sends none and the server's own randomness applies); and, to a server that says it is vLLM,
        the neutral value of each sampling field it would otherwise fill from the model's generation
        config (``VLLM_NEUTRAL_SAMPLING``: Qwen2.5-VL's repetition_penalty 1.05 applied under a run
        recorded as greedy; red team, stop 44)."""
        # a null removes a field of the body's own; one that removes nothing sends what no field
        # sends (seed null without --seed was another identity for the same body: red team, stop 44)
        fields = {k: v for k, v in self.extra_body.items() if v is not None or k in BODY_FIELDS}
        if context.seed is not None and "seed" not in fields:
            fields["seed"] = context.seed
        if self._server().vllm:
            fields = {**{k: v for k, v in VLLM_NEUTRAL_SAMPLING.items() if k not in fields}, **fields}
        return fields

    def _server(self) -> ServerSays:
        """What the server says it is (vLLM or not, why it is sent no image by id, its model's root), asked once
        (``GET /models`` and ``GET /version``; ``_ask_server``): before the run's identity is made,
        since what is sent depends on it. BackendError when the server does not say (never taken for
        a "no": a vLLM asked while busy would be sent another request than run.json records)."""
        if self._server_says is None and self.options.server_kind != "auto":  # said, not asked
            said = self.options.server_kind == "vllm"
            self._server_says = ServerSays(said, None if said else "--server-kind other", None)
        if self._server_says is None:
            if self._loop is None:
                self._loop = _LoopThread(self.route)
            waited = len(ASK_WAITS) * (2 * ASK_SECONDS + 1) + sum(ASK_WAITS) + 5  # /models and /version
            began = time.monotonic()
            self._server_says = self._loop.start(self._ask_server()).result(timeout=waited)
            self._said_at = began
            self._root_content = _content_of(self._server_says.root)
        return self._server_says

    def usage_summary(self, records: Mapping[str, Mapping[str, Any]]) -> str | None:
        """What the server said it used (never a 0 it did not say: chexpercept.usage)."""
        usages = [t.get("usage") or {} for r in records.values() for t in r.get("turns", [])]
        return usage_line(usages, priced=price_for(self.spec.model_id) is not None)

    def token_counter(self, root: Any) -> Any:
        from chexpercept.eval.estimate.count import ApiCounter
        from chexpercept.eval.estimate.pricing import rules_for

        return ApiCounter(root, rules_for(self.spec.model_id))

    def setup(self, context: RunContext) -> None:
        self.root = str(context.root)
        self.fields = self._fields(context)
        self._tree = Tree(context.root)  # the release's real path, resolved once for every image

    # ------------------------------------------------------------------ payload
    def _encoded(self, relative: str) -> tuple[bytes, ...]:
        """The image's URL as a JSON string, in pieces that a body splices in without copying the
        image once more: contained in the bundle, a PNG or JPEG (chexpercept.containment). A data
        URL is three pieces (opening, base64, closing; its MIME type from the image's bytes, base64
        needs no escaping); a file URL (``--image-urls file``) is one."""
        if self.options.image_urls == "file":  # the server reads the file: its URL alone
            return (json.dumps(image_file(self._tree or self.root, relative).as_uri()).encode("ascii"),)
        image = read_image(self._tree or self.root, relative)
        return f'"data:{image.mime};base64,'.encode("ascii"), image.base64(), b'"'

    def image_url(self, relative: str) -> str:
        """The image's URL as it is sent: a ``data:`` URL (encoded once while its conversation is
        live) or, with ``--image-urls file``, a ``file://`` URL."""
        return b"".join(self.images.get(relative, keep=True))[1:-1].decode("ascii")

    def build_payload(self, request: Request) -> dict[str, Any]:
        """The request's JSON body as an object (``build_body`` gives its bytes)."""
        return self._payload(request.openai_messages(self.image_url))

    def _payload(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        s = self._sampling
        payload: dict[str, Any] = {
            "model": self.spec.model_id,
            "messages": messages,
            "max_completion_tokens": s.max_tokens,
            "temperature": s.temperature,
        }
        if s.top_p is not None:  # given (--top-p): reasoning models reject it, so it is not sent unasked
            payload["top_p"] = s.top_p
        if self.chat_template_kwargs:
            payload["chat_template_kwargs"] = self.chat_template_kwargs
        payload.update(self.fields)
        # a null in --request-extra removes the field (servers that reject one of ours)
        return {k: v for k, v in payload.items() if v is not None}

    def build_body(self, request: Request) -> bytes:
        """``json.dumps(build_payload(request))`` as bytes, each image's encoded data URL spliced in
        (encoded once per image: ``images``); an image the server holds goes by its id alone when
        ids are on (``ids``). Raises ContainmentError or OSError for an image that cannot be sent."""
        return b"".join(self._body(request, resend=False)[0])

    def _body(self, request: Request, *, resend: bool) -> tuple[tuple[bytes, ...], list[str], bool]:
        """(the body in pieces, to be sent one after the other without joining them, the images
        whose pixels it carries with their ids, whether it names any image by id alone);
        ``resend``: every image with its pixels."""
        if any("\x00" in m.text for m in request.messages):  # no room for the slots: the plain way
            return (json.dumps(self.build_payload(request)).encode("utf-8"),), [], False
        held = {} if resend else self.ids.held(request.images)
        slots: list[tuple[bytes, ...]] = []
        carried: list[str] = []

        def part(relative: str) -> dict[str, Any]:
            if relative in held:
                return {"type": "image_url", "image_url": None, "uuid": held[relative]}
            encoded = self.images.get(relative, keep=True)
            slots.append(encoded)
            image: dict[str, Any] = {
                "type": "image_url",
                "image_url": {"url": _IMAGE_SLOT.format(len(slots) - 1)},
            }
            if self.ids.on:
                image["uuid"] = self.ids.id_of(relative)
                carried.append(relative)
            return image

        messages = request.messages_with(part)
        self.ids.count(by_id=len(request.images) - len(slots), with_pixels=len(slots))
        pieces = _IMAGE_SLOT_JSON.split(json.dumps(self._payload(messages)).encode("utf-8"))
        # split keeps each slot's number between the text pieces: text, number, text, number, ...
        body: list[bytes] = []
        for i, piece in enumerate(pieces):
            body.extend(slots[int(piece)] if i % 2 else (piece,))
        return tuple(body), carried, bool(held)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            value = (
                f"Bearer {self.api_key}" if self.api_key_header.lower() == "authorization" else self.api_key
            )
            headers[self.api_key_header] = value
        return headers

    # ------------------------------------------------------------------ requests
    def submit(self, requests: Sequence[Request]) -> None:
        """Each request goes out at once (within the in-flight limit) on the backend's event loop;
        its new images start encoding at once and its body is built on a thread of its own."""
        if self._loop is None:  # started here, or by the question of what the server is (_server)
            self._loop = _LoopThread(self.route)
        if self._builders is None:
            self._builders = ThreadPoolExecutor(BODY_WORKERS, thread_name_prefix="chexpercept-body")
        images = [i for r in requests for i in r.images]
        held = self.ids.held(images)  # sent by id alone: nothing to encode
        self.images.want(i for i in images if i not in held)
        for request in requests:
            self._outstanding += 1
            self._loop.start(self._answer(request))

    def completed(self) -> list[Completion]:
        if self._outstanding < 1:
            raise BackendError("openai backend: completed() called with no request in flight")
        items = [self._done.get()]
        while True:
            try:
                items.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._outstanding -= len(items)
        for _request, answer in items:
            if isinstance(answer, BaseException):  # what ends the run (a wrong key, --on-error stop)
                raise answer
        return [(request, answer) for request, answer in items]  # type: ignore[misc]

    def release(self, key_ids: Sequence[str]) -> None:
        self.ledger.release(key_ids)
        prefixes = tuple(f"chexpercept/{k}/" for k in key_ids)
        self.images.release(prefixes)
        self.ids.release(prefixes)

    async def _answer(self, request: Request) -> None:
        answer: Response | BaseException
        try:
            if self.ids.on is None:  # ids auto: what the server said it is (asked before any request)
                if self._server_says is not None:
                    why_not = self._server_says.why_no_ids
                else:  # a backend driven without setup: ask once, whoever comes first
                    if self._asked_server is None:
                        self._asked_server = asyncio.ensure_future(self._ask_server())
                    why_not = (await asyncio.shield(self._asked_server)).why_no_ids
                if self.ids.on is None:
                    self.ids.decided(why_not)
            answer = await self._send(request, resend=False)
            if isinstance(answer, _Resend):  # once more, every image with its pixels
                if answer.refused:
                    self.ids.refused(str(answer))
                else:
                    self.ids.missed(request.images)
                answer = await self._send(request, resend=True)
            if isinstance(answer, _Resend):
                answer = _failed(f"the server refused a request that carried every image's pixels: {answer}")
        except BackendError as e:
            answer = e
        except Exception as e:  # a bug here must end the run with its cause, not hang it
            answer = BackendError(f"{request.key_id} ({request.task}): {type(e).__name__}: {e}")
        self._done.put((request, answer))

    async def _send(self, request: Request, *, resend: bool) -> Response | _Resend:
        """The request's body built on a worker thread, then sent (``_one``); the images whose pixels
        it carried are held by the server once it is answered."""
        loop = asyncio.get_running_loop()
        try:
            body, carried, by_id = await loop.run_in_executor(
                self._builders, lambda: self._body(request, resend=resend)
            )
        except (ContainmentError, OSError) as e:  # an image changed after validation: this case only
            return _failed(f"image not sent: {e}")
        try:
            answer = await self._one(request, body, by_id=by_id)
        except _Resend as e:
            return e
        if answer.error is None:
            self.ids.answered(carried)
            # the server holds them now: later turns name them by id, and a miss encodes them again
            self.images.drop(carried)
        return answer

    async def _ask_server(self, *, during_run: bool = False) -> ServerSays:
        """What the server says it is: its ``GET /models`` and ``GET /version``
        (eval/backends/openai/image_ids.py), each request within ``ASK_SECONDS``, asked again after
        each of ``ASK_WAITS`` (``during_run``: ``RECHECK_WAITS``, over minutes, as a request's
        retries are) while the server does not say (no answer in time, a refused connection, a
        status that ``unsaid``). BackendError when it never says: what is sent, and so the run's
        identity, depends on it (red team, stop 45: a busy vLLM was run as another server, without
        its neutral sampling fields). A status that is an answer (404, 501: no listing) is a server
        that is no vLLM. A /version that does not answer in time sends no image by id (the same
        answers)."""
        assert self._loop is not None
        parts = urlsplit(self.url)
        base = parts.path.rsplit("/chat/completions", 1)[0]
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        session = await self._loop.session()

        async def read(path: str) -> tuple[int, bytes]:
            url = urlunsplit(parts._replace(path=path))
            async with session.get(url, headers=self._headers(), allow_redirects=False) as reply:
                return reply.status, await _read_bounded(reply.content, MODELS_REPLY_LIMIT)

        async def both() -> ServerSays | str:
            try:
                status, models = await asyncio.wait_for(read(base + "/models"), ASK_SECONDS)
            except asyncio.TimeoutError:
                return f"no answer to GET {base}/models within {ASK_SECONDS:g} s"
            if unsaid(status):
                return f"GET {base}/models answered HTTP {status}"
            if status != 200:
                return ServerSays(False, f"the server's /models answered HTTP {status}: no vLLM listing")
            if len(models) > MODELS_REPLY_LIMIT:
                return f"GET {base}/models answered more than {MODELS_REPLY_LIMIT >> 20} MiB"
            if not is_listing(models):
                return f"GET {base}/models answered HTTP 200 without a model listing"
            vllm = says_vllm(models, self.spec.model_id)
            version = b""
            if vllm:  # /version is asked of a vLLM only; without it, no image goes by id (same answers)
                try:
                    version_status, version = await asyncio.wait_for(read(root + "/version"), ASK_SECONDS)
                except asyncio.TimeoutError:
                    version_status = 0
                version = version if version_status == 200 else b""
            why_not = why_not_vllm(models, version, self.spec.model_id)
            return ServerSays(vllm, why_not, served_root(models, self.spec.model_id) if vllm else None)

        import aiohttp

        why = ""
        waits = RECHECK_WAITS if during_run else ASK_WAITS
        for wait in waits:
            await asyncio.sleep(wait)
            try:
                said = await both()
            except PeerRefused as e:  # another account's socket: nothing was asked
                raise BackendError(str(e)) from e
            except aiohttp.ClientConnectorError as e:  # nothing listens there (yet)
                if wait == waits[-1] and not during_run:
                    raise BackendError(self._unreachable(e)) from e
                said = f"{type(e).__name__}: {redact_text(str(e))}"
            except Exception as e:  # reset, closed
                said = f"{type(e).__name__}: {redact_text(str(e))}"
            if isinstance(said, ServerSays):
                return said
            why = said
        asked = f"{len(waits)} times asked over {sum(waits):g} s; the last: {terminal(why)}"
        if during_run:
            raise BackendError(
                f"{self.shown_url} stopped saying what it is in the middle of the run ({asked}), after a "
                "sign that it may have restarted: no answer is taken from a server that may serve another "
                "model. The answers saved so far stay; rerun the same command once it answers GET /v1/models"
            )
        raise BackendError(
            f"{self.shown_url} did not say what it is ({asked}). What the run sends depends on it (a vLLM "
            "server is sent the neutral value of each sampling field it would take from the model's "
            "generation config), so nothing was sent: is the server up? rerun the same command once it "
            "answers GET /v1/models, or say what it is with --server-kind vllm or other (a gateway that "
            "serves chat alone)"
        )

    def _ask_since(self, via: Via) -> float:
        """When a question of what the server is must have begun for an answer that came ``via`` to
        be taken (-inf: none is needed). After a sign that the server may have restarted: after the
        sign. Over a connection no question has vouched for, from a server that says it is vLLM
        (whose ``root`` tells one checkpoint from another): after the answer's headers came, so
        after the connection was made. Before (left alone at stop 45's fix): a server restarted on
        another checkpoint between two requests, with no error seen (its idle connections closed,
        the next request on a new one), had its answers kept under the first one's identity. A
        server named by ``--server-kind`` is never asked."""
        if self.options.server_kind != "auto":
            return -math.inf
        says = self._server_says
        fresh = (
            says is not None and says.vllm and (via.connection is None or via.connection not in self._vouched)
        )
        return max(self._sign_at, via.arrived if fresh else -math.inf)

    async def _still_the_same(self, since: float) -> None:
        """Before an answer is taken that may come from another server than the one that said what
        it is (``_ask_since``): it is asked again, by a question that began at ``since`` or later
        (shared by every answer waiting on it), and BackendError ends the run where it now says
        otherwise than the run's identity records (another checkpoint's ``root``, or no longer
        vLLM): its answers from here would be another model's (red team, stop 45: a server
        restarted on another checkpoint mid-run had its answers kept under the first one's
        identity). Answers already taken stay: they came before."""
        while self._said_at < since:
            if self._reasked is None:
                self._reasked = asyncio.ensure_future(self._ask_again(time.monotonic()))
            await asyncio.shield(self._reasked)

    async def _ask_again(self, began: float) -> None:
        """One question of ``_still_the_same``, begun at ``began``."""
        try:
            now = await self._ask_server(during_run=True)
        finally:
            self._reasked = None
        before = self._server_says
        if before is not None and (now.vllm, now.root) != (before.vllm, before.root):
            said = f"vLLM serving {now.root}" if now.vllm else "no vLLM"
            was = f"vLLM serving {before.root}" if before.vllm else "no vLLM"
            raise BackendError(
                f"{self.shown_url} now says it is {terminal(said)}; the run began with {terminal(was)} "
                "(it restarted in between): its answers from here would be another model's, so none is "
                "taken. The answers saved so far are the first one's; to go on, serve that model again "
                "and rerun the same command, or use another --output-dir"
            )
        if self._root_content is not None and now.root is not None:
            content = await asyncio.to_thread(_content_of, now.root)
            if content != self._root_content:
                raise BackendError(
                    f"{self.shown_url} restarted serving {terminal(now.root)}, whose files have changed since the "
                    "run began (a link pointed elsewhere, a checkpoint written over): its answers from here "
                    "would be another model's, so none is taken. The answers saved so far are the first "
                    "files'; rerun with another --output-dir for the new ones"
                )
        self._said_at = max(self._said_at, began)

    def _unreachable(self, error: BaseException) -> str:
        """A server never reached in this run: what to do (its URL redacted)."""
        return (
            f"cannot reach {self.shown_url}: {redact_text(str(error))}; it has not answered once in this run "
            "(is the server up? rerun the same command once it answers)"
        )

    async def _one(self, request: Request, body: tuple[bytes, ...], *, by_id: bool = False) -> Response:
        where = f"{request.key_id} ({request.task})"
        attempt, waited = 0, 0.0
        while True:
            paused = self.pause.reason()  # a server asked for a wait too long to take: send nothing
            if paused:
                return _failed(paused)
            started = await self.limit.acquire()
            self.clock.change(+1)
            outcome, error, reply = OTHER, None, None
            try:
                reply, via = await self._post(body, by_id=by_id)
                outcome = OK
            except _Retryable as e:
                outcome, error = (THROTTLED if e.status == 429 else OTHER), e
            except (_RunLevel, _Filtered, BackendError) as e:
                error = e
            finally:
                self.clock.change(-1)
                await self.limit.release(started, outcome)
            if reply is not None:
                since = self._ask_since(via)
                if since > -math.inf:
                    await self._still_the_same(since)
                if via.connection is not None:
                    self._vouched.add(via.connection)  # the server that answered over it is the one asked
                seconds = time.monotonic() - started
                self.ledger.add(request.key_id, seconds)
                return self._response(where, reply, attempts=attempt + 1, seconds=seconds)
            if isinstance(error, _Retryable):
                wait, why = self.retry.next_wait(attempt, waited, error.hint)
                if wait is None:
                    asked = ""
                    if error.hint is not None and self.retry.too_long(error.hint):
                        self.pause.hold(error.hint)  # nothing more is sent before it ends
                    elif error.hint is not None:
                        asked = f"; {error.hint.asked()}"
                    return _failed(f"{why}: {error}{asked}")
                if error.hint is not None and wait >= self.retry.notice_after:
                    self.notices.say(error.hint)
                await asyncio.sleep(wait)  # a stop signal cancels it (the loop is stopped)
                waited += wait
                attempt += 1
                self.retries += 1
                continue
            if isinstance(error, _RunLevel):
                advice = f" ({error.advice})" if error.advice else ""
                raise BackendError(
                    f"{where}: {error}. Every request would fail the same way{advice}"
                ) from error
            if isinstance(error, _Filtered):
                if self.on_error == "stop":
                    raise BackendError(
                        f"{where}: a content filter rejected the request ({error}). Rerun with --on-error "
                        "record to record such rejections as the model's answers (scored as refusals) and go on"
                    ) from error
                return Response("", {"finish_reason": "content_filter"}, refusal=f"content filter: {error}")
            return _failed(str(error))

    # ------------------------------------------------------------------ HTTP
    async def _exchange(self, body: tuple[bytes, ...]) -> tuple[int, Any, bytes, Via]:
        """(status, headers, body bytes, how it came) of one POST of ``body``'s pieces; redirects
        are not followed."""
        assert self._loop is not None
        payload = pieces_payload(body)
        self.bytes_sent += payload.size
        session = await self._loop.session()
        async with session.post(
            self.url, data=payload, headers=self._headers(), allow_redirects=False
        ) as reply:
            connection = reply.connection
            via = Via(None if connection is None else connection.protocol, time.monotonic())
            data = await _read_bounded(reply.content, REPLY.max_bytes)
            if len(data) > REPLY.max_bytes:
                raise BackendError(f"the reply of {self.url} is over the limit of {REPLY.describe()}")
            return reply.status, reply.headers, data, via

    async def _post(self, body: tuple[bytes, ...], *, by_id: bool = False) -> tuple[dict[str, Any], Via]:
        """One attempt, within its deadline (``--timeout`` from sending to the reply's last byte);
        ``by_id``: the body names images by id (a refusal of that form is ``_Resend``)."""
        import aiohttp

        try:
            status, headers, raw, via = await asyncio.wait_for(self._exchange(body), self.timeout)
        except PeerRefused as e:  # another account's socket, or not loopback: nothing was sent
            raise _RunLevel(str(e)) from e
        except asyncio.TimeoutError as e:
            raise _Retryable(f"no complete reply within {self.timeout:g} s (--timeout)") from e
        except aiohttp.ClientPayloadError as e:  # Content-Length or chunked body cut short
            raise _Retryable(f"the reply was cut off mid-body ({e})") from e
        except aiohttp.ClientConnectorError as e:
            # never reached in this run (a mistyped host, a port nothing listens on): retrying for minutes
            # would not help; once the server has answered, the same error is an outage, waited out
            if not self._reached:
                raise _RunLevel(self._unreachable(e)) from e
            self._sign_at = time.monotonic()
            raise _Retryable(f"cannot reach {self.shown_url}: {redact_text(str(e))}") from e
        except (aiohttp.ClientError, OSError) as e:  # a reset or closed connection
            self._sign_at = time.monotonic()
            raise _Retryable(f"{type(e).__name__}: {redact_text(str(e))}") from e
        self._reached = True
        text = raw.decode("utf-8", "replace")
        if 200 <= status < 300:
            return _reply_object(text, headers.get("Content-Type") or "", self.shown_url), via
        detail = shown(text, 500)  # the server's words, shown on one line and inert on a terminal
        if is_cache_miss(status, text):  # an image sent by id that the server no longer holds
            self._sign_at = time.monotonic()  # let go of it, or restarted
            raise _Resend(f"HTTP {status}: {detail}")
        if by_id and refuses_ids(status, text):  # not the vLLM it says it is
            raise _Resend(f"HTTP {status}: {detail}", refused=True)
        if self.options.image_urls == "file" and refuses_files(status, text):
            raise _RunLevel(
                f"HTTP {status} from {self.shown_url}: {detail}. With --image-urls file the server reads "
                f"the bundle's files itself: start it with --allowed-local-media-path {shell_word(self.root)} "
                "(or a folder above it), or rerun with --image-urls data",
                advice="",
            )
        if 300 <= status < 400:
            location = headers.get("Location")
            raise _RunLevel(
                f"HTTP {status} from {self.shown_url} redirects to "
                f"{redact_url(location) if location else location!r}; redirects are "
                "not followed (the images go only to the endpoint given): pass the final URL as --base-url"
            )
        if status in RETRY_STATUS:
            if status in (502, 503, 504):  # a server restarting (behind a proxy: its gateway errors)
                self._sign_at = time.monotonic()
            hint = read_wait_hint(headers, text, status=status)
            raise _Retryable(f"HTTP {status}: {detail}", hint, status=status)
        if status == 400 and _is_content_filter(text):
            raise _Filtered(f"HTTP {status}: {detail}")
        if status in RUN_LEVEL_STATUS:
            raise _RunLevel(f"HTTP {status} from {self.shown_url}: {detail}")
        raise BackendError(f"HTTP {status} from {self.shown_url}: {detail}")

    def _response(self, where: str, reply: dict[str, Any], *, attempts: int, seconds: float) -> Response:
        try:
            parsed = read_chat_reply(reply)
        except ReplyShapeError as e:  # the case's error, recorded like any other (--on-error)
            return _failed(f"{where}: {e}: {shown(json.dumps(reply), 300)}")
        text, reasoning, refusal = parsed.content, parsed.reasoning, parsed.refusal
        usage: dict[str, Any] = read_usage(reply.get("usage"))  # None where the server said nothing
        usage["cost_usd"] = call_cost(
            self.spec.model_id, usage["input_tokens"], usage["cached_input_tokens"], usage["output_tokens"]
        )
        usage["attempts"] = attempts
        usage["seconds"] = round(seconds, 3)
        finish = parsed.finish_reason
        if finish:
            usage["finish_reason"] = finish
        self._note_served(usage, reply)
        if not refusal and finish == "content_filter":
            refusal = "content filter (finish_reason content_filter)"
        # a refusal or an empty reply (content filter, token cap) is an answer: unparsed, so wrong
        return Response(
            text or "",
            usage,
            full_text=join_reasoning(reasoning, text, self.spec.model_id),
            refusal=refusal,
        )

    def _note_served(self, usage: dict[str, Any], reply: dict[str, Any]) -> None:
        """Record what the server says it answered with (``model``, ``system_fingerprint``) and warn
        once per model that is not the one asked for: proxies and routers fall back silently."""
        served = reply.get("model")
        if isinstance(served, str) and served:
            usage["served_model"] = served
            first = served not in self.served
            self.served[served] = self.served.get(served, 0) + 1
            if first and not same_model(self.spec.model_id, served):
                print(
                    f"warning: asked for {self.spec.model_id!r}, the server answered as {served!r} (a proxy "
                    "or router may have fallen back to another model); each turn records the served model "
                    "in usage.served_model and run.json counts them",
                    file=sys.stderr,
                )
        fingerprint = reply.get("system_fingerprint")
        if isinstance(fingerprint, str) and fingerprint:
            usage["system_fingerprint"] = fingerprint

    def sampling(self) -> Sampling:
        return self._sampling

    def new_session(self) -> None:
        """Counts start again (a command running several oracle settings records each one's)."""
        self.ledger, self.clock, self.served = WorkLedger(), InFlightClock(), {}
        self.limit = AdaptiveLimit(self.concurrency)

    def schedule(self) -> dict[str, Any]:
        """run.json's ``schedule``: the span against the floor at --concurrency, and occupancy."""
        floor = self.ledger.floor(self.concurrency)
        return schedule_record(
            mode="continuous",
            span_seconds=self.clock.span,
            reply_seconds=self.ledger.total,
            longest_conversation_seconds=self.ledger.longest_chain,
            floor_seconds=floor,
            span_over_floor=ratio(self.clock.span, floor),
            mean_in_flight=self.clock.mean,
            in_flight_limit=self.limit.record(),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "base_url": self.shown_base_url,
            "model_id": self.spec.model_id,
            "extra_body": self.extra_body,
            "concurrency": self.concurrency,
            "timeout_seconds": self.timeout,
            "max_retries": self.retry.max_retries,
            "price_per_1m_tokens": price_for(self.spec.model_id),
            "served_models": dict(self.served),
            "image_ids": self.ids.record(),
            "image_urls": self.options.image_urls,
            "request_bytes_sent": self.bytes_sent,
            "schedule": self.schedule(),
        }

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()
        builders, self._builders = self._builders, None
        if builders is not None:
            builders.shutdown(wait=False, cancel_futures=True)
        self.images.close()


@functools.cache
def _pieces_class() -> type:
    from aiohttp.payload import Payload

    class Pieces(Payload):
        """A request body sent as its pieces, one write each: no copy of the whole is made (aiohttp
        joins the headers with the first write only, and on Python < 3.12.9 joins whatever is
        written at once). Its length is known (Content-Length); it can be sent again (retries)."""

        _autoclose = True

        def __init__(self, pieces: tuple[bytes, ...]) -> None:
            super().__init__(pieces, content_type="application/json")
            self._size = sum(map(len, pieces))

        def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
            return b"".join(self._value).decode(encoding, errors)

        async def write(self, writer: Any) -> None:
            for piece in self._value:
                await writer.write(piece)

        async def write_with_length(self, writer: Any, content_length: int | None) -> None:
            if content_length is None or content_length >= self._size:
                await self.write(writer)
            else:
                await writer.write(b"".join(self._value)[:content_length])

        async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
            return b"".join(self._value)

    return Pieces


def pieces_payload(pieces: tuple[bytes, ...]) -> Any:
    """An aiohttp payload that sends ``pieces`` one after the other (``Content-Length``: their sum)."""
    return _pieces_class()(pieces)


async def _read_bounded(content: Any, limit: int) -> bytes:
    """A reply's body (aiohttp's ``StreamReader``), never read past ``limit + 1`` bytes (more than
    ``limit`` bytes: over the limit), its chunks joined once (adding each to the last took time
    squared in the reply's size)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit and (chunk := await content.read(limit + 1 - size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _failed(message: str) -> Response:
    """A failed request: no answer (the engine stops the run or records the case, per --on-error);
    the message goes to failures.jsonl and the run's last line, so any URL in it is redacted."""
    return Response("", {}, error=redact_text(message))


def same_model(asked: str, served: str) -> bool:
    """Whether a served model name is the one asked for: the same name, or a dated or versioned
    snapshot of it (``gpt-5.4`` answered as ``gpt-5.4-2026-03-05``), Google's ``models/`` prefix and
    case apart."""

    def norm(name: str) -> str:
        name = name.strip().lower()
        return name[len("models/") :] if name.startswith("models/") else name

    a, b = norm(asked), norm(served)
    return (
        a == b
        or b.startswith(a + "-")
        or a.startswith(b + "-")
        or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]
    )


def _content_of(root: str | None) -> Any:
    """What the files at a server's ``root`` hold, where it names a model folder of this machine
    (``with_file_contents``: the digest cache makes an unchanged folder cheap), else None. A vLLM
    restarted on the same path with other files there (a link pointed elsewhere, a checkpoint
    written over) said the same ``root``, and its answers were kept (red team, stop 48 round 2)."""
    if not root:
        return None
    from chexpercept.eval.runner.identity import with_file_contents

    try:
        content = with_file_contents(root)
    except OSError:
        return None
    return content if isinstance(content, dict) else None


def _reply_object(text: str, content_type: str, url: str) -> dict[str, Any]:
    """The reply of a 2xx as an object: JSON, or a streamed reply (server-sent events) put together;
    a body that is not a complete reply (cut off, an HTML page) is retried."""
    if "text/event-stream" in content_type.lower():
        return _from_events(text, url)
    try:
        data = loads(text, source=f"the reply of {url}", limit=REPLY)
    except JsonInputError as e:
        if e.kind != "invalid":  # nested too deeply: not an API's reply, never retried
            raise BackendError(terminal(str(e))) from None
        raise _Retryable(
            f"the reply is not complete JSON ({len(text)} characters, Content-Type {content_type or 'none'!r}): "
            "cut off, or not an API's reply"
        ) from e
    if not isinstance(data, dict):
        raise BackendError(f"{url} replied with JSON that is not an object: {shown(text, 200)}")
    _no_answer(data, url)  # with choices too: an error beside them is no answer (round 2)
    _unfinished(data)
    return data


def _no_answer(data: dict[str, Any], url: str) -> None:
    """The one rule of a 2xx reply, or a streamed chunk, that carries an error instead of an answer
    (some gateways; vLLM's stream when a generation fails midway: an error chunk, then ``[DONE]``):
    retried where its code says so, else the request's error, never an answer (red team, stop 48:
    a stream's text before its error chunk was scored as the model's answer)."""
    error = data.get("error")
    if error:
        code = error.get("code") if isinstance(error, dict) else None
        detail = shown(json.dumps(data), 500)
        if isinstance(code, int) and code in RETRY_STATUS:
            raise _Retryable(f"error in the reply: {detail}")
        raise BackendError(f"error in the reply from {url}: {detail}")


def _unfinished(reply: dict[str, Any]) -> None:
    """_Retryable when the reply's first choice says its generation did not finish (``UNFINISHED``);
    retried, then the request's error, never an answer (red team, stop 48)."""
    choices = reply.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    if unfinished(finish):
        raise _Retryable(
            f"the server ended the generation unfinished (finish_reason {shown(str(finish), 60)})"
        )


def _from_events(text: str, url: str) -> dict[str, Any]:
    """A streamed chat completion (``data: {...}`` chunks, ``data: [DONE]``) as one reply object; a
    stream that ends before its last chunk is retried."""
    chunks: list[Any] = []
    done = False
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            continue
        try:
            chunk = loads(data, source="a streamed chunk", limit=REPLY)
        except JsonInputError as e:
            raise _Retryable(f"a streamed reply holds a chunk that is not JSON: {shown(data, 200)}") from e
        if isinstance(chunk, dict):
            _no_answer(chunk, url)
        chunks.append(chunk)
    try:
        reply, finished = merge_stream(chunks)
    except ReplyShapeError as e:  # recorded as the case's error (BackendError in _post)
        raise BackendError(str(e)) from None
    if not finished:  # [DONE] without a finish reason too: whether the generation ended is unknown (round 2)
        raise _Retryable(
            "a streamed reply gave no finish reason: it may have been cut off"
            if done
            else "a streamed reply ended before its last chunk"
        )
    _unfinished(reply)
    return reply


class _LoopThread:
    """An asyncio event loop on a daemon thread, with the backend's HTTP session (aiohttp)."""

    def __init__(self, peer_route: Any) -> None:
        self.route = peer_route
        self.loop = asyncio.new_event_loop()
        self._session: Any = None
        self.thread = threading.Thread(target=self.loop.run_forever, name="chexpercept-openai", daemon=True)
        self.thread.start()

    def start(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def session(self) -> Any:
        if self._session is None:
            import aiohttp

            # no pool limit of its own (the in-flight limit is ours); proxies and each connection's
            # peer as chexpercept.peer decides
            self._session = images_session(self.route, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def stop(self) -> None:
        """Cancel what is in flight, close the session and end the thread (within seconds)."""
        if self.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self.start(self._shutdown()).result(timeout=5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.loop.close()
