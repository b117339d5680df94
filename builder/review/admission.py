"""Which connections the review server takes: limits that no one account can exhaust for everyone.

A connection is **pending** from its accept until one of its requests carries an annotator's valid
credentials (the token link or the cookie); from then on it is **trusted**. At once, at most:

- ``max_connections`` connections are open (one thread each);
- ``max_pending`` of them are pending, so trusted connections (annotators at work) always have
  ``max_connections - max_pending`` places that unauthenticated ones cannot take;
- ``max_peer_pending`` are pending from one peer: the local account behind the connection (the
  owner of the client's socket in the kernel's socket table, ``chexpercept.tcp_table``; an SSH
  tunnel's connections are its user's), or its address where no table can be read. Another account's
  slow or many connections take its own places, not the annotators'.

A connection over a limit is answered 503 at once and closed. Each request has a deadline (the
server's ``connection_timeout``), so a pending place is held at most that long per request.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from chexpercept import tcp_table


def peer_of(connection: Any, client_address: Any) -> str:
    """The peer a connection counts against: ``uid N`` (the account owning the client's socket),
    else ``address A`` (the client's IP)."""
    try:
        uid = tcp_table.owner(tuple(client_address[:2]), tuple(connection.getsockname()[:2]))
    except (OSError, ValueError):  # no socket table here (not Linux), or the socket went away
        uid = None
    return f"uid {uid}" if uid is not None else f"address {client_address[0]}"


class Admission:
    """The counts behind the limits (see the module docstring); thread-safe. Connections are keyed
    by any hashable object (the server uses the socket)."""

    def __init__(self, max_connections: int, max_pending: int, max_peer_pending: int):
        if min(max_connections, max_pending, max_peer_pending) < 1:
            raise ValueError("connection limits must be at least 1")
        self.max_connections = max_connections
        self.max_pending = min(max_pending, max_connections)
        self.max_peer_pending = min(max_peer_pending, self.max_pending)
        self._lock = threading.Lock()
        #: open connection -> its peer, while pending
        self._pending: dict[Any, str] = {}
        self._trusted: set[Any] = set()
        self._per_peer: Counter[str] = Counter()

    def admit(self, connection: Any, peer: str) -> str | None:
        """Take ``connection`` as pending; None when taken, else why not (for the 503)."""
        with self._lock:
            if len(self._pending) + len(self._trusted) >= self.max_connections:
                return "too many connections"
            if len(self._pending) >= self.max_pending:
                return "too many connections not yet signed in"
            if self._per_peer[peer] >= self.max_peer_pending:
                return f"too many connections not yet signed in from one account ({peer})"
            self._pending[connection] = peer
            self._per_peer[peer] += 1
            return None

    def trust(self, connection: Any) -> None:
        """``connection`` carried valid credentials: it no longer counts as pending."""
        with self._lock:
            peer = self._pending.pop(connection, None)
            if peer is None:
                return
            self._drop_peer(peer)
            self._trusted.add(connection)

    def release(self, connection: Any) -> bool:
        """``connection`` is closed; whether it was counted."""
        with self._lock:
            peer = self._pending.pop(connection, None)
            if peer is not None:
                self._drop_peer(peer)
                return True
            if connection in self._trusted:
                self._trusted.discard(connection)
                return True
            return False

    def _drop_peer(self, peer: str) -> None:
        self._per_peer[peer] -= 1
        if self._per_peer[peer] <= 0:
            del self._per_peer[peer]

    def counts(self) -> dict[str, int]:
        """Open connections now: ``pending`` and ``trusted``."""
        with self._lock:
            return {"pending": len(self._pending), "trusted": len(self._trusted)}
