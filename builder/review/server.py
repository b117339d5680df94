"""The review server: the standard library's ``ThreadingHTTPServer`` on 127.0.0.1 only.

Routes: ``/`` (the annotators and their progress), ``/annotate/<A>`` (the page), ``/static/<file>``
(its JS and CSS, shipped in the package; nothing comes from the internet), ``/api/<A>/cases``,
``POST /api/<A>/decision`` and ``/image/<key_id>/{cxr,overlay}`` (only cases of the prepared review).
Requests whose ``Host`` header is not this loopback address are refused (DNS rebinding), and every
page carries a Content-Security-Policy that allows this origin only.
"""

from __future__ import annotations

import html
import json
import mimetypes
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path as FsPath
from typing import Any
from urllib.parse import unquote, urlsplit

from .manifest import load_manifest
from .store import DecisionStore, StoreError

LOOPBACK = "127.0.0.1"
MAX_BODY = 64 * 1024
CSP = (
    "default-src 'self'; img-src 'self'; style-src 'self'; script-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC_FILES = ("review.html", "review.js", "review.css")


class ReviewServerError(Exception):
    """The server cannot start as asked (a non-loopback address, a port in use)."""


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


class ReviewApp:
    """State shared by request threads: the manifest and one store per annotator."""

    def __init__(self, review_dir: str | FsPath):
        self.root = FsPath(review_dir)
        self.manifest = load_manifest(self.root)
        self.items = {item["key_id"]: item for item in self.manifest["items"]}
        self.annotators = list(self.manifest["annotators"])
        self.stores = {a: DecisionStore(self.root, a) for a in self.annotators}
        self.assigned = {
            a: [i for i in self.manifest["items"] if a in i["annotators"]] for a in self.annotators
        }
        self.static = {name: _static(name) for name in STATIC_FILES}

    def cases(self, annotator: str) -> dict[str, Any]:
        latest = self.stores[annotator].latest()
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
            k: {"decision": r["decision"], "note": r.get("note", "")}
            for k, r in latest.items()
            if k in self.items
        }
        return {
            "annotator": annotator,
            "synthetic": bool(self.manifest.get("synthetic")),
            "cases": cases,
            "decisions": decisions,
        }

    def index_html(self) -> bytes:
        rows = []
        for a in self.annotators:
            latest = self.stores[a].latest()
            mine = {i["key_id"] for i in self.assigned[a]}
            done = sum(1 for k, r in latest.items() if k in mine and r["decision"] != "skip")
            rows.append(
                f'<li><a href="/annotate/{html.escape(a)}">Annotator {html.escape(a)}</a> '
                f"<span>{done} of {len(mine)} decided</span></li>"
            )
        banner = (
            '<p class="banner">Phantom data: for testing software only.</p>'
            if self.manifest.get("synthetic")
            else ""
        )
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>CheXpercept review</title>"
            "<link rel='stylesheet' href='/static/review.css'></head><body class='index'>"
            f"<h1>CheXpercept review</h1>{banner}<ul id='annotators'>{''.join(rows)}</ul></body></html>"
        )
        return page.encode("utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    # ------------------------------------------------------------------------------------ replies
    def _send(self, status: int, body: bytes, ctype: str, *, cache: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "private, max-age=3600" if cache else "no-store")
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode("utf-8"), "application/json; charset=utf-8")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"ok": False, "error": message})

    def _host_ok(self) -> bool:
        port = self.server.server_address[1]
        allowed = {f"{LOOPBACK}:{port}", f"localhost:{port}"}
        if self.headers.get("Host") not in allowed:
            self._error(HTTPStatus.FORBIDDEN, "wrong Host header (only this loopback address is served)")
            return False
        return True

    # -------------------------------------------------------------------------------------- routes
    def do_GET(self) -> None:
        if not self._host_ok():
            return
        app = self.server.app
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        if not parts:
            self._send(HTTPStatus.OK, app.index_html(), "text/html; charset=utf-8")
        elif parts[0] == "annotate" and len(parts) == 2 and parts[1] in app.annotators:
            self._send(HTTPStatus.OK, app.static["review.html"], "text/html; charset=utf-8")
        elif parts[0] == "static" and len(parts) == 2 and parts[1] in app.static:
            ctype = {"js": "text/javascript", "css": "text/css", "html": "text/html"}[
                parts[1].rsplit(".", 1)[1]
            ]
            self._send(HTTPStatus.OK, app.static[parts[1]], f"{ctype}; charset=utf-8")
        elif parts[0] == "api" and len(parts) == 3 and parts[1] in app.annotators and parts[2] == "cases":
            self._json(HTTPStatus.OK, app.cases(parts[1]))
        elif (
            parts[0] == "image"
            and len(parts) == 3
            and parts[1] in app.items
            and parts[2] in ("cxr", "overlay")
        ):
            item = app.items[parts[1]]
            rel = item["cxr"] if parts[2] == "cxr" else item["overlay"]
            if rel is None:
                self._error(HTTPStatus.NOT_FOUND, "this case has no mask")
                return
            path = FsPath(rel) if parts[2] == "cxr" else app.root / rel
            try:
                body = path.read_bytes()
            except OSError as e:
                self._error(HTTPStatus.NOT_FOUND, f"cannot read {path}: {e.strerror}")
                return
            ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            self._send(HTTPStatus.OK, body, ctype, cache=True)
        elif parts == ["favicon.ico"]:
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
        else:
            self._error(HTTPStatus.NOT_FOUND, "not found")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        if not self._host_ok():
            return
        app = self.server.app
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        if not (
            len(parts) == 3 and parts[0] == "api" and parts[1] in app.annotators and parts[2] == "decision"
        ):
            self._error(HTTPStatus.NOT_FOUND, "not found")
            return
        annotator = parts[1]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 < length <= MAX_BODY:
            self._error(HTTPStatus.BAD_REQUEST, "a decision is a JSON body of at most 64 KiB")
            return
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            self._error(HTTPStatus.BAD_REQUEST, "not JSON")
            return
        key_id = body.get("key_id") if isinstance(body, dict) else None
        if key_id not in app.items or annotator not in app.items[key_id]["annotators"]:
            self._error(HTTPStatus.BAD_REQUEST, f"case {key_id!r} is not assigned to annotator {annotator}")
            return
        extra = {}
        if isinstance(body.get("client_id"), str):
            extra["client_id"] = body["client_id"][:80]
        try:
            record = app.stores[annotator].append(
                key_id, body.get("decision"), str(body.get("note") or "")[:10000], **extra
            )
        except StoreError as e:
            self._error(HTTPStatus.BAD_REQUEST, str(e))
            return
        except OSError as e:  # disk full, permissions: the page keeps the decision and retries
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"could not save: {e.strerror}")
            return
        self._json(HTTPStatus.OK, {"ok": True, "record": record})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: ReviewApp):
        self.app = app
        super().__init__(address, _Handler)


def make_server(review_dir: str | FsPath, host: str = LOOPBACK, port: int = 8765) -> _Server:
    """A bound (not yet serving) server; port 0 picks a free port (``server.server_address[1]``)."""
    check_host(host)
    app = ReviewApp(review_dir)
    try:
        return _Server((host, port), app)
    except OSError as e:
        raise ReviewServerError(f"cannot listen on {host}:{port}: {e.strerror} (try another --port)") from e


def serve_in_thread(review_dir: str | FsPath, port: int = 0) -> tuple[_Server, threading.Thread]:
    """For tests and notebooks: serve in a background thread; call ``server.shutdown()`` to stop."""
    server = make_server(review_dir, LOOPBACK, port)
    thread = threading.Thread(target=server.serve_forever, name="chexpercept-review", daemon=True)
    thread.start()
    return server, thread
