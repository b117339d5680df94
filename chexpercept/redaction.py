"""Secrets in URLs are never written or printed: one rule for every URL the toolkit shows.

A URL can carry a secret in two places: its userinfo (``http://user:password@host/v1``: both the
name and the password are hidden, the name can be a key too) and its query string (``?api-key=...``,
``?key=...``, ``?sig=...``: a parameter whose name says it holds a key, token, secret, password,
signature or credential; ``api-version`` and the like stay as they are). ``redact_url`` hides both
(``http://***@host/v1?api-key=***``); ``redact_text`` does it to every URL inside a text (an error
message, a command line); ``redact_json`` to every string of a JSON value (run.json).

Every writer of a command line or of settings (run.json, ``RunMetadata.to_json``) and every message
that quotes an endpoint goes through these functions. The secret itself belongs in an environment
variable (``--api-key-env``), which nothing records.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: what hidden parts are replaced with
MASK = "***"
#: a query parameter holds a secret when its name (lower case, ``-`` read as ``_``) contains one of
#: these
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "pwd", "sig", "credential", "auth")
#: a URL inside a text: a scheme, ``://``, then everything up to white space or a quote
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def _secret_name(name: str) -> bool:
    name = name.lower().replace("-", "_")
    return any(word in name for word in _SECRET_WORDS)


def _redact_query(query: str) -> str:
    parts = []
    for part in query.split("&"):
        name, sep, value = part.partition("=")
        parts.append(f"{name}={MASK}" if sep and value and _secret_name(name) else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` with its userinfo and its secret query parameters replaced by ``***``; a string that
    does not parse as a URL is returned unchanged.

    >>> redact_url("http://user:pw@127.0.0.1:8000/v1?api-version=2024-10-21&api-key=abc")
    'http://***@127.0.0.1:8000/v1?api-version=2024-10-21&api-key=***'
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if not netloc and "@" in url.split("/", 1)[0]:  # no "//": "user:password@host/v1"
        return MASK + "@" + url.split("/", 1)[0].rpartition("@")[2] + url[len(url.split("/", 1)[0]) :]
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rpartition("@")[2]
    query = _redact_query(parts.query) if parts.query else parts.query
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_secret(url: str) -> bool:
    """Whether ``url`` carries userinfo or a secret query parameter (what ``redact_url`` hides)."""
    return redact_url(url) != url


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (``redact_url``): for messages and command lines."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group(0)), text)


def redact_json(value: Any) -> Any:
    """A copy of a JSON value with every string redacted (``redact_text``); keys are kept."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(v) for v in value]
    return value
