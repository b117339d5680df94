"""Another local account, as on a shared server: created for a test (``useradd``, as root; the test
is skipped with the reason elsewhere), removed after it, and code run as it in a forked child.

``run_as(account, target, *args)`` forks; the child drops to the account (groups, gid, uid) and
calls ``target(send, stop, *args)``: ``send(obj)`` hands a JSON line to the parent, ``stop`` is a file
descriptor that becomes readable (end of file) when the parent calls ``stop()``. No interpreter is
started (the account may not be able to read this one's files).

Targets here: ``http_server`` (a loopback server that counts what it receives and may answer each
request like an OpenAI-compatible API) and ``trickle_clients`` (connections that send a request's
header lines slowly).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import socket
import subprocess
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def other_account() -> Iterator[pwd.struct_passwd]:
    """A fresh local account with no home and no shell; skips the test where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local account (useradd); CI runs tests as root")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if useradd is None or userdel is None:
        pytest.skip("useradd/userdel not found: cannot create a second local account")
    name = f"chx{secrets.token_hex(4)}"
    made = subprocess.run(
        [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"useradd could not create a second local account: {made.stderr.strip()}")
    account = pwd.getpwnam(name)
    try:
        yield account
    finally:
        for child in [c for c in _LIVE if c.uid == account.pw_uid]:
            child.kill()  # a test that failed before stopping its child: userdel refuses while it runs
        gone = subprocess.run([userdel, name], capture_output=True, text=True, check=False)
        if gone.returncode != 0:
            warnings.warn(
                f"userdel {name} failed: {gone.stderr.strip()}; remove the account by hand", stacklevel=2
            )


#: children started by run_as and not yet waited for
_LIVE: list[AsAccount] = []


class AsAccount:
    """A forked child running as another account (see the module docstring)."""

    def __init__(self, account: pwd.struct_passwd, target: Callable[..., None], *args: Any):
        out_r, out_w = os.pipe()
        stop_r, stop_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                os.close(out_r)
                os.close(stop_w)
                os.setgroups([])
                os.setgid(account.pw_gid)
                os.setuid(account.pw_uid)

                def send(obj: Any) -> None:
                    os.write(out_w, (json.dumps(obj) + "\n").encode())

                target(send, stop_r, *args)
                status = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        os.close(out_w)
        os.close(stop_r)
        self.pid, self.uid, self._out, self._stop = pid, account.pw_uid, os.fdopen(out_r, "rb"), stop_w
        _LIVE.append(self)

    def kill(self) -> None:
        """End the child at once (SIGKILL, by its pid) and wait for it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self._forget()

    def _forget(self) -> None:
        if self in _LIVE:
            _LIVE.remove(self)
        if self._stop is not None:
            os.close(self._stop)
            self._stop = None

    def receive(self, timeout: float = 30.0) -> Any:
        """The child's next message (AssertionError when none comes within ``timeout`` seconds)."""
        ready, _, _ = select.select([self._out], [], [], timeout)
        assert ready, f"the child running as another account sent nothing within {timeout} s"
        line = self._out.readline()
        assert line, "the child running as another account ended without a message"
        return json.loads(line)

    def stop(self, timeout: float = 30.0) -> list[Any]:
        """Tell the child to stop; its remaining messages."""
        if self._stop is not None:
            os.close(self._stop)
            self._stop = None
        messages = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._out], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self._out.readline()
            if not line:
                break
            messages.append(json.loads(line))
        _, status = os.waitpid(self.pid, 0)
        self._forget()
        assert os.waitstatus_to_exitcode(status) == 0, "the child running as another account failed"
        return messages


def run_as(account: pwd.struct_passwd, target: Callable[..., None], *args: Any) -> AsAccount:
    return AsAccount(account, target, *args)


def chat_reply(model: str = "gpt-5.4") -> bytes:
    """An HTTP/1.1 response carrying a chat completion that answers "Answer: 1"."""
    body = json.dumps(
        {
            "model": model,
            "choices": [{"message": {"content": "Answer: 1"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _complete_request(buffer: bytes) -> int:
    """Length of the first whole request (headers and Content-Length body) in ``buffer``, or 0."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return 0
    length = 0
    for line in buffer[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    total = end + 4 + length
    return total if len(buffer) >= total else 0


#: the reply to a GET: this server lists no models (it is no vLLM)
NO_LISTING = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


def http_server(send: Callable[[Any], None], stop: int, host: str, reply: bool, port: int = 0) -> None:
    """Listen on ``host`` (``"::"``: dual stack, IPv4 too) and ``port`` (0: any free one), send
    ``{"port": N}``, count connections, bytes and whole requests until stopped (then send the
    counts); with ``reply``, answer each request with ``chat_reply()``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if host == "::":
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    listener.bind((host, port))
    listener.listen(64)
    send({"port": listener.getsockname()[1]})
    buffers: dict[socket.socket, bytes] = {}
    counts = {"connections": 0, "bytes": 0, "requests": 0}
    while True:
        ready, _, _ = select.select([listener, stop, *buffers], [], [], 1.0)
        if stop in ready:
            break
        for s in ready:
            if s is listener:
                conn, _ = listener.accept()
                buffers[conn] = b""
                counts["connections"] += 1
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                buffers.pop(s)
                s.close()
                continue
            counts["bytes"] += len(data)
            buffers[s] += data
            while (n := _complete_request(buffers[s])) > 0:
                request, buffers[s] = buffers[s][:n], buffers[s][n:]
                counts["requests"] += 1
                if reply:  # GET /v1/models: no listing (a server that is not vLLM); else a chat reply
                    s.sendall(NO_LISTING if request.startswith(b"GET ") else chat_reply())
    send(counts)


def trickle_clients(
    send: Callable[[Any], None],
    stop: int | None,
    port: int,
    n: int,
    every: float,
    seconds: float,
    request: bytes = b"GET /static/review.css HTTP/1.1\r\n",
    piece: bytes = b"X-Slow: 1\r\n",
) -> None:
    """Open ``n`` connections to 127.0.0.1:``port``, send ``request`` on each and then ``piece``
    every ``every`` seconds, for ``seconds`` at most; send, per connection, what the server answered
    (its first bytes) and after how many seconds it closed the connection (None: not within
    ``seconds``), after ``{"opened": n}`` once all are open. With a ``stop`` descriptor, wait for it
    before returning."""
    start = time.monotonic()
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        conns.append({"sock": s, "opened": time.monotonic(), "closed": None, "answer": b""})
        with contextlib.suppress(OSError):
            s.send(request)
    send({"opened": n})
    next_piece = start + every
    while time.monotonic() - start < seconds and any(c["closed"] is None for c in conns):
        live = [c["sock"] for c in conns if c["closed"] is None]
        ready, _, _ = select.select(
            live, [], [], max(0.0, min(next_piece, start + seconds) - time.monotonic())
        )
        for c in conns:
            if c["sock"] in ready:
                try:
                    data = c["sock"].recv(4096)
                except OSError:
                    data = b""
                c["answer"] += data
                if not data:
                    c["closed"] = time.monotonic() - c["opened"]
        if time.monotonic() >= next_piece:
            next_piece += every
            for c in conns:
                if c["closed"] is None:
                    with contextlib.suppress(OSError):
                        c["sock"].send(piece)
    send([{"closed": c["closed"], "answer": c["answer"][:400].decode("latin-1")} for c in conns])
    for c in conns:
        c["sock"].close()
    if stop is not None:
        select.select([stop], [], [], 30)
