"""Who owns a TCP socket on this machine: the kernel's socket tables, ``/proc/net/tcp`` and
``/proc/net/tcp6`` (Linux), read once per question.

Each line names a socket's local and remote address, its state and the uid of its owner. The
addresses are written as hexadecimal words in the host's byte order; an IPv4 peer of a dual-stack
(IPv6) socket appears as an IPv4-mapped address (``::ffff:127.0.0.1``), which is compared here as the
IPv4 address it maps. A socket a server accepted carries the uid of the socket that listened; a
connection not yet accepted (SYN_RECV) is listed with the listener's uid too.

Used by ``chexpercept.peer`` (the owner of the server a client reached) and by the review server
(the account behind each connection it accepts).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Iterator
from dataclasses import dataclass

#: the kernel's TCP socket tables (IPv4, IPv6)
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
#: the state column of a listening socket
LISTEN = "0A"
#: the state column of a closed or closing socket that no longer belongs to a connection
_GONE = {"06", "07"}  # TIME_WAIT, CLOSE


class TableUnavailable(OSError):
    """This system has no readable socket table (not Linux, or /proc is hidden)."""


Address = tuple[str, int]


@dataclass(frozen=True)
class TcpSocket:
    """One line of the table: addresses as canonical IP strings and ports."""

    local: Address
    remote: Address
    #: the state column, two hexadecimal digits (``0A`` LISTEN, ``01`` ESTABLISHED)
    state: str
    uid: int
    #: the socket's inode; 0 for a connection the server has not accepted yet, which kernels before
    #: 6.15 list with uid 0 (root) whoever listens (None where the table has no such column)
    inode: int | None = None


def canonical_ip(ip: str) -> str:
    """``ip`` as one spelling: an IPv4-mapped IPv6 address as its IPv4 address, a zone (``%eth0``)
    dropped, IPv6 compressed. Raises ValueError when ``ip`` is no IP address."""
    parsed = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return str(parsed)


def _address(text: str) -> Address:
    """``0100007F:1F90`` -> ("127.0.0.1", 8080): 32-bit words in the host's byte order, the port
    in hexadecimal."""
    hex_ip, hex_port = text.split(":")
    raw = bytes.fromhex(hex_ip)
    words = [raw[i : i + 4] for i in range(0, len(raw), 4)]
    if sys.byteorder == "little":
        words = [w[::-1] for w in words]
    packed = b"".join(words)
    return canonical_ip(str(ipaddress.ip_address(packed))), int(hex_port, 16)


def sockets(*, port: int | None = None, tables: tuple[str, ...] = TABLES) -> Iterator[TcpSocket]:
    """The TCP sockets of this machine's network namespace, those with local ``port`` only when
    given (lines of other ports are not decoded). Raises TableUnavailable when no table is readable."""
    wanted = None if port is None else f":{port:04X} "
    read_any = False
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            if wanted is not None and wanted not in line[:60]:
                continue
            fields = line.split()
            if len(fields) < 8:
                continue
            local = _address(fields[1])
            if port is not None and local[1] != port:
                continue
            inode = int(fields[9]) if len(fields) > 9 and fields[9].isdigit() else None
            yield TcpSocket(local, _address(fields[2]), fields[3], int(fields[7]), inode)
    if not read_any:
        raise TableUnavailable(f"no readable TCP socket table ({', '.join(tables)})")


#: ESTABLISHED: a connection both ends still hold
ESTABLISHED = "01"


def still_open(ours: Address, peer: Address, *, tables: tuple[str, ...] = TABLES) -> bool:
    """Whether this machine's end of the connection from ``ours`` to ``peer`` is still ESTABLISHED
    (the peer has not closed it: not CLOSE_WAIT, not gone). Raises TableUnavailable."""
    ours = (canonical_ip(ours[0]), ours[1])
    peer = (canonical_ip(peer[0]), peer[1])
    return any(
        s.local == ours and s.remote == peer and s.state == ESTABLISHED
        for s in sockets(port=ours[1], tables=tables)
    )


def owner(local: Address, remote: Address, *, tables: tuple[str, ...] = TABLES) -> int | None:
    """The uid owning the socket of this machine whose local address is ``local`` and whose peer is
    ``remote`` (one end of a connection), else the uid of the socket listening on ``local`` (its
    address or a wildcard one) when exactly one account listens there; None when nobody does.

    Addresses are (IP, port) with any IP spelling (canonical_ip). Raises TableUnavailable.
    """
    local = (canonical_ip(local[0]), local[1])
    remote = (canonical_ip(remote[0]), remote[1])
    listeners: set[int] = set()
    for s in sockets(port=local[1], tables=tables):
        if s.state == LISTEN:
            if s.local[0] in (local[0], "0.0.0.0", "::"):
                listeners.add(s.uid)
        elif s.local == local and s.remote == remote and s.state not in _GONE:
            if s.inode == 0:  # not accepted yet: its uid says nothing (0 on older kernels); the
                continue  # listener's decides (red team, stop 48 round 2: another account's slow
                # server was taken for root's and received an image)
            return s.uid
    return listeners.pop() if len(listeners) == 1 else None
