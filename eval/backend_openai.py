"""Any OpenAI-compatible chat endpoint (vLLM serve, Azure OpenAI v1, Gemini's OpenAI endpoint).

Requests of a step run concurrently (asyncio, at most ``concurrency`` in flight) over the standard
library's HTTP client, with retries and exponential backoff on 429, 5xx, timeouts and dropped
connections (honouring Retry-After). Token usage is read from each reply and priced with the
paper's price table (spec 3.10). Images go as data URLs, encoded once per file while a conversation
that shows it is live.

Data protection: the PhysioNet credentialed data use agreement forbids sending the data to ordinary
public APIs, so any endpoint that is not on this machine (loopback) is refused unless the user
states, with ``--dua-compliant-endpoint``, that it is covered (e.g. a deployment with human review
and data retention switched off, as PhysioNet's guidance on online services describes).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import mimetypes
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .protocol import BackendError, Request, Response, RunContext, Sampling
from .registry import ModelSpec

#: USD per 1M tokens: input, cached input, output (spec 3.10)
PRICES: dict[str, tuple[float, float, float]] = {
    "gemini-3.1-flash-lite-preview": (0.25, 0.025, 1.50),
    "gemini-3.1-pro-preview": (2.00, 0.20, 12.00),
    "gpt-5.4-nano": (0.20, 0.02, 1.25),
    "gpt-5.4-mini": (0.75, 0.075, 4.50),
    "gpt-5.4": (2.50, 0.25, 15.00),
}
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})

DUA_REFUSAL = (
    "refusing to send CheXpercept images to {host}: it is not this machine (loopback). "
    "The PhysioNet credentialed data use agreement forbids sending MIMIC-derived data to ordinary "
    "public APIs. If this endpoint is covered by an arrangement that the agreement allows (for "
    "example an Azure OpenAI or Vertex AI deployment with human review and data retention opted "
    "out), rerun with --dua-compliant-endpoint to say so."
)


def price_for(model_id: str) -> tuple[float, float, float] | None:
    """The longest price-table key contained in the lower-cased model id (spec 3.10)."""
    name = model_id.lower()
    keys = [k for k in PRICES if k in name]
    return PRICES[max(keys, key=len)] if keys else None


def call_cost(model_id: str, input_tokens: int, cached_tokens: int, output_tokens: int) -> float:
    price = price_for(model_id)
    if price is None:
        return 0.0
    p_in, p_cached, p_out = price
    return ((input_tokens - cached_tokens) * p_in + cached_tokens * p_cached + output_tokens * p_out) / 1e6


def is_loopback(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(base_url: str, *, dua_compliant: bool) -> None:
    """Raise unless the endpoint is loopback or the user vouched for it."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"--base-url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}"
        )
    if not dua_compliant and not is_loopback(base_url):
        raise PermissionError(DUA_REFUSAL.format(host=parts.hostname))


def read_usage(usage: dict[str, Any] | None) -> dict[str, int]:
    """OpenAI usage fields -> input/cached/output/thinking/total tokens (spec 3.10)."""
    usage = usage or {}
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0),
        "cached_input_tokens": int(prompt_details.get("cached_tokens") or 0),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "thinking_tokens": int(completion_details.get("reasoning_tokens") or 0),
        "total_tokens": int(usage.get("total_tokens") or 0),
    }


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class RetryPolicy:
    max_retries: int = 6
    #: first wait in seconds; doubles per retry up to max_delay, with +-25% jitter
    base_delay: float = 2.0
    max_delay: float = 120.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        wait = min(self.base_delay * 2**attempt, self.max_delay)
        return wait * random.uniform(0.75, 1.25)


class OpenAIBackend:
    name = "openai"
    default_batch_size = 64

    def __init__(
        self,
        spec: ModelSpec,
        *,
        sampling: Sampling,
        base_url: str,
        api_key: str | None = None,
        api_key_header: str = "Authorization",
        dua_compliant_endpoint: bool = False,
        concurrency: int = 8,
        timeout: float = 600.0,
        retry: RetryPolicy | None = None,
        extra_body: dict[str, Any] | None = None,
        on_error: str = "stop",
    ):
        check_endpoint(base_url, dua_compliant=dua_compliant_endpoint)
        if concurrency < 1:
            raise ValueError(f"--concurrency must be at least 1, got {concurrency}")
        if on_error not in ("stop", "record"):
            raise ValueError(f"on_error must be 'stop' or 'record', got {on_error!r}")
        self.spec = spec
        self._sampling = sampling
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.api_key_header = api_key_header
        self.concurrency = concurrency
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.extra_body = dict(spec.api_extra) | dict(extra_body or {})
        self.on_error = on_error
        self.root = ""
        self._data_urls: dict[str, str] = {}
        self.retries = 0

    def setup(self, context: RunContext) -> None:
        self.root = str(context.root)

    # ------------------------------------------------------------------ payload
    def data_url(self, relative: str) -> str:
        url = self._data_urls.get(relative)
        if url is None:
            mime = mimetypes.guess_type(relative)[0] or "image/png"
            with open(os.path.join(self.root, relative), "rb") as f:
                url = f"data:{mime};base64," + base64.b64encode(f.read()).decode("ascii")
            self._data_urls[relative] = url
        return url

    def build_payload(self, request: Request) -> dict[str, Any]:
        messages = request.openai_messages(self.data_url)
        s = self._sampling
        payload: dict[str, Any] = {
            "model": self.spec.model_id,
            "messages": messages,
            "max_completion_tokens": s.max_tokens,
            "temperature": s.temperature,
        }
        if s.top_p != 1.0:  # reasoning models reject top_p; 1.0 is every API's default anyway
            payload["top_p"] = s.top_p
        payload.update(self.extra_body)
        return payload

    # ------------------------------------------------------------------ HTTP
    def _post(self, body: bytes) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            value = (
                f"Bearer {self.api_key}" if self.api_key_header.lower() == "authorization" else self.api_key
            )
            headers[self.api_key_header] = value
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as reply:
                return json.loads(reply.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:500]
            if e.code in RETRY_STATUS:
                after = e.headers.get("Retry-After") if e.headers else None
                try:
                    retry_after = float(after) if after is not None else None
                except ValueError:
                    retry_after = None
                raise _Retryable(f"HTTP {e.code}: {detail}", retry_after) from e
            raise BackendError(f"HTTP {e.code} from {self.url}: {detail}") from e
        except (TimeoutError, ConnectionError) as e:
            raise _Retryable(f"{type(e).__name__}: {e}") from e
        except urllib.error.URLError as e:
            raise _Retryable(f"cannot reach {self.url}: {e.reason}") from e
        except ValueError as e:
            raise BackendError(f"{self.url} did not return JSON: {e}") from e

    async def _one(self, request: Request, gate: asyncio.Semaphore) -> Response:
        body = json.dumps(self.build_payload(request)).encode("utf-8")
        where = f"{request.key_id} ({request.task})"
        attempt = 0
        while True:
            try:
                async with gate:
                    started = time.perf_counter()
                    reply = await asyncio.to_thread(self._post, body)
                break
            except _Retryable as e:
                if attempt >= self.retry.max_retries:
                    return self._failed(where, f"gave up after {attempt + 1} attempts: {e}")
                await asyncio.sleep(self.retry.delay(attempt, e.retry_after))
                attempt += 1
                self.retries += 1
            except BackendError as e:
                return self._failed(where, str(e))
        return self._response(where, reply, attempts=attempt + 1, seconds=time.perf_counter() - started)

    def _failed(self, where: str, message: str) -> Response:
        if self.on_error == "stop":
            raise BackendError(
                f"{where}: {message}. Finished cases are saved; rerun the same command to resume "
                "(or pass --on-error record to score failed turns as unanswered and go on)."
            )
        return Response("", {}, error=message)

    def _response(self, where: str, reply: dict[str, Any], *, attempts: int, seconds: float) -> Response:
        choices = reply.get("choices") or []
        if not choices:
            return self._failed(where, f"reply has no choices: {json.dumps(reply)[:300]}")
        message = choices[0].get("message") or {}
        text = message.get("content")
        if isinstance(text, list):  # some servers return content parts
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        usage: dict[str, Any] = read_usage(reply.get("usage"))
        usage["cost_usd"] = call_cost(
            self.spec.model_id, usage["input_tokens"], usage["cached_input_tokens"], usage["output_tokens"]
        )
        usage["attempts"] = attempts
        usage["seconds"] = round(seconds, 3)
        if choices[0].get("finish_reason"):
            usage["finish_reason"] = choices[0]["finish_reason"]
        # a refusal or an empty reply (safety filter, token cap) is an answer: unparsed, so wrong
        return Response(text if isinstance(text, str) else "", usage)

    async def _all(self, requests: Sequence[Request]) -> list[Response]:
        gate = asyncio.Semaphore(self.concurrency)
        return list(await asyncio.gather(*(self._one(r, gate) for r in requests)))

    def generate(self, requests: Sequence[Request]) -> list[Response]:
        responses = asyncio.run(self._all(requests))
        used = {p for r in requests for p in r.images}
        self._data_urls = {p: u for p, u in self._data_urls.items() if p in used}
        return responses

    def sampling(self) -> Sampling:
        return self._sampling

    def describe(self) -> dict[str, Any]:
        return {
            "base_url": self.url.rsplit("/chat/completions", 1)[0],
            "model_id": self.spec.model_id,
            "extra_body": self.extra_body,
            "concurrency": self.concurrency,
            "max_retries": self.retry.max_retries,
            "price_per_1m_tokens": price_for(self.spec.model_id),
        }

    def close(self) -> None:
        self._data_urls.clear()
