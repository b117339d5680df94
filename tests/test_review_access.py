"""The review app behind per-annotator credentials (issue 21 items 2 and 4), without a browser.

Another account on the machine can reach 127.0.0.1: without the annotator's token it gets nothing
(queue, decisions, images, writes), with one annotator's token it gets that annotator's cases only.
Stalled connections are closed, the server stays bounded, every malformed body gets a 4xx with a JSON
error naming the field, a resent decision is stored once, review.json cannot point the server at files
outside their folders, and the CXR is served as the pipeline decodes it (no EXIF rotation).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from chexpercept.builder.review.access import ACCESS_FILE
from chexpercept.builder.review.prepare import ReviewSources, prepare
from chexpercept.builder.review.server import make_server, serve_in_thread
from chexpercept.builder.review.store import read_decisions
from chexpercept.builder.sources import SourceError, load_cxr

sys.path.insert(0, str(Path(__file__).parent))
from other_account import other_account, run_as, trickle_clients

LESIONS = ["cardiomegaly"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from chexpercept.builder.synth_sources import synthesize_sources

    return synthesize_sources(
        tmp_path_factory.mktemp("review_access") / "src", per_cell=1, lesions=tuple(LESIONS), progress=False
    )


def _prepare(sources, root, **kw):
    src = ReviewSources(
        mimic_cxr_jpg=str(sources / "mimic-cxr-jpg"), mimic_ils=str(sources / "mimic-ils"), lesions=LESIONS
    )
    return prepare(root, src, annotators=2, reviews_per_case=1, progress=False, **kw)


@pytest.fixture
def served(sources, tmp_path):
    _prepare(sources, tmp_path / "rev")
    server, _ = serve_in_thread(tmp_path / "rev")
    yield tmp_path / "rev", server
    server.shutdown()
    server.server_close()


def _request(port, method, path, body=None, *, cookie=None, headers=None, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    h = {"Host": f"127.0.0.1:{port}", **(headers or {})}
    if cookie:
        h["Cookie"] = cookie
    data = raw
    if body is not None:
        data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    payload = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), payload


def _sign_in(server, annotator):
    status, headers, _ = _request(server.server_address[1], "GET", server.app.access.link("", annotator))
    assert status == 303
    return headers["Set-Cookie"].split(";")[0]


def _cases(server, annotator, cookie):
    return json.loads(
        _request(server.server_address[1], "GET", f"/annotate/{annotator}/api/cases", cookie=cookie)[2]
    )


# ---------------------------------------------------------------------------------- credentials
def test_without_the_token_nothing_is_served(served):
    root, server = served
    port = server.server_address[1]
    a = _sign_in(server, "A")
    key = _cases(server, "A", a)["cases"][0]["key_id"]
    for path in (
        "/annotate/A/",
        "/annotate/A/api/cases",
        f"/annotate/A/image/{key}/cxr",
        f"/annotate/A/image/{key}/overlay",
    ):
        assert _request(port, "GET", path)[0] == 401, path
        assert _request(port, "GET", path, cookie="chexpercept_review_A=guess")[0] == 401, path
    status, _, body = _request(
        port, "POST", "/annotate/A/api/decision", {"key_id": key, "decision": "accept"}
    )
    assert status == 401 and json.loads(body)["error"].startswith("not signed in")
    assert _request(port, "GET", "/annotate/A?token=wrong")[0] == 401
    # the routes of the old, open app are gone
    for path in ("/api/A/cases", f"/image/{key}/cxr", "/annotate/A/../../api/A/cases"):
        assert _request(port, "GET", path)[0] in (401, 404), path
    # the index says where the links are and shows no case, no name, no progress
    page = _request(port, "GET", "/")[2].decode()
    assert key not in page and "decided" not in page and "personal link" in page
    assert read_decisions(root / "decisions" / "A.jsonl") == []


def test_one_annotators_token_opens_only_their_cases(served):
    root, server = served
    port = server.server_address[1]
    a, b = _sign_in(server, "A"), _sign_in(server, "B")
    mine = {c["key_id"] for c in _cases(server, "A", a)["cases"]}
    theirs = {c["key_id"] for c in _cases(server, "B", b)["cases"]}
    assert mine and theirs and not mine & theirs
    other = next(iter(theirs))
    assert _request(port, "GET", "/annotate/B/api/cases", cookie=a)[0] == 401  # A's cookie is not B's
    assert _request(port, "GET", f"/annotate/A/image/{other}/cxr", cookie=a)[0] == 404
    assert _request(port, "GET", f"/annotate/B/image/{other}/cxr", cookie=a)[0] == 401
    status, _, body = _request(
        port, "POST", "/annotate/A/api/decision", {"key_id": other, "decision": "accept"}, cookie=a
    )
    assert status == 403 and json.loads(body)["field"] == "key_id"
    # B's decisions are not in A's queue, and A cannot write as B
    _request(port, "POST", "/annotate/B/api/decision", {"key_id": other, "decision": "reject"}, cookie=b)
    assert _cases(server, "A", a)["decisions"] == {}
    status, _, _ = _request(
        port, "POST", "/annotate/B/api/decision", {"key_id": other, "decision": "accept"}, cookie=a
    )
    assert status == 401
    assert [r["decision"] for r in read_decisions(root / "decisions" / "B.jsonl")] == ["reject"]


def test_the_link_sets_a_strict_scoped_cookie_and_drops_the_token_from_the_address(served):
    _, server = served
    port = server.server_address[1]
    status, headers, _ = _request(port, "GET", server.app.access.link("", "A"))
    assert status == 303 and headers["Location"] == "/annotate/A/"
    cookie = headers["Set-Cookie"]
    token = server.app.access.tokens["A"]
    assert cookie.startswith(f"chexpercept_review_A={token};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/annotate/A;" in cookie
    assert len(token) >= 43  # 256 random bits


def test_tokens_are_owner_only_and_survive_a_restart(sources, tmp_path):
    root = tmp_path / "rev"
    _prepare(sources, root)
    root.chmod(0o755)  # a folder others can read (e.g. prepared by an earlier version)
    first = make_server(root, port=0)
    first.server_close()
    assert first.app.tightened and stat.S_IMODE(root.stat().st_mode) == 0o700
    access = root / ACCESS_FILE
    assert stat.S_IMODE(access.stat().st_mode) == 0o600
    again = make_server(root, port=0)
    again.server_close()
    assert again.app.access.tokens == first.app.access.tokens and set(first.app.access.tokens) == {"A", "B"}
    access.chmod(0o644)
    with pytest.raises(SourceError, match="readable by other users"):
        make_server(root, port=0)


def test_another_origin_cannot_post(served):
    _, server = served
    a = _sign_in(server, "A")
    key = _cases(server, "A", a)["cases"][0]["key_id"]
    status, _, body = _request(
        server.server_address[1],
        "POST",
        "/annotate/A/api/decision",
        {"key_id": key, "decision": "accept"},
        cookie=a,
        headers={"Origin": "http://evil.example"},
    )
    assert status == 403 and b"evil.example" in body


# ------------------------------------------------------------------------------- malformed bodies
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"key_id": ["a", "b"], "decision": "accept"}, 400, "key_id"),
        ({"key_id": {"x": 1}, "decision": "accept"}, 400, "key_id"),
        ({"decision": "accept"}, 400, "key_id"),
        ({"key_id": "K", "decision": 1}, 400, "decision"),
        ({"key_id": "K", "decision": ["accept"]}, 400, "decision"),
        ({"key_id": "K", "decision": "accept", "note": 5}, 400, "note"),
        ({"key_id": "K", "decision": "accept", "note": ["x"]}, 400, "note"),
        ({"key_id": "K", "decision": "accept", "client_id": 7}, 400, "client_id"),
        ({"key_id": "K", "decision": "accept", "client_id": "x" * 81}, 400, "client_id"),
        ({"key_id": "K", "decision": "accept", "client_time": "soon"}, 400, "client_time"),
        ({"key_id": "K", "decision": "accept", "extra": 1}, 400, "extra"),
        ({"key_id": "K", "decision": "accept", "note": "x" * 10_001}, 413, "note"),
        (["K", "accept"], 400, None),
        ("accept", 400, None),
    ],
)
def test_malformed_bodies_get_a_json_error_naming_the_field(served, body, status, field):
    root, server = served
    a = _sign_in(server, "A")
    key = _cases(server, "A", a)["cases"][0]["key_id"]
    if isinstance(body, dict) and body.get("key_id") == "K":
        body["key_id"] = key
    got, headers, payload = _request(
        server.server_address[1], "POST", "/annotate/A/api/decision", body, cookie=a
    )
    answer = json.loads(payload)
    assert got == status and headers["Content-Type"].startswith("application/json") and answer["ok"] is False
    assert answer.get("field") == field and answer["error"]
    assert read_decisions(root / "decisions" / "A.jsonl") == []  # nothing stored, nothing cut


@pytest.mark.parametrize(
    ("raw", "headers", "status", "said"),
    [
        (b"{not json", {"Content-Type": "application/json"}, 400, "not JSON"),
        (b"null", {"Content-Type": "application/json"}, 400, "a JSON object, got null"),
        (b"\xff\xfe{}", {"Content-Type": "application/json"}, 400, "not UTF-8"),
        (b'{"key_id": "K", "decision": "accept"}', {"Content-Type": "text/plain"}, 415, "application/json"),
        (b"x" * (70 * 1024), {"Content-Type": "application/json"}, 413, "at most 64 KiB"),
    ],
)
def test_bad_json_oversized_and_wrong_types_of_body(served, raw, headers, status, said):
    _, server = served
    a = _sign_in(server, "A")
    got, _, payload = _request(
        server.server_address[1], "POST", "/annotate/A/api/decision", cookie=a, headers=headers, raw=raw
    )
    assert got == status and said in json.loads(payload)["error"]


def test_a_body_without_length_is_answered(served):
    _, server = served
    a = _sign_in(server, "A")
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            f"POST /annotate/A/api/decision HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {a}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".encode()
        )
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 411") and b"Content-Length" in reply


def test_a_resent_decision_is_stored_once(served):
    root, server = served
    a = _sign_in(server, "A")
    port = server.server_address[1]
    key = _cases(server, "A", a)["cases"][0]["key_id"]
    first = {"key_id": key, "decision": "accept", "client_id": "c1", "client_time": 1}
    newer = {"key_id": key, "decision": "reject", "client_id": "c2", "client_time": 2}
    for body in (first, newer, first):  # the first one's answer was lost; the page sends it again
        assert _request(port, "POST", "/annotate/A/api/decision", body, cookie=a)[0] == 200
    assert [r["decision"] for r in read_decisions(root / "decisions" / "A.jsonl")] == ["accept", "reject"]
    assert _cases(server, "A", a)["decisions"][key]["decision"] == "reject"


def test_a_note_at_the_limit_is_kept_whole(served):
    root, server = served
    a = _sign_in(server, "A")
    key = _cases(server, "A", a)["cases"][0]["key_id"]
    note = "\u00e9" * 9_999 + "\U0001f600"  # 10,000 characters (code points), 20,002 UTF-8 bytes
    body = {"key_id": key, "decision": "accept", "note": note}
    assert _request(server.server_address[1], "POST", "/annotate/A/api/decision", body, cookie=a)[0] == 200
    assert read_decisions(root / "decisions" / "A.jsonl")[0]["note"] == note


# ----------------------------------------------------------------------------------- connections
def _threads():
    return sum(t.name.startswith("Thread-") or "process_request" in t.name for t in threading.enumerate())


def test_stalled_connections_are_closed_and_the_server_stays_bounded(sources, tmp_path):
    _prepare(sources, tmp_path / "rev")
    server, _ = serve_in_thread(tmp_path / "rev", connection_timeout=0.5, max_connections=16)
    port = server.server_address[1]
    try:
        before = threading.active_count()
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
        for s in stalled[:100]:
            s.sendall(b"GET /annotate/A/api/ca")  # half a request line, then nothing
        time.sleep(0.2)
        assert threading.active_count() - before <= 16 + 2  # bounded: no thread per stalled socket
        closed = 0
        deadline = time.monotonic() + 10
        for s in stalled:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                data = s.recv(4096)
                while data:  # a 503 (over the bound) or the timeout's close
                    assert data.startswith(b"HTTP/1.1 503") or b"HTTP/1.1" not in data[:9]
                    data = s.recv(4096)
                closed += 1
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
            finally:
                s.close()
        assert closed == 300  # every one closed by the server, none left open
        a = _sign_in(server, "A")
        assert _request(port, "GET", "/annotate/A/api/cases", cookie=a)[0] == 200  # still serving
        time.sleep(0.2)
        assert threading.active_count() - before <= 2
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_request_that_trickles_in_is_cut_at_its_deadline(sources, tmp_path, part):
    """A header line (or ten body bytes) every 0.3 s used to keep a connection with a 1-s timeout
    open for ever (each read had its own timeout): the whole request now has 1 s (issue 27 item 4)."""
    _prepare(sources, tmp_path / "rev")
    server, _ = serve_in_thread(tmp_path / "rev", connection_timeout=1.0)
    port = server.server_address[1]
    if part == "headers":
        request, piece = b"GET /static/review.css HTTP/1.1\r\n", b"X-Slow: 1\r\n"
    else:
        request = (
            f"POST /annotate/A/api/decision HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n"
        ).encode()
        piece = b" " * 10
    sent: list = []
    try:
        trickle_clients(sent.append, None, port, 1, 0.3, 8.0, request, piece)
    finally:
        server.shutdown()
        server.server_close()
    (connection,) = sent[-1]
    assert connection["closed"] is not None  # closed by the server, not kept alive by the trickle
    assert not connection["answer"].startswith("HTTP/1.1 2")


def test_another_accounts_slow_connections_leave_the_annotators_served(sources, tmp_path):
    """Another local account opens 40 connections and trickles header lines into them: it gets its
    own few places (the rest 503 at once), each closed at the request deadline, and the annotator
    (this account) signs in and is served throughout (issue 27 item 4)."""
    from chexpercept.builder.review.server import MAX_PEER_PENDING

    _prepare(sources, tmp_path / "rev")
    server, _ = serve_in_thread(tmp_path / "rev", connection_timeout=3.0)
    port = server.server_address[1]
    try:
        with other_account() as account:
            flood = run_as(account, trickle_clients, port, 40, 0.3, 10.0)
            assert flood.receive() == {"opened": 40}
            statuses = []
            for _ in range(3):
                cookie = _sign_in(server, "A")
                statuses.append(_request(port, "GET", "/annotate/A/api/cases", cookie=cookie)[0])
            flooded = flood.receive()
            flood.stop()
    finally:
        server.shutdown()
        server.server_close()
    assert statuses == [200, 200, 200]
    refused = [c for c in flooded if c["answer"].startswith("HTTP/1.1 503")]
    assert len(flooded) - len(refused) == MAX_PEER_PENDING
    assert all(c["closed"] is not None for c in flooded)  # 503 at once, or closed at the deadline
    assert f"not yet signed in from one account (uid {account.pw_uid})" in refused[0]["answer"]


# ------------------------------------------------------------------------------- what is served
def test_review_json_cannot_point_outside_its_folders(sources, tmp_path):
    root = tmp_path / "rev"
    _prepare(sources, root)
    manifest = json.loads((root / "review.json").read_text())
    secret = tmp_path / "secret.png"
    Image.new("RGB", (4, 4)).save(secret)
    manifest["items"][0]["cxr"] = str(secret)
    positive = next(i for i in manifest["items"] if i["overlay"])
    positive["overlay"] = "../secret.png"
    (root / "review.json").write_text(json.dumps(manifest))
    with pytest.raises(SourceError) as e:
        make_server(root, port=0)
    assert f"{manifest['items'][0]['key_id']}: cxr" in str(e.value)
    assert f"{positive['key_id']}: overlay '../secret.png' has a '..' part" in str(e.value)


def _exif_jpeg(path, orientation):
    """Rewrite the JPEG at path with a white block in its top-left corner and an EXIF orientation."""
    with Image.open(path) as im:
        arr = np.asarray(im.convert("L")).copy()
    h, w = arr.shape
    arr[: h // 4, : w // 4] = 255
    arr[h // 4 :, :] = np.minimum(arr[h // 4 :, :], 60)
    arr[: h // 4, w // 4 :] = 0
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(arr).save(path, format="JPEG", quality=95, exif=exif)


def test_the_cxr_is_served_as_the_pipeline_decodes_it(sources, tmp_path):
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(sources, copy)
    root = tmp_path / "rev"
    src = ReviewSources(
        mimic_cxr_jpg=str(copy / "mimic-cxr-jpg"), mimic_ils=str(copy / "mimic-ils"), lesions=LESIONS
    )
    prepare(root, src, annotators=1, progress=False)
    item = json.loads((root / "review.json").read_text())["items"][0]
    _exif_jpeg(item["cxr"], orientation=6)  # "rotate 90 degrees clockwise to display"
    with Image.open(item["cxr"]) as im:
        assert im.getexif()[0x0112] == 6
    server, _ = serve_in_thread(root)
    try:
        a = _sign_in(server, "A")
        status, headers, body = _request(
            server.server_address[1], "GET", f"/annotate/A/image/{item['key_id']}/cxr", cookie=a
        )
    finally:
        server.shutdown()
        server.server_close()
    assert status == 200 and headers["Content-Type"] == "image/png"
    with Image.open(io.BytesIO(body)) as served:
        assert served.format == "PNG" and not served.getexif() and "exif" not in served.info
        pixels = np.asarray(served.convert("RGB"))
    expected = load_cxr(item["cxr"]).rgb  # what generate and the mask overlay use: not rotated
    np.testing.assert_array_equal(pixels, expected)
    assert (
        pixels.shape == (1024, 1024, 3)
        and pixels[:100, :100].mean() > 200
        and pixels[:100, -100:].mean() < 60
    )
    os.utime(item["cxr"])  # a replaced source is decoded again, not served from the cache
