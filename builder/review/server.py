"""The review server: the standard library's ``ThreadingHTTPServer`` on 127.0.0.1 only, behind
per-annotator credentials (``access``).

Routes, every one of an annotator's under ``/annotate/<A>`` and open only with A's cookie:

* ``/annotate/<A>?token=<token>``: checks the token, sets A's cookie, redirects to the page;
* ``/annotate/<A>/`` (the page), ``/annotate/<A>/api/cases`` (A's queue and decisions),
  ``POST /annotate/<A>/api/decision``, ``/annotate/<A>/image/<key_id>/{cxr,overlay}`` (A's cases only);
* ``/static/<file>``: the page's JS and CSS, shipped in the package (nothing comes from the internet);
* ``/``: a page that says where the links are (no data).

Requests whose ``Host`` header is not this loopback address are refused (DNS rebinding), a POST from
another origin is refused, and every page carries a Content-Security-Policy that allows this origin
only. Each request, its wait, request line, headers and body together, must arrive within
``CONNECTION_TIMEOUT`` (a deadline for the whole request, however slowly its bytes trickle), or the
connection is closed. Connections are admitted by ``admission.Admission``: at most
``MAX_CONNECTIONS`` at once, of which at most ``MAX_PENDING`` not yet signed in, and at most
``MAX_PEER_PENDING`` of those from one local account, so another account's slow or many connections
never take the annotators' places (more get 503 at once). A malformed request gets a 4xx answer with a
JSON ``error`` naming the field, never a dropped connection.

The CXR is served as the pipeline decodes it (``sources.load_cxr``: no EXIF rotation, scaled to the
1024 x 1024 frame the overlay is drawn in) and re-encoded as a PNG without metadata, so the browser
shows the pixels the mask was drawn on.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path as FsPath
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from chexpercept.containment import ContainmentError, Tree, is_inside
from chexpercept.input_files import IMAGE, InputFileError, read_input
from chexpercept.input_json import JsonInputError, loads
from chexpercept.os_errors import explain_os_error

from ..render import encode_png
from ..sources import CaseInputError, SourceError, load_cxr
from .access import Access, annotator_path, cookie_name, restrict_folder, set_cookie
from .admission import Admission, peer_of
from .manifest import load_manifest
from .store import DECISIONS, DecisionStore, StoreError

LOOPBACK = "127.0.0.1"
MAX_BODY = 64 * 1024
#: longest note a decision may carry (characters); the page counts and refuses before sending
MAX_NOTE = 10_000
MAX_CLIENT_ID = 80
#: seconds a request may take to arrive whole (the wait for it, its headers and its body); after
#: that its connection is closed
CONNECTION_TIMEOUT = 30.0
#: connections served at once; more are answered 503 and closed
MAX_CONNECTIONS = 64
#: of those, connections not yet signed in (the rest stay free for annotators at work)
MAX_PENDING = 32
#: connections not yet signed in from one local account (admission.py)
MAX_PEER_PENDING = 8
CSP = (
    "default-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC_FILES = ("review.html", "review.js", "review.css")
_DECISION_FIELDS = {"key_id", "decision", "note", "client_id", "client_time"}


class ReviewServerError(Exception):
    """The server cannot start as asked (a non-loopback address, a port in use)."""


class RequestError(Exception):
    """A request the server refuses: HTTP status and a message naming the field."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


def check_host(host: str) -> None:
    """Only 127.0.0.1: the images are credentialed data (PhysioNet DUA) and must not leave this machine."""
    if host != LOOPBACK:
        raise ReviewServerError(
            f"refusing to serve on {host!r}: the review shows credentialed images (PhysioNet data use "
            f"agreement) and listens on {LOOPBACK} only. For an annotator on another machine, forward "
            f"the port over SSH (ssh -L PORT:{LOOPBACK}:PORT this-host) instead."
        )


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def parse_decision(body: bytes) -> dict[str, Any]:
    """The fields of a decision body, checked (RequestError 400 naming the field otherwise; nothing
    is cut or guessed)."""
    try:
        data = loads(body, source="the body")
    except JsonInputError as e:
        what = "JSON" if e.kind == "invalid" else "JSON this server takes"
        raise RequestError(HTTPStatus.BAD_REQUEST, f"the body is not {what}: {e.reason}") from None
    if not isinstance(data, dict):
        got = "null" if data is None else type(data).__name__
        raise RequestError(HTTPStatus.BAD_REQUEST, f"a decision is a JSON object, got {got}")
    unknown = sorted(set(data) - _DECISION_FIELDS)
    if unknown:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"unknown field(s) {', '.join(unknown)}", unknown[0])
    for key in ("key_id", "decision"):
        if not isinstance(data.get(key), str):
            got = "nothing" if key not in data else type(data[key]).__name__
            raise RequestError(HTTPStatus.BAD_REQUEST, f"{key} must be a string, got {got}", key)
    if data["decision"] not in DECISIONS:
        raise RequestError(
            HTTPStatus.BAD_REQUEST,
            f"decision must be one of {', '.join(DECISIONS)}, got {data['decision']!r}",
            "decision",
        )
    note = data.get("note", "")
    if note is None:
        note = ""
    if not isinstance(note, str):
        raise RequestError(
            HTTPStatus.BAD_REQUEST, f"note must be a string, got {type(note).__name__}", "note"
        )
    if len(note) > MAX_NOTE:
        raise RequestError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the note has {len(note):,} characters, at most {MAX_NOTE:,} are kept: shorten it (nothing was saved)",
            "note",
        )
    client_id = data.get("client_id")
    if client_id is not None and (
        not isinstance(client_id, str) or not 0 < len(client_id) <= MAX_CLIENT_ID or not client_id.isascii()
    ):
        raise RequestError(
            HTTPStatus.BAD_REQUEST, f"client_id must be an ASCII string of 1..{MAX_CLIENT_ID}", "client_id"
        )
    client_time = data.get("client_time")
    if client_time is not None and (
        isinstance(client_time, bool) or not isinstance(client_time, int | float)
    ):
        raise RequestError(HTTPStatus.BAD_REQUEST, "client_time must be a number", "client_time")
    out = {"key_id": data["key_id"], "decision": data["decision"], "note": note}
    if client_id is not None:
        out["client_id"] = client_id
    if client_time is not None:
        out["client_time"] = client_time
    return out


class ReviewApp:
    """State shared by request threads: the manifest, the credentials and one store per annotator.

    Every item's CXR must lie inside the CXR folder the review was prepared from and its overlay
    inside the review folder (links followed; chexpercept.containment), or the server does not start.
    """

    def __init__(self, review_dir: str | FsPath):
        self.root = FsPath(review_dir)
        self.manifest = load_manifest(self.root)
        self.tightened = restrict_folder(self.root)
        self.items = {item["key_id"]: item for item in self.manifest["items"]}
        self.annotators = list(self.manifest["annotators"])
        self.access = Access.load_or_create(self.root, self.annotators)
        self.stores = {a: DecisionStore(self.root, a) for a in self.annotators}
        self.assigned = {
            a: [i for i in self.manifest["items"] if a in i["annotators"]] for a in self.annotators
        }
        self.assigned_keys = {a: {i["key_id"] for i in items} for a, items in self.assigned.items()}
        self.static = {name: _static(name) for name in STATIC_FILES}
        self.files = self._contained_files()

    def _contained_files(self) -> dict[tuple[str, str], FsPath]:
        """(key_id, cxr|overlay) -> the file, each checked to lie inside its folder."""
        settings = self.manifest.get("settings", {})
        cxr_root = settings.get("mimic_cxr_jpg") or settings.get("cxr_png")
        if not cxr_root:
            raise SourceError(f"{self.root}: review.json names no CXR folder (settings.mimic_cxr_jpg)")
        cxr_tree, review_tree = Tree(cxr_root), Tree(self.root)
        files: dict[tuple[str, str], FsPath] = {}
        problems = []
        for key, item in self.items.items():
            cxr = os.path.realpath(str(item.get("cxr")))
            if is_inside(cxr_tree.root, cxr):
                files[(key, "cxr")] = FsPath(cxr)
            else:
                problems.append(f"{key}: cxr {item.get('cxr')} resolves to {cxr}, outside {cxr_tree.root}")
            if item.get("overlay") is not None:
                try:
                    files[(key, "overlay")] = review_tree.resolve(item["overlay"], what=f"{key}: overlay")
                except ContainmentError as e:
                    problems.append(str(e))
        if problems:
            raise SourceError(
                f"{self.root}/review.json names files outside their folders (refused):\n  - "
                + "\n  - ".join(problems[:20])
            )
        return files

    def cases(self, annotator: str) -> dict[str, Any]:
        latest = self.stores[annotator].latest()
        mine = self.assigned_keys[annotator]
        cases = [
            {
                k: item[k]
                for k in (
                    "key_id",
                    "lesion",
                    "positive",
                    "path",
                    "pair_id",
                    "sentence",
                    "section",
                    "instruction",
                    "location",
                )
            }
            | {"has_overlay": item["overlay"] is not None}
            for item in self.assigned[annotator]
        ]
        decisions = {
            k: {"decision": r["decision"], "note": r.get("note", "")} for k, r in latest.items() if k in mine
        }
        return {
            "annotator": annotator,
            "synthetic": bool(self.manifest.get("synthetic")),
            "limits": {"note": MAX_NOTE, "body": MAX_BODY},
            "cases": cases,
            "decisions": decisions,
        }

    def image(self, annotator: str, key_id: str, kind: str) -> tuple[bytes, str]:
        """One of the annotator's images: the CXR as the pipeline decodes it, or the overlay."""
        if key_id not in self.assigned_keys[annotator]:
            raise RequestError(HTTPStatus.NOT_FOUND, "not one of your cases")
        path = self.files.get((key_id, kind))
        if path is None:
            raise RequestError(HTTPStatus.NOT_FOUND, "this case has no mask")
        if kind == "overlay":
            try:
                return read_input(path, IMAGE, what="overlay"), "image/png"
            except OSError as e:
                what = explain_os_error(e).what
                raise RequestError(HTTPStatus.NOT_FOUND, f"cannot read the overlay: {what}") from e
            except InputFileError as e:
                raise RequestError(HTTPStatus.NOT_FOUND, f"cannot read the overlay: it {e.reason}") from None
        try:
            st = path.stat()
            return _pipeline_png(str(path), st.st_size, st.st_mtime_ns), "image/png"
        except (OSError, CaseInputError) as e:
            raise RequestError(HTTPStatus.NOT_FOUND, f"cannot read the CXR: {e}") from e

    def index_html(self) -> bytes:
        banner = (
            '<p class="banner">Phantom data: for testing software only.</p>'
            if self.manifest.get("synthetic")
            else ""
        )
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>CheXpercept review</title>"
            "<link rel='stylesheet' href='/static/review.css'></head><body class='index'>"
            f"<h1>CheXpercept review</h1>{banner}<p>Each annotator has a personal link (with a token), "
            "printed when <code>chexpercept review</code> starts; ask the person who runs it.</p>"
            "</body></html>"
        )
        return page.encode("utf-8")


@functools.lru_cache(maxsize=16)
def _pipeline_png(path: str, size: int, mtime_ns: int) -> bytes:
    """The CXR at ``path`` as the pipeline decodes it (``load_cxr``), as a PNG without metadata."""
    del size, mtime_ns  # part of the cache key: a replaced file is decoded again
    cxr = load_cxr(path)
    assert cxr.rgb is not None
    return encode_png(cxr.rgb)


class _DeadlineSocket(io.RawIOBase):
    """A connection's bytes: each read within what is left of the handler's ``deadline`` (the whole
    request), each write within the server's ``connection_timeout``."""

    def __init__(self, handler: _Handler):
        super().__init__()
        self.handler = handler
        self.sock: socket.socket = handler.connection

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.handler.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive whole within its deadline")
        self.sock.settimeout(left)
        return self.sock.recv_into(buffer)

    def write(self, data: Any) -> int:
        self.sock.settimeout(self.handler.server.connection_timeout)
        self.sock.sendall(data)
        return len(data)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.connection = self.request
        self.deadline = time.monotonic() + self.server.connection_timeout
        raw = _DeadlineSocket(self)
        self.rfile = io.BufferedReader(raw)
        self.wfile = raw

    def handle_one_request(self) -> None:
        # one deadline for the whole request: its wait, request line, headers and body
        self.deadline = time.monotonic() + self.server.connection_timeout
        super().handle_one_request()

    def log_message(self, format: str, *args: Any) -> None:
        return

    # ------------------------------------------------------------------------------------ replies
    def _send(
        self,
        status: int,
        body: bytes,
        ctype: str,
        *,
        cache: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "private, max-age=3600" if cache else "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), "application/json; charset=utf-8")

    def _error(self, status: int, message: str, field: str | None = None) -> None:
        body: dict[str, Any] = {"ok": False, "error": message}
        if field is not None:
            body["field"] = field
        self._json(status, body)

    def _host_ok(self) -> bool:
        port = self.server.server_address[1]
        allowed = {f"{LOOPBACK}:{port}", f"localhost:{port}"}
        if self.headers.get("Host") not in allowed:
            self._error(HTTPStatus.FORBIDDEN, "wrong Host header (only this loopback address is served)")
            return False
        return True

    def _cookie(self, annotator: str) -> str | None:
        name = cookie_name(annotator)
        for header in self.headers.get_all("Cookie") or []:
            for part in header.split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
        return None

    def _authorized(self, annotator: str) -> bool:
        return self._signed_in(self.server.app.access.check(annotator, self._cookie(annotator)))

    def _signed_in(self, valid: bool) -> bool:
        """``valid`` credentials make this connection trusted (admission.py); returns ``valid``."""
        if valid:
            self.server.admission.trust(self.connection)
        return valid

    # -------------------------------------------------------------------------------------- routes
    def _route(self) -> tuple[str | None, list[str]]:
        """(annotator, the path parts after /annotate/<A>) or (None, all parts)."""
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        if len(parts) >= 2 and parts[0] == "annotate":
            return parts[1], parts[2:]
        return None, parts

    def _guarded(self, handler: Any) -> None:
        """Run a route; a RequestError becomes its 4xx answer, anything else a 500 (never a dropped
        connection)."""
        try:
            if self._host_ok():
                handler()
        except RequestError as e:
            self._error(e.status, str(e), e.field)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as e:  # a bug: answer, keep serving
            self.close_connection = True
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(e).__name__}: {e}")

    def do_GET(self) -> None:
        self._guarded(self._get)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _get(self) -> None:
        app = self.server.app
        annotator, rest = self._route()
        if annotator is None:
            if not rest:
                self._send(HTTPStatus.OK, app.index_html(), "text/html; charset=utf-8")
            elif rest[0] == "static" and len(rest) == 2 and rest[1] in app.static:
                ctype = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[
                    rest[1].rsplit(".", 1)[1]
                ]
                self._send(HTTPStatus.OK, app.static[rest[1]], f"{ctype}; charset=utf-8")
            elif rest == ["favicon.ico"]:
                self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            else:
                raise RequestError(HTTPStatus.NOT_FOUND, "not found")
            return
        token = parse_qs(urlsplit(self.path).query).get("token", [None])[0]
        if token is not None and not rest:  # the link: token -> cookie, then the page without it
            if not self._signed_in(app.access.check(annotator, token)):
                raise RequestError(HTTPStatus.UNAUTHORIZED, "this link's token is not valid")
            self._send(
                HTTPStatus.SEE_OTHER,
                b"",
                "text/plain",
                headers={
                    "Location": f"{annotator_path(annotator)}/",
                    "Set-Cookie": set_cookie(annotator, token),
                },
            )
            return
        if not self._authorized(annotator):
            raise RequestError(
                HTTPStatus.UNAUTHORIZED,
                "not signed in: open your annotator link (printed when chexpercept review started)",
            )
        if not rest and not urlsplit(self.path).path.endswith("/"):
            self._send(
                HTTPStatus.SEE_OTHER, b"", "text/plain", headers={"Location": f"{annotator_path(annotator)}/"}
            )
        elif not rest:
            self._send(HTTPStatus.OK, app.static["review.html"], "text/html; charset=utf-8")
        elif rest == ["api", "cases"]:
            self._json(HTTPStatus.OK, app.cases(annotator))
        elif len(rest) == 3 and rest[0] == "image" and rest[2] in ("cxr", "overlay"):
            body, ctype = app.image(annotator, rest[1], rest[2])
            self._send(HTTPStatus.OK, body, ctype, cache=True)
        else:
            raise RequestError(HTTPStatus.NOT_FOUND, "not found")

    def _body(self) -> bytes:
        """The request body, within MAX_BODY (RequestError otherwise, after reading what was sent
        when that is small enough, so that the client sees the answer)."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "send the decision with a Content-Length")
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "a decision needs a Content-Length") from None
        if length < 0:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, "negative Content-Length")
        if length > MAX_BODY:
            self.close_connection = True
            if length <= 16 * MAX_BODY:
                self.rfile.read(length)
            raise RequestError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"a decision is at most {MAX_BODY // 1024} KiB, this one is {length:,} bytes (nothing was saved)",
            )
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, "the body ended early")
        return body

    def _post(self) -> None:
        app = self.server.app
        annotator, rest = self._route()
        body = self._body()  # read first: an answer before the body is read would reset the connection
        if annotator is None or rest != ["api", "decision"]:
            raise RequestError(HTTPStatus.NOT_FOUND, "not found")
        origin = self.headers.get("Origin")
        port = self.server.server_address[1]
        if origin is not None and origin not in (f"http://{LOOPBACK}:{port}", f"http://localhost:{port}"):
            raise RequestError(HTTPStatus.FORBIDDEN, f"requests from {origin} are refused")
        if not self._authorized(annotator):
            raise RequestError(
                HTTPStatus.UNAUTHORIZED,
                "not signed in: open your annotator link again (the decision is kept by the page)",
            )
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            raise RequestError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "a decision is sent as application/json")
        fields = parse_decision(body)
        key_id = fields.pop("key_id")
        if key_id not in app.assigned_keys[annotator]:
            raise RequestError(
                HTTPStatus.FORBIDDEN, f"case {key_id!r} is not assigned to annotator {annotator}", "key_id"
            )
        try:
            record = app.stores[annotator].append(
                key_id, fields.pop("decision"), fields.pop("note"), **fields
            )
        except StoreError as e:
            raise RequestError(HTTPStatus.BAD_REQUEST, str(e)) from e
        except OSError as e:  # disk full, permissions: the page keeps the decision and retries
            what = explain_os_error(e).what
            raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, f"could not save: {what}") from e
        self._json(HTTPStatus.OK, {"ok": True, "record": record})


class _Server(ThreadingHTTPServer):
    """A thread per connection, admitted by ``Admission`` (per-account limits), each request with a
    deadline."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: a burst of connections is accepted, then answered

    def __init__(
        self,
        address: tuple[str, int],
        app: ReviewApp,
        *,
        connection_timeout: float = CONNECTION_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        max_pending: int = MAX_PENDING,
        max_peer_pending: int = MAX_PEER_PENDING,
    ):
        self.app = app
        self.connection_timeout = connection_timeout
        self.admission = Admission(max_connections, max_pending, max_peer_pending)
        self.open_connections: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        refused = self.admission.admit(request, peer_of(request, client_address))
        if refused is not None:
            _refuse_busy(request, refused)
            self.shutdown_request(request)
            return
        with self._open_lock:
            self.open_connections.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: socket.socket) -> None:
        with self._open_lock:
            self.open_connections.discard(request)
        self.admission.release(request)

    def server_close(self) -> None:
        """Stop listening and close every open connection (kept-alive ones too), as an exit would."""
        super().server_close()
        with self._open_lock:
            connections = list(self.open_connections)
        for request in connections:
            with contextlib.suppress(OSError):
                request.shutdown(socket.SHUT_RDWR)


def _refuse_busy(request: socket.socket, reason: str) -> None:
    body = json.dumps({"ok": False, "error": f"the review server is busy ({reason}); try again"}).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 2\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        request.settimeout(1.0)
        request.sendall(head + body)


def make_server(
    review_dir: str | FsPath,
    host: str = LOOPBACK,
    port: int = 8765,
    *,
    connection_timeout: float = CONNECTION_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
    max_pending: int = MAX_PENDING,
    max_peer_pending: int = MAX_PEER_PENDING,
) -> _Server:
    """A bound (not yet serving) server; port 0 picks a free port (``server.server_address[1]``).
    ``connection_timeout``: seconds a request may take to arrive whole; the limits: admission.py."""
    check_host(host)
    app = ReviewApp(review_dir)
    try:
        return _Server(
            (host, port),
            app,
            connection_timeout=connection_timeout,
            max_connections=max_connections,
            max_pending=max_pending,
            max_peer_pending=max_peer_pending,
        )
    except OSError as e:
        raise ReviewServerError(f"cannot listen on {host}:{port}: {e.strerror} (try another --port)") from e


def serve_in_thread(
    review_dir: str | FsPath, port: int = 0, **kwargs: Any
) -> tuple[_Server, threading.Thread]:
    """For tests and notebooks: serve in a background thread; call ``server.shutdown()`` to stop.
    ``server.app.access.link(base, annotator)`` gives an annotator's link."""
    server = make_server(review_dir, LOOPBACK, port, **kwargs)
    thread = threading.Thread(target=server.serve_forever, name="chexpercept-review", daemon=True)
    thread.start()
    return server, thread
