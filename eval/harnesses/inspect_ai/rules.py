"""What the Inspect task checks of the model before a case's first request: the data-use rules our
runner enforces (chexpercept.peer), and what a CheXpercept conversation needs of a model.

Data use (the PhysioNet credentialed data use agreement requires that no one else keeps the data):

- ``--batch`` is refused unless the endpoint is declared (``-T dua_compliant=true``): a batch
  endpoint keeps every request server side (an uploaded input file) until it is deleted.
- A model whose requests leave this machine is refused unless declared: any provider without a
  base URL (its public API), or a base URL whose host is not loopback.
- A loopback endpoint that is not declared gets our runner's rule: no proxy from the environment
  (Inspect's HTTP client would send the images through it), and each new connection of the
  provider's HTTP client must reach a loopback socket of this account (``peer.check_peer`` on a
  probe connection before each case, and on every connection of OpenAI-compatible providers'
  ``http_client``).
- Models run inside this process (``hf``, ``mockllm``, ...) send nothing anywhere.

Images in the log: Inspect keeps every image of every request in its log file unless
``--no-log-images``; ``check_log_images`` refuses a run that would (see ``LogSettings``).

What the model must do: answer multi-turn chats with several images per request (a conversation
re-sends every earlier image). Completions-only and text-only providers are refused by name; an
image limit set on Inspect's ``vllm`` provider (``-M limit_mm_per_prompt=...``) below the most
images a selected case sends is refused before any request; a provider that rejects the images at
run time gets its error explained (``explain_rejection``).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from chexpercept.errors import Refused
from chexpercept.escape import shown
from chexpercept.peer import PeerRefused, Route, check_peer, environment_proxy, is_loopback_host, route

#: the task parameter that declares the endpoint DUA-compliant
DUA_PARAM = "dua_compliant"
VOUCH = f"if it is covered by an arrangement the agreement allows, say so with -T {DUA_PARAM}=true"
WHAT = "CheXpercept images"

#: providers that run the model inside this process: nothing is sent anywhere
IN_PROCESS_PROVIDERS = frozenset({"hf", "mockllm", "transformer_lens", "nnterp", "none"})
#: providers that start the model's server on this machine when no base URL is given
LOCAL_SERVER_PROVIDERS = frozenset({"vllm", "sglang"})
#: providers that cannot take a chat with images (completions APIs, text-only frameworks)
TEXT_ONLY_PROVIDERS = frozenset({"openai-api-completions", "vllm-completions", "transformer_lens", "nnterp"})

AGREEMENT = (
    "The PhysioNet credentialed data use agreement forbids sending MIMIC-derived data to services "
    "that keep it (PhysioNet requires zero data retention: human review and data retention switched "
    "off)."
)


class DataUseRefused(Refused, PermissionError):
    """The run would send or keep the images where the data use agreement does not allow it."""


class ModelUnsuitable(ValueError):
    """The model cannot hold a CheXpercept conversation (multi-turn, several images per request)."""


def provider_of(model: Any) -> str:
    """The Inspect provider of a model (``openai`` for ``openai/gpt-5.4``)."""
    return str(model).split("/", 1)[0]


def check_model(model: Any, config: Any, *, declared: bool, images_needed: int) -> Route | None:
    """Raise unless ``model`` (Inspect's ``Model``) may receive the cases under ``config`` (the
    eval's ``GenerateConfig``) and can hold their conversations; ``images_needed``: the most images
    one request of the selected cases carries. Returns the route whose connections must be checked
    (``guard``), None when there is nothing to check."""
    provider = provider_of(model)
    if provider in TEXT_ONLY_PROVIDERS:
        raise ModelUnsuitable(
            f"model {model}: the {provider!r} provider cannot take a chat with images; a CheXpercept "
            "case is a multi-turn conversation whose requests carry the X-ray and the contour images "
            f"(up to {images_needed} per request). Use a chat provider of a vision-language model "
            "(e.g. openai/<model> with --model-base-url, vllm/<model>)"
        )
    batch = getattr(config, "batch", None) or getattr(model.config, "batch", None)
    if batch and not declared:
        raise DataUseRefused(
            f"refusing --batch for {model}: a batch endpoint keeps every request, images included, "
            f"server side (an uploaded input file) until it is deleted. {AGREEMENT} "
            f"If this endpoint's batch service is covered, {VOUCH}; otherwise run without --batch"
        )
    limit = image_limit(model)
    if limit is not None and limit < images_needed:
        raise ModelUnsuitable(
            f"model {model}: its server allows {limit} image(s) per request (limit_mm_per_prompt) but "
            f"a CheXpercept request re-sends every image of its conversation: the selected cases need "
            f"up to {images_needed}. Pass -M limit_mm_per_prompt='{{\"image\": {images_needed}}}' (or "
            "leave it unset)"
        )
    if provider in IN_PROCESS_PROVIDERS:
        return None
    base_url = endpoint_of(model, provider)
    if not base_url:
        if provider in LOCAL_SERVER_PROVIDERS:
            return None  # Inspect starts the server on this machine (localhost)
        if declared:
            return None
        raise DataUseRefused(
            f"refusing to send {WHAT} to {model}: the {provider!r} provider sends them to its public "
            f"API. {AGREEMENT} {VOUCH}; or serve the model on this machine and pass "
            "--model-base-url http://127.0.0.1:PORT/v1"
        )
    host = urlsplit(base_url).hostname or ""
    if declared:
        return None
    if not is_loopback_host(host):
        raise DataUseRefused(
            f"refusing to send {WHAT} to {host or base_url}: it is not this machine (loopback). "
            f"{AGREEMENT} {VOUCH}"
        )
    proxy = environment_proxy(base_url)
    if proxy is not None:
        raise DataUseRefused(
            f"refusing to send {WHAT} to {base_url} through the proxy {proxy} that the environment "
            f"names for it (HTTP_PROXY, HTTPS_PROXY or ALL_PROXY): the proxy would receive them. Add "
            f"{host} to NO_PROXY, or, {VOUCH}"
        )
    return route(base_url, what=WHAT, declared=False, vouch=VOUCH)


#: the environment variable a provider that can start its own server reads an existing server's URL
#: from (Inspect's vllm and sglang providers)
SERVER_URL_VARIABLES = {"vllm": "VLLM_BASE_URL", "sglang": "SGLANG_BASE_URL"}


def endpoint_of(model: Any, provider: str) -> str | None:
    """The base URL ``model``'s requests will go to, however its provider keeps it before its first
    call: ``api.base_url``; else the URL a provider connects to lazily (Inspect's vllm provider
    leaves ``base_url`` None until its first request and keeps ``--model-base-url`` or a ``port``
    in ``_init_base_url``); else the provider's environment variable (``VLLM_BASE_URL``). None when
    there is none: such a provider starts its server on this machine. Until stop 43 only
    ``api.base_url`` was read, so ``vllm/`` with --model-base-url skipped every check (red team)."""
    api = getattr(model, "api", None)
    for attribute in ("base_url", "_init_base_url"):
        url = getattr(api, attribute, None)
        if url:
            return str(url)
    variable = SERVER_URL_VARIABLES.get(provider)
    return os.environ.get(variable) or None if variable else None


def image_limit(model: Any) -> int | None:
    """The images per request the model's server takes, where the provider says (Inspect's
    ``vllm`` provider: ``-M limit_mm_per_prompt=...``); None where it does not."""
    from chexpercept.eval.backends.vllm.limits import engine_image_limit
    from chexpercept.eval.protocol import BackendError
    from chexpercept.input_json import loads

    args = getattr(model.api, "server_args", None)
    if not isinstance(args, dict):
        return None
    value = args.get("limit_mm_per_prompt")
    try:
        if isinstance(value, str):
            value = loads(value, source="-M limit_mm_per_prompt")
        return engine_image_limit({**args, "limit_mm_per_prompt": value}, "-M limit_mm_per_prompt")
    except (ValueError, BackendError):  # not JSON, or a form vLLM would refuse: its server says so
        return None


async def guard(model: Any, r: Route) -> None:
    """Check the connections of ``model``'s provider to ``r``: one probe connection now (a refusal
    ends the case at once, before any request, with PeerRefused naming the socket's owner), and
    every new connection of its HTTP client from now on where it has one we can reach
    (OpenAI-compatible providers' ``http_client``; a refusal there fails that request, and Inspect
    may retry it, each retry refused alike)."""
    import httpx

    client = getattr(model.api, "http_client", None)
    if isinstance(client, httpx.AsyncClient) and not getattr(client, "_chexpercept_peer", False):
        client.event_hooks["request"].append(_checking_hook(r))
        client._chexpercept_peer = True  # type: ignore[attr-defined]
    await _probe(r)


def _checking_hook(r: Route) -> Any:
    """An httpx request hook that puts an httpcore trace on the request: each new TCP connection is
    checked (``peer.check_peer``) before a byte is sent, and closed when refused."""

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        if stream is None:
            return
        try:  # reading /proc/net/tcp{,6} off the event loop (Inspect's other samples go on)
            import anyio

            peer, ours = stream.get_extra_info("server_addr"), stream.get_extra_info("client_addr")
            await anyio.to_thread.run_sync(check_peer, r, peer, ours)
        except BaseException:
            await stream.aclose()
            raise

    async def hook(request: Any) -> None:
        chained = request.extensions.get("trace")

        async def both(name: str, info: dict[str, Any]) -> None:
            if chained is not None:
                await chained(name, info)
            await trace(name, info)

        request.extensions = {**request.extensions, "trace": both}

    return hook


async def _probe(r: Route) -> None:
    import anyio

    parts = urlsplit(r.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)

    def connect() -> None:
        try:
            with socket.create_connection((parts.hostname, port), timeout=10) as s:
                check_peer(r, s.getpeername(), s.getsockname())
        except PeerRefused:
            raise
        except OSError as e:
            raise ConnectionError(f"cannot connect to {r.url}: {e} (is the model's server running?)") from e

    await anyio.to_thread.run_sync(connect)


#: what servers say when a request carries images the model cannot take (vLLM, OpenAI, others)
_IMAGE_REJECTIONS = re.compile(
    r"at most \d+ image|image\(s\) may be provided|not a multimodal model|does not support (multimodal|image|vision)"
    r"|image_url is only supported|image input is not supported|images are not supported|too many images",
    re.IGNORECASE,
)


def explain_rejection(error: BaseException, *, key_id: str, task: str, images: int) -> str | None:
    """A clear message for a provider's error that rejects the images of a request, naming the
    case and the turn; None for any other error."""
    text = str(error)
    if not _IMAGE_REJECTIONS.search(text):
        return None
    return (
        f"case {key_id}, turn {task}: the model's server rejected the request's {images} image(s): "
        f"{shown(text.strip(), 500)}\nA CheXpercept request re-sends every image of its conversation so far; "
        "the model must take several images in one multi-turn chat (for vLLM: "
        "--limit-mm-per-prompt, or Inspect's -M limit_mm_per_prompt=...). A text-only model cannot "
        "run CheXpercept"
    )


@dataclass
class LogSettings:
    """What each running eval of our task keeps in its log, as Inspect's task-start hook saw it
    (``hooks.py``): eval id -> whether images are kept, and sample uuid -> eval id."""

    log_images: dict[str, bool]
    sample_eval: dict[str, str]

    def images_logged(self, sample_uuid: str) -> bool | None:
        """Whether the log of the eval running this sample keeps images; None when unknown."""
        eval_id = self.sample_eval.get(sample_uuid)
        return None if eval_id is None else self.log_images.get(eval_id)


SETTINGS = LogSettings(log_images={}, sample_eval={})


def check_log_images(sample_uuid: str) -> None:
    """Raise unless the log of this sample's eval leaves the images out (``--no-log-images``)."""
    logged = SETTINGS.images_logged(sample_uuid)
    if logged is False:
        return
    said = "keeps" if logged else "may keep (its settings could not be read)"
    raise DataUseRefused(
        f"refusing to run: Inspect's log {said} every image sent to the model, and CheXpercept images "
        "are credentialed data that must not be copied into logs (a log file is readable by whoever "
        "can read the log folder). Rerun with --no-log-images: the log still holds every message's "
        "text, and each image by its path in the release"
    )
