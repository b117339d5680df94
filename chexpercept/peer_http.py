"""The toolkit's HTTP clients, each built to follow ``chexpercept.peer``'s rule.

- ``images_session(route)``: the openai backend's aiohttp session. Environment proxies only for a
  declared ``https://`` endpoint (``trust_env``; ``peer.Route.proxy``); otherwise a connector that checks each new connection's peer
  (``peer.check_peer``) after it is made and before the request is written, and closes it when
  refused.
- ``guard_hub()``: huggingface_hub's HTTP client (its ``set_client_factory``) with a transport that
  decides each request's route by its URL: a loopback host (an ``HF_ENDPOINT`` such as
  ``http://127.0.0.1:PORT``, or a redirect there) is reached directly and each new connection is
  checked; any other host is declared (the public Hub receives no credentialed data) and goes through
  the environment's proxies as urllib reads them. ``chexpercept.registration`` installs it whenever
  huggingface_hub is imported in a process that imported chexpercept.
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from typing import Any
from urllib.parse import urlsplit

from .peer import PeerGone, Route, check_peer, host_is_this_machine, route

#: what goes to a loopback Hub endpoint, and how to get past a refusal, for PeerRefused's message
HUB_WHAT = "Hugging Face Hub requests (your token; answers loaded as model weights and code)"
HUB_VOUCH = (
    "serve it under your own account, or point HF_ENDPOINT at an address that is not loopback if that "
    "server is to be trusted"
)


# ------------------------------------------------------------------------------------ aiohttp
def images_session(r: Route, **kwargs: Any) -> Any:
    """An ``aiohttp.ClientSession`` for the endpoint of ``r`` (keyword arguments go to the session):
    no pool limit of its own, environment proxies only when ``r`` is declared, and each new
    connection's peer checked when ``r`` checks peers (on a worker thread: the event loop goes on
    with the requests in flight). Call inside the event loop that uses it."""
    import aiohttp

    connector = _checked_connector(r) if r.checks_peer else aiohttp.TCPConnector(limit=0)
    # the environment's proxies only where Route.proxy takes them: a declared https:// endpoint
    through_proxies = r.declared and urlsplit(r.url).scheme.lower() == "https"
    return aiohttp.ClientSession(connector=connector, trust_env=through_proxies, **kwargs)


def _checked_connector(r: Route) -> Any:
    """A TCPConnector whose new connections are checked (``peer.check_peer``) before use."""
    import aiohttp

    class CheckedConnector(aiohttp.TCPConnector):
        def __init__(self) -> None:
            super().__init__(limit=0)
            self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

        async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
            conn = await super().connect(req, traces, timeout)
            protocol = conn.protocol
            if protocol is None or protocol in self._checked:
                return conn  # a kept-alive connection, checked when it was made
            transport = conn.transport
            try:
                if transport is None:
                    raise PeerGone(
                        f"the connection to {r.url} closed before it could be checked; nothing was sent"
                    )
                # reading /proc/net/tcp{,6} takes 50-100 ms on a loaded machine: off the event loop,
                # so that the requests already in flight go on meanwhile
                peer, ours = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
                await asyncio.to_thread(check_peer, r, peer, ours)
            except BaseException:
                conn.close()  # never returned to the pool
                raise
            self._checked.add(protocol)
            return conn

    return CheckedConnector()


# ------------------------------------------------------------------------------------ huggingface_hub
def _hub_route(url: str) -> Route:
    """A host that reaches this machine (however spelled: judged by what it resolves to) is reached
    directly; any other may go through the environment's proxies (the public Hub). Every connection,
    direct or to a proxy, that lands on this machine must be this account's socket."""
    return route(
        url, what=HUB_WHAT, declared=False, vouch=HUB_VOUCH, remote_ok=not host_is_this_machine(_host(url))
    )


def _host(url: str) -> str:
    return urlsplit(url).hostname or ""


def _tracer(r: Route, chained: Any) -> Any:
    """An httpcore ``trace`` extension that checks each new TCP connection of ``r`` (event
    ``connection.connect_tcp.complete``, whose return value is the network stream)."""

    def trace(name: str, info: dict[str, Any]) -> None:
        if chained is not None:
            chained(name, info)
        if name != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        if stream is None:
            return
        try:
            check_peer(r, stream.get_extra_info("server_addr"), stream.get_extra_info("client_addr"))
        except BaseException:
            stream.close()
            raise

    return trace


def hub_transport(httpx: Any) -> Any:
    """An ``httpx.BaseTransport`` (``httpx`` is the module huggingface_hub uses: httpx or httpx2)
    that sends each request along ``peer``'s route for its URL (see the module docstring)."""

    class HubTransport(httpx.BaseTransport):
        def __init__(self) -> None:
            self._direct = httpx.HTTPTransport()
            self._proxied: dict[str, Any] = {}

        def handle_request(self, request: Any) -> Any:
            url = str(request.url)
            r = _hub_route(url)
            proxy = r.proxy(url)
            if r.checks_peer:  # the connection's real peer (the server, or the proxy) is checked
                extensions = dict(request.extensions)
                extensions["trace"] = _tracer(r, extensions.get("trace"))
                request.extensions = extensions
            if proxy is None:
                transport = self._direct
            else:
                transport = self._proxied.get(proxy)
                if transport is None:
                    transport = self._proxied[proxy] = httpx.HTTPTransport(proxy=proxy)
            return transport.handle_request(request)

        def close(self) -> None:
            self._direct.close()
            for transport in self._proxied.values():
                transport.close()

    return HubTransport()


#: seconds a Hub call that sets no deadline of its own waits for a connection or for the next bytes
HUB_TIMEOUT = 120.0


def guard_hub() -> None:
    """Make huggingface_hub's HTTP client follow the rule (idempotent): its default client, with
    the transport ``hub_transport`` and no proxies of its own from the environment."""
    from huggingface_hub.utils import _http

    current = getattr(_http, "_GLOBAL_CLIENT_FACTORY", None)
    if getattr(current, "chexpercept_peer", False):
        return
    default = _http.default_client_factory

    def client_factory() -> Any:
        base = default()
        httpx = sys.modules[type(base).__module__.split(".")[0]]
        # a Hub that takes the connection and never answers ended no call (leaderboard waited for
        # ever; red team, stop 44): calls that set no deadline of their own get HUB_TIMEOUT
        unbounded = all(
            getattr(base.timeout, part, None) is None for part in ("connect", "read", "write", "pool")
        )
        client = httpx.Client(
            event_hooks=base.event_hooks,
            follow_redirects=base.follow_redirects,
            timeout=httpx.Timeout(HUB_TIMEOUT) if unbounded else base.timeout,
            headers=base.headers,
            trust_env=False,
            transport=hub_transport(httpx),
        )
        base.close()
        return client

    client_factory.chexpercept_peer = True  # type: ignore[attr-defined]
    _http.set_client_factory(client_factory)
