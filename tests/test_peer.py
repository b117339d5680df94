"""The peer actually reached (issue 27 item 1): images go to the endpoint named, never through a proxy
from the environment unless the endpoint was declared DUA-compliant, and never to a loopback socket
of another account; the same for huggingface_hub's requests to a loopback HF_ENDPOINT.

Another account is real: created with useradd (tests run as root in CI) and listening from a forked
child (tests/other_account.py)."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from huggingface_hub import constants

from chexpercept import tcp_table
from chexpercept.bundle import read_bundle
from chexpercept.eval.protocol import BackendError
from chexpercept.eval.run import main as run_main
from chexpercept.peer import environment_proxy, is_loopback_host

sys.path.insert(0, str(Path(__file__).parent))
from fake_hub import FakeHub, FakeModel
from fake_openai import FakeServer, backend_for, run_cases
from local_http import LocalServer
from other_account import http_server, other_account, run_as


@pytest.fixture
def account():
    with other_account() as user:
        yield user


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


class FakeProxy:
    """Records every request it gets (an HTTP proxy sees absolute URLs) and answers 502."""

    def carried(self, host_port: str) -> list[str]:
        """The requests it got for an endpoint (``host_port`` as it appears in the request line).
        huggingface_hub (2.4) also asks the Hub it was imported with for its agent-harness list;
        that is the library's own request for public metadata, not one of the endpoint's."""
        return [r for r in self.requests if host_port in r]

    def __init__(self) -> None:
        self.requests: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                proxy.requests.append(f"{self.command} {self.path}")
                self.send_response(502)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_HEAD = do_CONNECT = _any

        self.httpd = LocalServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_proxy(monkeypatch, no_proxy_env):
    """HTTP_PROXY and HTTPS_PROXY point at a local proxy; NO_PROXY is unset."""
    proxy = FakeProxy()
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    yield proxy
    proxy.close()


def _one_case(fixture_bundle):
    return read_bundle(fixture_bundle, lesions=["effusion"], paths=["RR"])


class _Endpoint:
    def __init__(self, url: str):
        self.url = url


# ------------------------------------------------------------------------------ the socket table
@pytest.mark.parametrize(
    ("listen", "connect"),
    [("127.0.0.1", "127.0.0.1"), ("127.0.0.2", "127.0.0.2"), ("::1", "::1"), ("::", "127.0.0.1")],
)
def test_the_owner_of_a_loopback_socket_is_read_in_every_spelling(listen, connect):
    family = socket.AF_INET6 if ":" in listen else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    if listen == "::":
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 peers appear mapped
    try:
        listener.bind((listen, 0))
    except OSError as e:
        pytest.skip(f"cannot listen on {listen} here: {e}")
    listener.listen()
    port = listener.getsockname()[1]
    with socket.create_connection((connect, port)) as client:
        server, _ = listener.accept()
        assert tcp_table.owner(client.getpeername()[:2], client.getsockname()[:2]) == os.geteuid()
        assert tcp_table.owner(server.getpeername()[:2], server.getsockname()[:2]) == os.geteuid()
        server.close()
    listener.close()
    assert tcp_table.canonical_ip("::ffff:127.0.0.1") == "127.0.0.1"


def test_loopback_names_and_addresses():
    for host in ("localhost", "LOCALHOST.", "api.localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"):
        assert is_loopback_host(host), host
    assert is_loopback_host("::ffff:127.0.0.1")  # IPv4-mapped
    for host in ("10.0.0.5", "api.openai.com", "localhost.example.com", "::ffff:10.0.0.5", "0.0.0.0"):
        assert not is_loopback_host(host), host


def test_environment_proxy_is_read_as_urllib_reads_it(monkeypatch, no_proxy_env):
    assert environment_proxy("https://huggingface.co/api/models/x") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert environment_proxy("https://huggingface.co/api/models/x") == "http://proxy:3128"
    assert environment_proxy("http://huggingface.co/x") is None  # no HTTP_PROXY
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    assert environment_proxy("https://huggingface.co/api/models/x") is None


# ------------------------------------------------------------------------------ openai backend
@pytest.mark.parametrize(
    ("listen", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1", "localhost"),
        ("127.0.0.2", "127.0.0.2"),
        ("::1", "[::1]"),
        ("::", "127.0.0.1"),  # a dual-stack socket: the connection is listed as ::ffff:127.0.0.1
    ],
)
def test_a_loopback_endpoint_of_another_account_is_refused_naming_the_owner(
    account, fixture_bundle, listen, host
):
    other = run_as(account, http_server, listen, True)
    port = other.receive()["port"]
    backend = backend_for(_Endpoint(f"http://{host}:{port}/v1"))
    try:
        with pytest.raises(BackendError) as e:
            run_cases(backend, _one_case(fixture_bundle))
    finally:
        backend.close()
        counts = other.stop()[-1]
    message = str(e.value)
    assert f"{account.pw_name!r} (uid {account.pw_uid})" in message and "--dua-compliant-endpoint" in message
    assert counts["bytes"] == 0  # connected, checked, closed: not one byte of the request


def test_the_flag_lets_a_declared_server_of_another_account_receive_them(account, fixture_bundle):
    other = run_as(account, http_server, "127.0.0.1", True)
    port = other.receive()["port"]
    backend = backend_for(_Endpoint(f"http://127.0.0.1:{port}/v1"), dua_compliant_endpoint=True)
    try:
        results = run_cases(backend, _one_case(fixture_bundle))
    finally:
        backend.close()
        counts = other.stop()[-1]
    assert len(results) == 1 and counts["requests"] >= 1


def test_a_server_that_changed_hands_is_refused_at_the_next_connection(account, fixture_bundle):
    """The user's server answers, then stops; another account takes its port: the next connection
    of the same run is refused (the check holds for each connection, not only at the start)."""
    bundle = _one_case(fixture_bundle)
    with FakeServer() as server:
        backend = backend_for(server)
        assert len(run_cases(backend, bundle)) == 1
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    other = run_as(account, http_server, "127.0.0.1", True, port)
    assert other.receive()["port"] == port
    try:
        with pytest.raises(BackendError, match=f"account {account.pw_name!r}"):
            run_cases(backend, bundle)
    finally:
        backend.close()
        counts = other.stop()[-1]
    assert counts["bytes"] == 0


def test_the_run_command_says_who_owns_the_port_and_which_flag_vouches(
    account, fixture_bundle, tmp_path, capsys
):
    other = run_as(account, http_server, "127.0.0.1", True)
    port = other.receive()["port"]
    try:
        rc = run_main(
            [
                *("--data-dir", str(fixture_bundle), "--model", "local-vlm", "--backend", "openai"),
                *("--base-url", f"http://127.0.0.1:{port}/v1", "--output-dir", str(tmp_path)),
                *("--no-progress", "--paths", "RF", "--max-retries", "0"),
            ]
        )
    finally:
        counts = other.stop()[-1]
    err = capsys.readouterr().err
    assert rc != 0 and f"account {account.pw_name!r} (uid {account.pw_uid})" in err
    assert "--dua-compliant-endpoint" in err and counts["bytes"] == 0


def test_environment_proxies_never_carry_the_images_of_an_undeclared_endpoint(fixture_bundle, fake_proxy):
    with FakeServer() as server:
        backend = backend_for(server)
        try:
            assert len(run_cases(backend, _one_case(fixture_bundle))) == 1
        finally:
            backend.close()
    assert fake_proxy.requests == [] and len(server.requests) >= 1


def test_a_declared_http_endpoint_is_reached_directly_whatever_the_proxy_variables_say(
    fixture_bundle, fake_proxy
):
    """--dua-compliant-endpoint with an http:// endpoint went through HTTP_PROXY, which read the
    images in the clear: the user vouched for the endpoint, not for the proxy (red team, stop 43).
    Only an https:// endpoint goes through the environment's proxy, which then relays a TLS tunnel it
    cannot read."""
    from chexpercept.peer import route

    with FakeServer() as server:
        backend = backend_for(server, dua_compliant_endpoint=True)
        try:
            assert len(run_cases(backend, _one_case(fixture_bundle))) == 1
        finally:
            backend.close()
    assert fake_proxy.requests == [] and len(server.requests) >= 1
    declared = route("https://api.example.org/v1", what="images", declared=True, vouch="")
    assert declared.proxy() == fake_proxy.url
    assert route("http://10.0.0.5/v1", what="images", declared=True, vouch="").proxy() is None


# ------------------------------------------------------------------------------ huggingface_hub
@pytest.fixture
def online(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_a_loopback_hub_of_another_account_is_refused_naming_the_owner(account, online, monkeypatch):
    from chexpercept.eval.weights import HubError, resolve_weights

    other = run_as(account, http_server, "127.0.0.1", True)
    port = other.receive()["port"]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(HubError) as e:
            resolve_weights("org/toy")
    finally:
        counts = other.stop()[-1]
    assert f"account {account.pw_name!r} (uid {account.pw_uid})" in str(e.value)
    assert counts["bytes"] == 0


def test_leaderboard_against_a_hub_of_another_account_is_one_line(account, online, monkeypatch, capsys):
    """Final red team: a command that reads the Hub (``leaderboard``) with HF_ENDPOINT at another
    account's loopback server ends with one line naming the owner (chexpercept.errors.Refused)."""
    from chexpercept.cli import main as cli

    other = run_as(account, http_server, "127.0.0.1", True)
    port = other.receive()["port"]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    try:
        status = cli(["leaderboard", "org/bench"])
    finally:
        counts = other.stop()[-1]
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("chexpercept leaderboard: ") and err.count("\n") == 1, err
    assert f"account {account.pw_name!r} (uid {account.pw_uid})" in err and "Traceback" not in err
    assert counts["bytes"] == 0


def _own_address() -> str | None:
    """This machine's first non-loopback address, if it has one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


@pytest.mark.parametrize("spelling", ["127.1", "0", "2130706433", "0x7f000001", "own-address"])
def test_a_hub_on_this_machine_is_judged_by_the_address_reached_not_its_spelling(
    account, online, monkeypatch, fake_proxy, spelling
):
    """Red team (issue 27): HF_ENDPOINT spelled so that it does not read as loopback, served by
    another account on this machine: refused naming the owner; no token and nothing through a proxy."""
    from chexpercept.eval.weights import HubError, resolve_weights

    host = _own_address() if spelling == "own-address" else spelling
    if host is None:
        pytest.skip("this machine has no address but loopback")
    other = run_as(account, http_server, "0.0.0.0", True)
    port = other.receive()["port"]
    monkeypatch.setenv("HF_ENDPOINT", f"http://{host}:{port}")
    monkeypatch.setenv("HF_TOKEN", "hf_notforthem")
    try:
        with pytest.raises(HubError) as e:
            resolve_weights("org/toy")
    finally:
        counts = other.stop()[-1]
    assert f"account {account.pw_name!r} (uid {account.pw_uid})" in str(e.value)
    assert counts["bytes"] == 0 and fake_proxy.carried(f":{port}") == []


def test_a_loopback_hub_is_reached_directly_whatever_the_proxy_variables_say(online, monkeypatch, fake_proxy):
    from chexpercept.eval.weights import resolve_weights

    hub = FakeHub().start()
    hub.models["org/toy"] = FakeModel({"config.json": b"{}"})
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    try:
        weights = resolve_weights("org/toy")
    finally:
        hub.stop()
    assert weights.commit == hub.models["org/toy"].commit and hub.downloads()
    assert fake_proxy.carried(":" + hub.url.rsplit(":", 1)[1]) == []


def test_a_public_hub_goes_through_the_environment_proxy(online, monkeypatch, fake_proxy):
    from chexpercept.eval.weights import HubError, resolve_weights

    monkeypatch.setenv("HF_ENDPOINT", "http://hub.example.invalid")
    with pytest.raises(HubError):
        resolve_weights("org/toy")
    assert any("GET http://hub.example.invalid/api/models/org/toy" in r for r in fake_proxy.requests)


@pytest.mark.parametrize(
    "order", ["import chexpercept\nimport huggingface_hub", "import huggingface_hub\nimport chexpercept"]
)
def test_every_process_that_imports_chexpercept_guards_huggingface_hub(order):
    code = (
        f"{order}\nfrom huggingface_hub.utils import _http\n"
        "print(getattr(_http._GLOBAL_CLIENT_FACTORY, 'chexpercept_peer', False))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_a_server_that_closed_the_connection_before_its_check_is_an_outage_never_a_refusal(monkeypatch):
    """Red team, stop 48: a server killed while a run sent made the check of a new connection find
    no socket serving it, which was taken for a refusal ("rerun with --dua-compliant-endpoint") that
    stopped the run even under --on-error record (3 of 5 tries). A peer that closed the connection
    (our end in CLOSE_WAIT, or gone) is a connection error, retried as one, with nothing sent; a
    connection still open whose peer no socket of this machine's table holds (another network
    namespace) is still refused."""
    from chexpercept.peer import PeerGone, PeerRefused, check_peer, route

    r = route(
        "http://127.0.0.1:9/v1", what="images", declared=False, vouch="rerun with --dua-compliant-endpoint"
    )
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_end, _ = listener.accept()
    peer, ours = client.getpeername(), client.getsockname()
    check_peer(r, peer, ours)  # this account's server: passes
    server_end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    server_end.close()  # killed: the connection reset, the server's socket and its listener gone
    listener.close()
    with pytest.raises(PeerGone, match="closed the connection before its owner could be told"):
        check_peer(r, peer, ours)
    client.close()
    with pytest.raises(PeerGone):  # our end closed too
        check_peer(r, peer, ours)
    # a connection that both ends still hold, whose peer the table does not show: refused as before
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server_end, _ = listener.accept()
    monkeypatch.setattr(tcp_table, "owner", lambda local, remote, **kw: None)
    with pytest.raises(PeerRefused, match="no socket of this machine's table serves that connection"):
        check_peer(r, client.getpeername(), client.getsockname())
    for s in (client, server_end, listener):
        s.close()


def test_a_connection_not_yet_accepted_is_judged_by_its_listener(tmp_path):
    """Red team, stop 48 round 2: kernels before 6.15 list a connection the server has not accepted
    yet with uid 0 and inode 0; the check took it for root's, and another account's server that
    accepts late received an image. Such a line says nothing of its owner: the listener's uid does."""
    from chexpercept.tcp_table import owner

    def line(n, local, remote, state, uid, inode):
        return (
            f"{n:4d}: {local} {remote} {state} 00000000:00000000 00:00000000 00000000 {uid:5d} 0 {inode} 1 0"
        )

    header = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"
    )
    listener = line(0, "0100007F:1F90", "00000000:0000", "0A", 1234, 5555)
    pending = line(1, "0100007F:1F90", "0100007F:C350", "01", 0, 0)  # accept queue: uid 0, inode 0
    client = line(2, "0100007F:C350", "0100007F:1F90", "01", 0, 6666)
    table = tmp_path / "tcp"
    table.write_text("\n".join([header, listener, pending, client]) + "\n")
    assert owner(("127.0.0.1", 8080), ("127.0.0.1", 50000), tables=(str(table),)) == 1234
    accepted = line(1, "0100007F:1F90", "0100007F:C350", "01", 0, 7777)  # root's, once accepted
    table.write_text("\n".join([header, listener, accepted, client]) + "\n")
    assert owner(("127.0.0.1", 8080), ("127.0.0.1", 50000), tables=(str(table),)) == 0
