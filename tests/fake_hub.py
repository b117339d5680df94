"""A loopback stand-in for the few Hugging Face Hub endpoints the toolkit's hub code calls.

Models: info with file metadata (``/api/models/<id>[/revision/<rev>]``), the file tree, auth-check,
and file downloads (``/<id>/resolve/<rev>/<file>``, HEAD and GET, with ETag, X-Repo-Commit and
Content-Length). A gated model answers 403 with ``X-Error-Code: GatedRepo`` where files or access
are asked for; a missing model 404 ``RepoNotFound``; a missing revision 404 ``RevisionNotFound``.
Dataset repos: create, validate-yaml, preupload (every file regular, never LFS) and commit
(NDJSON with base64 file contents), which are kept in ``FakeHub.datasets``.
Model repos: preupload and commit too; with ``?create_pr=1`` the commit opens a pull request (kept in
``FakeModel.pulls``, the model's files untouched) and the answer carries ``pullRequestUrl``
(``<url>/<repo>/discussions/<n>``), as the Hub's commit endpoint does.
Leaderboards: ``GET /api/datasets/<repo>/leaderboard`` answers ``FakeHub.leaderboards[repo]`` (entries
in the Hub's JSON: rank, modelId, value, filename, verified, source, author, pullRequest, notes) and
records its query (``base_model``) in ``FakeHub.leaderboard_queries``; a repo that is neither a
dataset nor a leaderboard here answers 404 RepoNotFound, a dataset without a leaderboard 404 with a
plain message (what the real Hub says then was not observed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from local_http import LocalServer


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@dataclass
class FakeModel:
    files: dict[str, bytes]
    commit: str = ""
    gated: bool = False
    #: branch or tag name -> commit (main is added)
    refs: dict[str, str] = field(default_factory=dict)
    #: sizes reported by the info endpoint instead of the real ones (to test the disk check)
    reported_sizes: dict[str, int] = field(default_factory=dict)
    #: files listed but no longer served (404 EntryNotFound on download)
    lost: set[str] = field(default_factory=set)
    #: pull requests opened by commits with create_pr: {"num", "title", "description", "files"}
    pulls: list[dict[str, Any]] = field(default_factory=list)
    #: direct commits to main: {"summary", "files"}
    commits: list[dict[str, Any]] = field(default_factory=list)
    #: earlier commits of main (``push``) -> their files, still served by commit
    older: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.commit:
            self.commit = sha1(json.dumps(sorted(self.files)).encode() + b"".join(self.files.values()))
        self.refs.setdefault("main", self.commit)

    def push(self, files: dict[str, bytes]) -> str:
        """A new commit on main (upstream changed); the old one stays reachable by its hash."""
        self.older[self.commit] = self.files
        self.files = dict(files)
        self.commit = sha1(json.dumps(sorted(files)).encode() + b"".join(files.values()))
        self.refs["main"] = self.commit
        return self.commit

    def files_at(self, commit: str) -> dict[str, bytes]:
        return self.files if commit == self.commit else self.older[commit]


@dataclass
class FakeDataset:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)


class FakeHub:
    def __init__(self) -> None:
        self.models: dict[str, FakeModel] = {}
        self.datasets: dict[str, FakeDataset] = {}
        self.requests: list[tuple[str, str]] = []
        #: benchmark dataset repo -> leaderboard entries (the Hub's JSON)
        self.leaderboards: dict[str, list[dict[str, Any]]] = {}
        self.leaderboard_queries: list[dict[str, list[str]]] = []
        self.lock = threading.Lock()
        self.server = LocalServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def downloads(self) -> list[str]:
        return [p for m, p in self.requests if m == "GET" and "/resolve/" in p]

    # ------------------------------------------------------------------------ models
    def _model(self, repo: str, rev: str | None) -> tuple[FakeModel, str] | tuple[None, str]:
        model = self.models.get(repo)
        if model is None:
            return None, "RepoNotFound"
        rev = rev or "main"
        if rev == model.commit or rev in model.refs or rev in model.older:
            return model, model.refs.get(rev, rev)
        return None, "RevisionNotFound"

    def model_info(self, repo: str, rev: str | None) -> tuple[int, dict[str, str], Any]:
        model, commit = self._model(repo, rev)
        if model is None:
            return _error(commit, repo)
        siblings = [
            {"rfilename": name, "size": model.reported_sizes.get(name, len(data)), "blobId": sha1(data)}
            for name, data in sorted(model.files_at(commit).items())
        ]
        body = {
            "_id": "0" * 24,
            "id": repo,
            "modelId": repo,
            "sha": commit,
            "private": False,
            "gated": "manual" if model.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        return 200, {}, body

    def tree(self, repo: str, rev: str) -> tuple[int, dict[str, str], Any]:
        model, commit = self._model(repo, rev)
        if model is None:
            return _error(commit, repo)
        entries = [
            {"type": "file", "oid": sha1(data), "size": len(data), "path": name}
            for name, data in sorted(model.files_at(commit).items())
        ]
        return 200, {}, entries

    def auth_check(self, repo: str) -> tuple[int, dict[str, str], Any]:
        model = self.models.get(repo)
        if model is None:
            return _error("RepoNotFound", repo)
        if model.gated:
            return _error("GatedRepo", repo)
        return 200, {}, {}

    def resolve(self, repo: str, rev: str, name: str) -> tuple[int, dict[str, str], bytes]:
        model, commit = self._model(repo, rev)
        if model is None:
            status, headers, body = _error(commit, repo)
            return status, headers, json.dumps(body).encode()
        if model.gated:
            status, headers, body = _error("GatedRepo", repo)
            return status, headers, json.dumps(body).encode()
        data = model.files_at(commit).get(name)
        if data is None or name in model.lost:
            status, headers, body = _error("EntryNotFound", repo)
            return status, headers, json.dumps(body).encode()
        return 200, {"X-Repo-Commit": commit, "ETag": f'"{sha1(data)}"'}, data

    # ------------------------------------------------------------------------ datasets
    def create_repo(self, payload: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        repo = (
            f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        )
        if payload.get("type") != "dataset":
            return 400, {}, {"error": "only dataset repos here"}
        if repo in self.datasets:
            return (
                409,
                {},
                {"error": "You already created this dataset repo", "url": f"{self.url}/datasets/{repo}"},
            )
        self.datasets[repo] = FakeDataset(
            private=payload.get("visibility") == "private" or bool(payload.get("private"))
        )
        return 200, {}, {"url": f"{self.url}/datasets/{repo}", "name": repo, "id": repo}

    def preupload(self, repo: str, payload: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        if repo not in self.datasets:
            return _error("RepoNotFound", repo)
        files = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
            for f in payload.get("files", [])
        ]
        return 200, {}, {"files": files, "commitOid": "0" * 40}

    def commit(self, repo: str, body: bytes) -> tuple[int, dict[str, str], Any]:
        ds = self.datasets.get(repo)
        if ds is None:
            return _error("RepoNotFound", repo)
        parsed = _commit_body(body)
        if isinstance(parsed, str):
            return 400, {}, {"error": parsed}
        header, added = parsed
        ds.files.update(added)
        oid = sha1(body)
        ds.commits.append({"summary": header.get("summary"), "files": sorted(added), "oid": oid})
        return 200, {}, {"commitUrl": f"{self.url}/datasets/{repo}/commit/{oid}", "commitOid": oid}

    def model_preupload(self, repo: str, payload: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        if repo not in self.models:
            return _error("RepoNotFound", repo)
        files = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
            for f in payload.get("files", [])
        ]
        return 200, {}, {"files": files, "commitOid": self.models[repo].commit}

    def model_commit(self, repo: str, body: bytes, create_pr: bool) -> tuple[int, dict[str, str], Any]:
        model = self.models.get(repo)
        if model is None:
            return _error("RepoNotFound", repo)
        parsed = _commit_body(body)
        if isinstance(parsed, str):
            return 400, {}, {"error": parsed}
        header, added = parsed
        oid = sha1(body)
        answer = {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid}
        if create_pr:
            num = len(model.pulls) + 1
            model.pulls.append(
                {
                    "num": num,
                    "title": header.get("summary"),
                    "description": header.get("description"),
                    "files": added,
                }
            )
            answer["pullRequestUrl"] = f"{self.url}/{repo}/discussions/{num}"
        else:
            model.files.update(added)
            model.commits.append({"summary": header.get("summary"), "files": sorted(added)})
        return 200, {}, answer

    def leaderboard(self, repo: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], Any]:
        self.leaderboard_queries.append(query)
        if repo in self.leaderboards:
            return 200, {}, self.leaderboards[repo]
        if repo in self.datasets:
            return 404, {}, {"error": f"{repo} has no leaderboard"}
        return _error("RepoNotFound", repo)


def _commit_body(body: bytes) -> tuple[dict[str, Any], dict[str, bytes]] | str:
    """(header, path -> bytes) of a commit's NDJSON; an error message for anything but added files."""
    lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
    header = next(x["value"] for x in lines if x["key"] == "header")
    added = {}
    for x in lines:
        if x["key"] == "file":
            v = x["value"]
            assert v["encoding"] == "base64", v
            added[v["path"]] = base64.b64decode(v["content"])
        elif x["key"] != "header":
            return f"unexpected operation {x['key']} (only regular files here)"
    return header, added


def _error(code: str, repo: str) -> tuple[int, dict[str, str], Any]:
    messages = {
        "RepoNotFound": (404, f"Repository Not Found for url: {repo}."),
        "RevisionNotFound": (404, f"Invalid rev id for {repo}"),
        "EntryNotFound": (404, "Entry not found"),
        "GatedRepo": (403, f"Access to model {repo} is restricted and you are not in the authorized list."),
    }
    status, message = messages[code]
    return status, {"X-Error-Code": code, "X-Error-Message": message}, {"error": message}


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, status: int, headers: dict[str, str], body: Any, head: bool = False) -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            if not isinstance(body, bytes):
                self.send_header("Content-Type", "application/json")
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _body(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            path = unquote(url.path)
            with hub.lock:
                hub.requests.append((method, path))
            parts = path.strip("/").split("/")
            body = self._body() if method == "POST" else b""
            head = method == "HEAD"
            query = parse_qs(url.query)
            if parts[:2] == ["api", "models"] and len(parts) >= 5 and method == "POST":
                repo = "/".join(parts[2:4])
                if parts[4] == "preupload":
                    return self._send(*hub.model_preupload(repo, json.loads(body)))
                if parts[4] == "commit":
                    return self._send(*hub.model_commit(repo, body, query.get("create_pr") == ["1"]))
            if parts[:2] == ["api", "datasets"] and len(parts) == 5 and parts[4] == "leaderboard":
                return self._send(*hub.leaderboard("/".join(parts[2:4]), query), head=head)
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo = "/".join(parts[2:4])
                rest = parts[4:]
                if not rest:
                    return self._send(*hub.model_info(repo, None), head=head)
                if rest[0] == "revision":
                    return self._send(*hub.model_info(repo, "/".join(rest[1:])), head=head)
                if rest[0] == "tree":
                    return self._send(*hub.tree(repo, rest[1]), head=head)
                if rest[0] == "auth-check":
                    return self._send(*hub.auth_check(repo), head=head)
            if parts[:3] == ["api", "repos", "create"] and method == "POST":
                return self._send(*hub.create_repo(json.loads(body)))
            if parts[:2] == ["api", "validate-yaml"]:
                return self._send(200, {}, {"errors": [], "warnings": []})
            if parts[:2] == ["api", "datasets"] and len(parts) >= 5 and method == "POST":
                repo = "/".join(parts[2:4])
                if parts[4] == "preupload":
                    return self._send(*hub.preupload(repo, json.loads(body)))
                if parts[4] == "commit":
                    return self._send(*hub.commit(repo, body))
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = "/".join(parts[:2])
                return self._send(*hub.resolve(repo, parts[3], "/".join(parts[4:])), head=head)
            self._send(404, {}, {"error": f"fake hub: no route for {method} {path} ({query})"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_HEAD(self) -> None:
            self._route("HEAD")

        def do_POST(self) -> None:
            self._route("POST")

    return Handler
