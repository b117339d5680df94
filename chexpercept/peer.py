"""The one rule for whom the toolkit's bytes go to: the peer actually reached, never a stand-in.

Every HTTP client of the toolkit decides its peer here: the openai backend (the images; through
``chexpercept.peer_http.images_session``) and huggingface_hub (model weights and code, the Hub token,
uploads; through ``chexpercept.peer_http.guard_hub``, installed whenever huggingface_hub is imported
in a process that imported chexpercept).

An endpoint is **declared** when the user vouched for it (``--dua-compliant-endpoint``; a Hub
endpoint that is not loopback, a public service that receives no credentialed data). Then:

- **Proxies**: a declared ``https://`` endpoint may be reached through the proxies of the
  environment (``HTTPS_PROXY``, ``ALL_PROXY`` with ``NO_PROXY``), as urllib reads them: the proxy
  then relays a TLS tunnel it cannot read, the endpoint is the peer that reads. Any other endpoint
  is reached directly, whatever the environment says: a proxy would be the peer. A declared
  ``http://`` endpoint was reached through ``HTTP_PROXY``, which read the images in the clear (red
  team, stop 43).
- **Sockets on this machine**: whatever a URL's host is spelled as (``127.0.0.1``, ``127.1``, ``0``,
  ``2130706433``, ``localhost``, a name in /etc/hosts, this machine's own network address), each new
  connection that is not declared is judged, once made and before a byte is sent, by the address it
  actually reached: an address of this machine (loopback, or one this machine can bind) must be served
  by a socket of this account (or of root, who can read everything anyway). On a shared server
  another account can listen on the port the user's own server left free; the owner of the socket
  that accepted the connection is read from the kernel's socket table (``chexpercept.tcp_table``, one
  read per new connection). An endpoint that must be on this machine (the images of an undeclared
  endpoint) is refused when the connection reached another one; one that may be remote (the public
  Hub) is not. Where this system has no such table (not Linux), a warning says the owner cannot be
  checked, once per process.

A refused peer raises ``PeerRefused``, whose message names the owner (account name and uid), what
would have been sent and how to vouch for the endpoint.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import threading
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import tcp_table
from .errors import Refused

DUA_FLAG = "--dua-compliant-endpoint"


class PeerRefused(Refused):
    """A connection reached a peer the rule refuses (another account's socket, a non-loopback
    address for a loopback endpoint); the message says which and what to do."""


class PeerGone(ConnectionError):
    """The connection's peer closed it before its owner could be told (the server stopped, or
    dropped the connection): nothing was sent; a connection error like any other, retried as one."""


@dataclass(frozen=True)
class Route:
    """How one endpoint may be reached (``route``)."""

    #: the endpoint, as the user gave it
    url: str
    #: what goes there, for messages ("CheXpercept images")
    what: str
    #: the user vouched for the endpoint: proxies of the environment allowed, peers not checked
    declared: bool
    #: how the user vouches for this endpoint, for messages (e.g. "rerun with --dua-compliant-endpoint")
    vouch: str
    #: the peer may be another machine (the public Hub): its proxies from the environment are used,
    #: and only a connection that lands on this machine is checked (it must be this account's)
    remote_ok: bool = False

    @property
    def checks_peer(self) -> bool:
        """Each new connection is checked (``check_peer``)."""
        return not self.declared

    def proxy(self, url: str | None = None) -> str | None:
        """The proxy a request to ``url`` (default: the endpoint) goes through: one from the
        environment (``environment_proxy``) for one that may be remote (the public Hub) and for an
        ``https://`` URL of a declared endpoint (the proxy relays TLS it cannot read), else None
        (direct)."""
        url = url or self.url
        if self.remote_ok:  # the public Hub: no credentialed data goes there
            return environment_proxy(url)
        if not self.declared or urlsplit(url).scheme.lower() != "https":
            return None
        return environment_proxy(url)


def is_loopback_host(host: str) -> bool:
    """Whether a URL's host names this machine's loopback: ``localhost`` (and names under
    ``.localhost``), any 127.x.y.z, ``::1``, an IPv4-mapped loopback address (``::ffff:127.0.0.1``)."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(tcp_table.canonical_ip(host)).is_loopback
    except ValueError:
        return False


def route(url: str, *, what: str, declared: bool, vouch: str, remote_ok: bool = False) -> Route:
    """The route to ``url``: ``declared`` says the user vouched for it, ``remote_ok`` that it may be
    another machine (see the module docstring). Raises ValueError for a URL that is not http(s) with
    a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    return Route(url=url, what=what, declared=declared, vouch=vouch, remote_ok=remote_ok)


_LOCAL: dict[str, bool] = {}


def is_this_machine(ip: str) -> bool:
    """Whether an IP address is this machine's: loopback, a wildcard (``0.0.0.0``, ``::``, which
    connect here), or one of its network addresses (one a socket can be bound to)."""
    ip = tcp_table.canonical_ip(ip)
    known = _LOCAL.get(ip)
    if known is not None:
        return known
    address = ipaddress.ip_address(ip)
    local = address.is_loopback or address.is_unspecified
    if not local:
        import socket

        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((ip, 0))
            local = True
        except OSError:
            local = False
    _LOCAL[ip] = local
    return local


def host_is_this_machine(host: str) -> bool:
    """Whether a URL's host reaches this machine, by what it resolves to (any of its addresses),
    whatever its spelling; a name that does not resolve is not."""
    import socket

    host = host.strip("[]")
    if is_loopback_host(host):
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    return any(is_this_machine(str(info[4][0])) for info in infos)


def environment_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``<scheme>_proxy``, else ``all_proxy``; upper or
    lower case), None when there is none or ``no_proxy`` lists the host (urllib's reading)."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


def account_name(uid: int) -> str:
    """``name (uid N)`` for a uid, or ``uid N`` when it has no name here."""
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


_warned_unchecked = threading.Event()


def check_peer(r: Route, peer: tuple[str, int], local: tuple[str, int]) -> None:
    """Raise PeerRefused unless a connection of ``r`` from ``local`` to ``peer`` (the addresses the
    socket reports: getsockname and getpeername) may carry bytes. Nothing to check for a declared
    endpoint. Costs one read of the kernel's socket table (``chexpercept.tcp_table``)."""
    if not r.checks_peer:
        return
    ip = tcp_table.canonical_ip(str(peer[0]))
    where = f"{r.url} (connected to {ip} port {peer[1]})"
    if not is_this_machine(ip):
        if r.remote_ok:
            return  # another machine (the public Hub, or a proxy for it)
        raise PeerRefused(
            f"refusing to send {r.what} to {where}: the name resolved to an address that is not this "
            f"machine's. Use a loopback address (127.0.0.1), or, if that host is allowed to "
            f"receive them, {r.vouch}"
        )
    try:
        uid = tcp_table.owner((ip, int(peer[1])), (str(local[0]), int(local[1])))
    except tcp_table.TableUnavailable:
        if not _warned_unchecked.is_set():
            _warned_unchecked.set()
            print(
                f"warning: cannot check which account serves {r.url} on this system (no /proc/net/tcp); "
                "on a shared machine another account could be listening on that port",
                file=sys.stderr,
            )
        return
    mine = os.geteuid()
    if uid in (mine, 0):
        return
    if uid is None and not tcp_table.still_open((str(local[0]), int(local[1])), (ip, int(peer[1]))):
        # the server went away while the connection was being checked (it closed it, or it stopped):
        # an outage, never a refusal that advises to stop checking (red team, stop 48)
        raise PeerGone(f"{where} closed the connection before its owner could be told; nothing was sent")
    if uid is None:
        raise PeerRefused(
            f"refusing to send {r.what} to {where}: no socket of this machine's table serves that "
            f"connection, so its owner cannot be told. If the server is allowed to receive them, {r.vouch}"
        )
    raise PeerRefused(
        f"refusing to send {r.what} to {where}: the socket serving it belongs to account "
        f"{account_name(uid)}, not to you ({account_name(mine)}). Another account may be listening on "
        f"the port your own server left free (is it running?). If that account's server is allowed "
        f"to receive them, {r.vouch}"
    )
