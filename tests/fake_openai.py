"""A loopback OpenAI-compatible server for the openai backend's tests, and helpers around it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

from local_http import LocalServer

from chexpercept.eval.backends.openai.backend import OpenAIBackend, RetryPolicy
from chexpercept.eval.engine import run_conversations
from chexpercept.eval.protocol import RunContext, Sampling
from chexpercept.eval.registry import resolve

USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 50,
    "total_tokens": 1050,
    "prompt_tokens_details": {"cached_tokens": 200},
    "completion_tokens_details": {"reasoning_tokens": 30},
}
FAST = RetryPolicy(max_retries=3, base_delay=0.01, max_delay=0.05)


class RealisticUsage:
    """Usage as a GPT-5-family API reports it, counted on the server's side of the wire: words and
    punctuation as text tokens plus 4 per message and 3 for the reply, each image by its PNG header's
    size (fitted into 2048, shorter side 768, 512-px tiles: 70 + 140 per tile), and as cached the
    longest prefix of whole messages this server has already seen, from 1,024 tokens on in steps of
    128 (OpenAI's prompt caching). Replies cost 40 visible plus ``reasoning`` tokens."""

    def __init__(self, reasoning: int = 200):
        import re

        self.words = re.compile(r"\w+|[^\w\s]")
        self.reasoning = reasoning
        self.seen: set[str] = set()

    @staticmethod
    def _image_tokens(url: str) -> int:
        import base64
        import math
        import struct

        png = base64.b64decode(url.split(",", 1)[1][:64] + "==")[:24]
        width, height = struct.unpack(">II", png[16:24])
        scale = min(1.0, 2048 / max(width, height))
        w, h = width * scale, height * scale
        w, h = w * 768 / min(w, h), h * 768 / min(w, h)
        return 70 + 140 * math.ceil(w / 512) * math.ceil(h / 512)

    def _message_tokens(self, message: dict) -> int:
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        tokens = 4
        for part in parts:
            if part["type"] == "text":
                tokens += len(self.words.findall(part["text"]))
            else:
                tokens += self._image_tokens(part["image_url"]["url"])
        return tokens

    def __call__(self, body: dict) -> dict:
        messages = body["messages"]
        sizes = [self._message_tokens(m) for m in messages]
        prompt = sum(sizes) + 3
        cached = 0
        for n in range(len(messages), 0, -1):
            if json.dumps(messages[:n], sort_keys=True) in self.seen:
                cached = sum(sizes[:n])
                break
        for n in range(1, len(messages) + 1):
            self.seen.add(json.dumps(messages[:n], sort_keys=True))
        cached = 0 if cached < 1024 else cached - cached % 128
        completion = 40 + self.reasoning
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        }


def _named_by_id(body):
    """Whether a request names an image by its id alone (no pixels)."""
    return any(
        p.get("type") == "image_url" and p.get("image_url") is None
        for m in body["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
    )


#: vLLM's refusal of an image named by id that it does not hold
CACHE_MISS = "Cache miss for image at index 0 but data is not provided."


class FakeServer:
    """Answers chat completions; ``failures`` is a list of what to do to the next requests first:
    an HTTP status (sent with ``Retry-After: 0``), ``"sleep"`` (answer after a second), or a dict
    with ``status``, ``headers`` and ``body`` (an error reply), ``message`` (a 200 reply with that
    message, and ``finish_reason``) or ``raw`` (these bytes as the body of a 200 reply, or of ``status``, announced as
    ``content_length`` bytes). ``times`` holds when each request arrived.

    ``vllm=True``: it says it is vLLM (``GET /v1/models``: ``owned_by: "vllm"``) and keeps the images
    it was sent with a ``uuid`` as vLLM's processor cache does: a part that names an id alone is
    answered as if it carried that image; an id it does not hold is refused with vLLM's words
    ("Cache miss for image at index N but data is not provided."). ``forget()`` empties that cache.
    ``requests`` keeps each body as sent; replies are computed from the body with every image
    resolved.

    ``local_media``: a folder whose images the server reads itself when a request names them by a
    ``file://`` URL, as ``vllm serve --allowed-local-media-path`` does (the reply is computed as if
    the image had come as its data URL); without it such a request is refused with vLLM's words (a
    500), and a file outside it too (a 400)."""

    def __init__(
        self,
        failures=(),
        delay=0.0,
        usage=None,
        reply=None,
        vllm=False,
        vllm_version="0.32.0",
        local_media=None,
        keep_alive=False,
    ):
        self.failures = list(failures)
        self.local_media = local_media
        #: None: every reply is "Answer: 1"; a callable: the reply's text for a request body
        #: (e.g. ``scripted_reply``: the same answer for the same conversation, whoever sends it)
        self.reply = reply
        #: None: the fixed USAGE; a callable (e.g. RealisticUsage()) computes it from the request body
        #: (a callable that returns None: the reply has no ``usage`` at all)
        self.usage = usage
        self.delay = delay
        #: the model every reply names (an alias's snapshot); None: the model asked for
        #: the model each reply names (None: the one asked for; "": none)
        self.served: str | None = None
        self.requests: list[dict] = []
        self.times: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.vllm = vllm
        #: what GET /version says (vllm=True); None: no /version
        self.vllm_version = vllm_version
        #: GET /models's reply sent in two pieces, a moment apart (as behind a proxy)
        self.split_models = False
        #: image parts without pixels refused as vLLM before 0.11 refuses them (a 400 naming image_url)
        self.refuse_ids = False
        #: the models GET /models lists besides "m": served name -> root (where vLLM loaded it from)
        self.roots: dict[str, str] = {}
        #: the ``owned_by`` of each GET /models reply in turn before the first POST, before ``vllm``'s
        #: (a balancer in front of several servers); ``models_asked`` counts the GET /models,
        #: ``models_before`` those before the first POST
        self.owners: list[str] = []
        self.models_asked = 0
        self.models_before = 0
        #: the status of each GET /models reply in turn before 200s (an error body with it), and
        #: seconds each GET /models waits before its reply
        self.models_status: list[int] = []
        self.models_delay = 0.0
        #: the body of each 200 GET /models reply in turn, before the listing (bytes as sent)
        self.models_bodies: list[bytes] = []
        #: uuid -> image URL (vllm=True)
        self.held: dict[str, str] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.endswith("/models"):
                    with server.lock:
                        server.models_asked += 1
                        server.models_before += not server.requests
                        status = server.models_status.pop(0) if server.models_status else 200
                    time.sleep(server.models_delay)
                    if status != 200:
                        self.send_error(status)
                        return
                    with server.lock:
                        body = server.models_bodies.pop(0) if server.models_bodies else None
                    if body is not None:
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    with server.lock:
                        owner = server.owners.pop(0) if server.owners and not server.requests else None
                    owner = owner or ("vllm" if server.vllm else "organization-owner")
                    listed = [{"id": "m", "owned_by": owner}]
                    listed += [{"id": k, "owned_by": owner, "root": v} for k, v in server.roots.items()]
                    reply = {"object": "list", "data": listed}
                elif self.path == "/version" and server.vllm and server.vllm_version:
                    reply = {"version": server.vllm_version}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if server.split_models:
                    self.wfile.write(data[:10])
                    self.wfile.flush()
                    time.sleep(0.2)
                    data = data[10:]
                self.wfile.write(data)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                sent = json.loads(raw)
                with server.lock:
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": sent, "raw": raw}
                    )
                    server.times.append(time.monotonic())
                    action = server.failures.pop(0) if server.failures else "ok"
                    body, refused = server.read_files(sent)
                    if refused is None and server.vllm:
                        body = server.resolve(body)
                    if refused is not None:
                        action, body = refused, sent
                    elif server.refuse_ids and _named_by_id(sent):
                        message = "1 validation error: messages.1.content.1.image_url: Input should be a valid dictionary"
                        action = {"status": 400, "body": {"error": {"message": message, "code": 400}}}
                        body = sent
                    elif body is None:
                        action = {"status": 400, "body": {"error": {"message": CACHE_MISS, "code": 400}}}
                        body = sent
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    time.sleep(server.delay)
                    if action == "sleep":
                        time.sleep(1.0)
                    status, headers, data = self.reply_for(action, body)
                finally:
                    # no longer in flight once the reply is ready: the client may send its next
                    # request as soon as it has read this one
                    with server.lock:
                        server.in_flight -= 1
                if "Date" in headers:  # the server's clock as the test sets it (not this machine's)
                    self.log_request(status)
                    self.send_response_only(status)
                else:
                    self.send_response(status)  # with Date: now
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                every = action.get("trickle") if isinstance(action, dict) else None
                if every:  # one byte at a time, every `trickle` seconds
                    for i in range(len(data)):
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                        time.sleep(every)
                    return
                self.wfile.write(data)

            def reply_for(self, action, body):
                """(status, headers, body bytes) of the reply ``action`` asks for."""
                if isinstance(action, int):
                    action = {
                        "status": action,
                        "headers": {"Retry-After": "0"},
                        "body": {"error": "try later"},
                    }
                if isinstance(action, dict) and "raw" in action:  # bytes as they are, e.g. cut off
                    data = action["raw"]
                    headers = {"Content-Type": action.get("content_type", "application/json")}
                    headers.update(action.get("headers", {}))
                    length = action.get("content_length", len(data))
                    if length is not None:  # None: a close-delimited body (HTTP/1.0, no length)
                        headers["Content-Length"] = str(length)
                    return action.get("status", 200), headers, data
                if isinstance(action, dict) and "events" in action:  # a streamed (SSE) reply
                    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in action["events"]]
                    if action.get("done", True):
                        lines.append("data: [DONE]\n\n")
                    data = "".join(lines).encode()
                    return 200, {"Content-Type": "text/event-stream"}, data
                if isinstance(action, dict) and "status" in action:
                    return (
                        action["status"],
                        action.get("headers", {}),
                        json.dumps(action.get("body", {})).encode(),
                    )
                message = {"content": server.reply(body) if server.reply else "Answer: 1"}
                finish = "stop"
                if isinstance(action, dict) and "message" in action:
                    message = action["message"]
                    finish = action.get("finish_reason", finish)
                if server.usage is None:
                    usage = USAGE
                else:
                    with server.lock:
                        usage = server.usage(body)
                reply: dict = {"choices": [{"message": message, "finish_reason": finish}]}
                if usage is not None:
                    reply["usage"] = usage
                if isinstance(action, dict) and "model" in action:
                    reply["model"] = action["model"]
                elif server.served != "":  # "": the reply names no model (a server that does not say)
                    reply["model"] = server.served or body.get("model")
                data = json.dumps(reply).encode()
                return 200, {"Content-Type": "application/json", "Content-Length": str(len(data))}, data

        if keep_alive:  # connections kept open between requests (HTTP/1.1), as vllm serve keeps them
            Handler.protocol_version = "HTTP/1.1"
        self.httpd = LocalServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def resolve(self, body):
        """``body`` with each image named by id replaced by the image it names (None: an id not
        held); images sent with an id are held from now on (called under ``lock``)."""

        def named(p):
            uuid, url = p.get("uuid"), (p.get("image_url") or {}).get("url")
            if url is None:
                if uuid not in self.held:
                    raise _Refused(None)
                url = self.held[uuid]
            elif uuid is not None:
                self.held[uuid] = url
            return {"type": "image_url", "image_url": {"url": url}}

        try:
            return _with_image_parts(body, named)
        except _Refused:
            return None

    def read_files(self, body):
        """(``body`` with each ``file://`` image URL read as the server reads it, as its data URL;
        the refusal vLLM sends instead, or None)."""
        from pathlib import Path
        from urllib.parse import unquote, urlsplit

        from chexpercept.containment import image_data_url

        def read(p):
            url = (p.get("image_url") or {}).get("url")
            if url is None or not url.startswith("file:"):
                return p
            if self.local_media is None:
                message = "Cannot load local files without `--allowed-local-media-path`."
                raise _Refused({"status": 500, "body": {"error": {"message": message, "code": 500}}})
            path, allowed = Path(unquote(urlsplit(url).path)).resolve(), Path(self.local_media).resolve()
            if allowed not in path.parents:
                message = "The file path <path> must be a subpath of `--allowed-local-media-path <path>`."
                raise _Refused({"status": 400, "body": {"error": {"message": message, "code": 400}}})
            return {**p, "image_url": {"url": image_data_url(allowed, str(path.relative_to(allowed)))}}

        try:
            return _with_image_parts(body, read), None
        except _Refused as e:
            return body, e.reply

    def forget(self):
        with self.lock:
            self.held.clear()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class _Refused(Exception):
    """A request the fake server refuses; ``reply``: its error reply."""

    def __init__(self, reply):
        super().__init__(reply)
        self.reply = reply


def _with_image_parts(body: dict, change) -> dict:
    """``body`` with each image part of its messages replaced by ``change(part)``."""
    messages = []
    for m in body["messages"]:
        content = m["content"]
        if isinstance(content, list):
            content = [change(p) if p.get("type") == "image_url" else p for p in content]
        messages.append({**m, "content": content})
    return {**body, "messages": messages}


def conversation_of(body: dict) -> list[tuple[str, str, tuple[str, ...]]]:
    """A chat request's conversation as (role, text, image URLs) per message, whatever the wire
    form (a string or text parts; ``detail`` or not): what two clients must send alike."""
    out = []
    for m in body["messages"]:
        content = m["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        text = "".join(p["text"] for p in parts if p["type"] == "text")
        images = tuple(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        out.append((m["role"], text, images))
    return out


#: what scripted_reply answers with: options, several, None, an unreadable reply
SCRIPTED_ANSWERS = ("Answer: 1", "Answer: 2", "Answer: 3", "Answer: 1,3", "Answer: None", "I cannot tell.")


def scripted_reply(body: dict) -> str:
    """A reply that depends on the whole conversation only (texts and images, as
    ``conversation_of`` reads them), so two clients that send the same conversations get the same
    answers case for case, in any order."""
    import hashlib

    digest = hashlib.sha256(json.dumps(conversation_of(body)).encode()).digest()
    return SCRIPTED_ANSWERS[digest[0] % len(SCRIPTED_ANSWERS)]


def backend_for(server, model="gpt-5.4", **kwargs):
    spec = resolve(model)
    sampling = Sampling(**spec.sampling, greedy=spec.sampling["temperature"] == 0)
    kwargs.setdefault("retry", FAST)
    return OpenAIBackend(spec, sampling=sampling, base_url=server.url, **kwargs)


def run_cases(backend, bundle, batch_size=64):
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    results = []
    run_conversations(
        bundle.cases, backend, oracle="implicit", batch_size=batch_size, on_finished=results.extend
    )
    return results
