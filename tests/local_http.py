"""The HTTP server every fake peer in the tests runs on (fake_openai, fake_hub, the proxies).

The standard library's ``ThreadingHTTPServer`` prints a traceback to ``sys.stderr`` when a request
thread fails, and its request threads outlive ``shutdown()``: a fake that answers slowly (a hang, a
trickled reply) to a client that has since given up hits a broken pipe after its test has ended, and
the traceback lands in whichever test runs next in that worker, where a check of the captured stderr
("no Traceback") fails for nothing it did. A client that went away is the fake's normal life, never an
error of the server; anything else is still printed.
"""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class LocalServer(ThreadingHTTPServer):
    """A ``ThreadingHTTPServer`` that says nothing of clients that disconnected."""

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)
