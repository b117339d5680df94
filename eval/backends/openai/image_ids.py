"""Images sent by id to a vLLM server: a later turn names an image the server holds instead of
carrying its pixels again.

Every request of a conversation carries its whole history, so each turn re-sends every image of the
conversation so far (as a ``data:`` URL, about 1 MiB for a 1024x1024 PNG X-ray): 3 MiB per request
on average over the release's conversations, and the client's cost per request is the cost of those
bytes. vLLM's OpenAI-compatible server keeps processed images in its multimodal processor cache keyed
by the content part's ``uuid`` and takes ``{"type": "image_url", "image_url": null, "uuid": ID}`` for
an image it holds (vLLM >= 0.11; ``docs/features/multimodal_inputs.md``, "multi_modal_uuids"). So:

- each image part that carries pixels also carries its id (``uuid``);
- once a request that carried an image's pixels has been answered, the image's later turns send its
  id alone;
- a server that no longer holds it (its cache let it go, or it restarted) refuses the request
  ("Cache miss for image at index N but data is not provided", or the engine's "not in the receiver
  (P1) cache"): the request is sent again with every image's pixels, at once and without counting as
  a retry. The answer is the one the pixels give either way: the server uses the same processed
  image.

An id is drawn at random (128 bits) when an image is first sent with its pixels and names exactly
the pixels sent with it: the image keeps it while its conversation is live, and draws a new one when
it must be sent again (after a cache miss), so that an id never stands for two versions of a file.
No other client of the server can guess an id (and so cannot put other pixels in the cache under
it), and nothing is hashed. Whether the server is vLLM is read once from ``GET /v1/models``
(``owned_by: "vllm"``) and ``GET /version`` (at least ``MIN_VLLM``, the first vLLM that takes an
image by its id alone); a server that does not say (``unsaid``) is asked again, and one that never
says stops the run (what is sent depends on it). ``--image-ids on`` sends ids whatever the answer,
``off`` never sends an id. A server
that refuses a part without its pixels all the same (a 400 or 422 about ``image_url`` or ``uuid``: a
proxy or a fork that calls itself vLLM) gets the request again with every image's pixels, and no id
for the rest of the run, with one note saying so. A server that takes such a part without error but
does not use the image it names cannot be told from vLLM by a client: ``--image-ids off`` for those.
"""

from __future__ import annotations

import re
import secrets
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from chexpercept.escape import terminal
from chexpercept.input_json import JsonInputError, loads
from chexpercept.redaction import redact_text

#: --image-ids: ask the server (auto), always, never
MODES = ("auto", "on", "off")
#: what vLLM answers when a request names by id an image it does not hold (the frontend's
#: processor cache, or the engine's after the two drifted apart)
CACHE_MISS_MARKERS = ("Cache miss for image", "not in the receiver (P1) cache")
#: bytes of the /models and /version replies read at most
MODELS_REPLY_LIMIT = 16 << 20
#: seconds one asking may take; a server that has not answered within them is asked again
ASK_SECONDS = 10.0
#: times a server is asked what it is, and the seconds waited before each later time: before a
#: run, and in the middle of one after a sign that it may have restarted (a busy server's /models
#: may fail a while, as its requests may: waited out over minutes)
ASK_WAITS = (0.0, 1.0, 3.0)
RECHECK_WAITS = (0.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0)
#: the 4xx statuses of ``GET /v1/models`` that say nothing of what the server is (it may answer
#: otherwise in a moment; a key refused there alone): asked again, as are redirects and the 5xx but 501
UNSAID_STATUSES = frozenset({401, 403, 408, 425, 429})


def unsaid(status: int) -> bool:
    """Whether an HTTP status of ``GET /v1/models`` leaves what the server is unknown: a server busy
    or failing now, a proxy's timeout, a redirect (never followed), a key refused there alone (401,
    403: the same key is sent to both). 404, 405, 501 and the other 4xx say it serves no listing,
    which every vLLM does: no vLLM."""
    return status in UNSAID_STATUSES or 300 <= status < 400 or (status >= 500 and status != 501)


def is_listing(models_reply: bytes) -> bool:
    """Whether a ``GET /v1/models`` reply of status 200 is a model listing (a JSON object whose
    ``data`` is a list): anything else (a proxy's HTML page, an empty body) says nothing."""
    listing = _json(models_reply, "the server's /models")
    return isinstance(listing, dict) and isinstance(listing.get("data"), list)


#: the first vLLM whose OpenAI-compatible server takes an image part by its uuid alone
MIN_VLLM = (0, 11)


def is_cache_miss(status: int, text: str) -> bool:
    """Whether an error reply says that an image named by id is not held by the server."""
    return status >= 400 and any(marker in text for marker in CACHE_MISS_MARKERS)


def refuses_ids(status: int, text: str) -> bool:
    """Whether an error reply to a request that named images by id refuses the form itself (a
    server that is not the vLLM it says it is, or one older than ``MIN_VLLM``)."""
    return (
        status in (400, 422) and ("image_url" in text or "uuid" in text) and not is_cache_miss(status, text)
    )


def _json(reply: bytes, source: str) -> Any:
    """The reply's JSON (bounded in size and depth: chexpercept.input_json), None if it is not."""
    if len(reply) > MODELS_REPLY_LIMIT:
        return None
    try:
        return loads(reply, source=source)
    except JsonInputError:
        return None


def _models(models_reply: bytes) -> list[dict[str, Any]]:
    """The entries (objects) a ``GET /v1/models`` reply lists under ``data``; none where it is not one."""
    listing = _json(models_reply, "the server's /models")
    data = listing.get("data") if isinstance(listing, dict) else None
    return [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []


def says_vllm(models_reply: bytes, model_id: str | None = None) -> bool:
    """Whether a ``GET /v1/models`` reply says that vLLM serves ``model_id``: its entry says
    ``owned_by: "vllm"``, or, where it lists no entry of that id, every entry does (a ``vllm
    serve``). Behind a router that serves several kinds, another model's vLLM entry made an
    OpenAI model get vLLM's fields (red team, stop 44)."""
    entries = _models(models_reply)
    own = [c for c in entries if model_id is not None and c.get("id") == model_id]
    return bool(own or entries) and all(c.get("owned_by") == "vllm" for c in (own or entries))


@dataclass(frozen=True)
class ServerSays:
    """What a server said it is (``GET /v1/models``, ``GET /version``), asked once before a run."""

    #: it says it is vLLM (``owned_by: "vllm"``)
    vllm: bool
    #: why it is sent no image by id (not vLLM, too old, not asked), or None
    why_no_ids: str | None
    #: what it loaded the model from (vLLM's ``root``: the path or Hub id given to ``vllm serve``),
    #: None where it does not say
    root: str | None = None


def served_root(models_reply: bytes, model_id: str) -> str | None:
    """The ``root`` that a ``GET /v1/models`` reply gives for the model ``model_id`` (vLLM: where the
    served model was loaded from), redacted (a URL's token: it goes into run.json) and bounded to
    4,096 characters; None where there is none."""
    for entry in _models(models_reply):
        if entry.get("id") == model_id:
            root = entry.get("root")
            return redact_text(root)[:4096] if isinstance(root, str) and root else None
    return None


def why_not_vllm(models_reply: bytes, version_reply: bytes, model_id: str | None = None) -> str | None:
    """Why a server whose ``GET /v1/models`` and ``GET /version`` gave these replies is not sent
    ids for ``model_id`` (not vLLM, or a vLLM older than ``MIN_VLLM``); None when it is."""
    if not says_vllm(models_reply, model_id):
        return "the server's /models does not say vLLM"
    answer = _json(version_reply, "the server's /version")
    version = answer.get("version") if isinstance(answer, dict) else None
    m = re.match(r"(\d+)\.(\d+)", version) if isinstance(version, str) else None
    if m is None:
        return "the server says vLLM but gives no version at /version"
    if (int(m.group(1)), int(m.group(2))) < MIN_VLLM:
        return f"vLLM {terminal(version)[:40]} takes no image by id (vLLM {MIN_VLLM[0]}.{MIN_VLLM[1]} or later does)"
    return None


#: the sampling fields a vLLM server fills from the model's generation config (``generation_config.json``:
#: Qwen2.5-VL's repetition_penalty 1.05, Gemma 3's top_k 64) when a request leaves them out
#: (vllm/entrypoints/openai/chat_completion/protocol.py: ``to_sampling_params``), at the values vLLM's
#: offline engine takes when they are not given (``SamplingParams``: none of them applied; top_k -1,
#: "disabled", which every vLLM takes). Sent to a server that says it is vLLM, unless the request's
#: fields set them, so that its decoding is the one run.json records, as the vllm backend's is.
VLLM_NEUTRAL_SAMPLING: dict[str, float | int] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "top_k": -1,
    "min_p": 0.0,
}


class ImageIds:
    """The ids of a run's images and which of them the server holds (thread-safe: request bodies
    are built on worker threads, replies arrive on the event loop)."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"image ids must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        #: None until the server was asked (auto); then whether ids are sent
        self.on: bool | None = None if mode == "auto" else mode == "on"
        #: why ids are not sent (auto: what the server said; a server that refused them)
        self.off_because: str | None = "--image-ids off" if mode == "off" else None
        self._lock = threading.Lock()
        self._ids: dict[str, str] = {}
        self._held: set[str] = set()
        #: image parts sent by id alone / with their pixels; requests sent again after a miss
        self.parts_by_id = 0
        self.parts_with_pixels = 0
        self.resent = 0

    def id_of(self, relative: str) -> str:
        """The id of the image sent with its pixels: its id while its conversation is live, drawn at
        its first sending (or its first after a cache miss)."""
        with self._lock:
            image_id = self._ids.get(relative)
            if image_id is None:
                image_id = self._ids[relative] = "chexpercept-" + secrets.token_hex(16)
            return image_id

    def held(self, images: Iterable[str]) -> dict[str, str]:
        """Of ``images``, those the server holds: relative path -> id (none while ids are off)."""
        if not self.on:
            return {}
        with self._lock:
            return {r: self._ids[r] for r in images if r in self._held and r in self._ids}

    def count(self, *, by_id: int, with_pixels: int) -> None:
        with self._lock:
            self.parts_by_id += by_id
            self.parts_with_pixels += with_pixels

    def answered(self, carried: Iterable[str]) -> None:
        """A request that carried these images' pixels (with their ids) was answered: the server
        holds them now."""
        if self.on:
            with self._lock:
                self._held.update(r for r in carried if r in self._ids)

    def missed(self, images: Iterable[str]) -> None:
        """The server said it does not hold some of these: each is sent again with its pixels,
        under a new id (the file may have changed since its id was drawn)."""
        with self._lock:
            for relative in images:
                self._held.discard(relative)
                self._ids.pop(relative, None)
            self.resent += 1

    def decided(self, why_not: str | None) -> None:
        """The server was asked (auto): ids are on unless ``why_not``."""
        self.on, self.off_because = why_not is None, why_not

    def refused(self, reason: str) -> None:
        """The server refused an image part without its pixels: no id for the rest of the run (a
        note on stderr, once)."""
        with self._lock:
            if not self.on:
                return
            self.on, self.off_because = False, f"the server refused an image by id ({reason})"
            self.resent += 1
        print(
            f"note: {self.off_because}; every image goes with its pixels from now on "
            "(--image-ids off says so from the start)",
            file=sys.stderr,
        )

    def release(self, prefixes: tuple[str, ...]) -> None:
        """Forget the images of ended conversations (paths starting with one of ``prefixes``)."""
        with self._lock:
            self._ids = {r: i for r, i in self._ids.items() if not r.startswith(prefixes)}
            self._held = {r for r in self._held if not r.startswith(prefixes)}

    def record(self) -> dict[str, Any]:
        """run.json's ``image_ids`` (what was sent how)."""
        return {
            "mode": self.mode,
            "used": self.parts_by_id > 0 or bool(self.on),
            "off_because": self.off_because,
            "image_parts_by_id": self.parts_by_id,
            "image_parts_with_pixels": self.parts_with_pixels,
            "requests_resent_after_a_cache_miss": self.resent,
        }
