"""Secrets in URLs are never written or printed: one rule for every URL the toolkit shows.

Text (an error body, a message, a command line) can hold a secret as ``name=value`` in any of its
spellings (quoted, spaces around ``=`` or ``:``, ``Authorization: Bearer ...``): ``redact_text`` hides
those too, by one table of secret words (``_secret_name``).

A URL can carry a secret in two places: its userinfo (``http://user:password@host/v1``: both the
name and the password are hidden, the name can be a key too) and its query string (``?api-key=...``,
``?key=...``, ``?sig=...``: a parameter whose name says it holds a key, token, secret, password,
signature or credential; ``api-version`` and the like stay as they are). ``redact_url`` hides both
(``http://***@host/v1?api-key=***``); ``redact_text`` does it to every URL inside a text (an error
message, a command line); ``redact_json`` to every string of a JSON value (run.json).

A value under a key that names a secret (``"x-api-key": ...``, ``"Authorization": ...``, ``"token"``,
``"password"``...: ``secret_key``) is hidden whole wherever JSON is written or printed: ``redact_json``
(run.json) and ``redact_field`` (one field, e.g. a line of a resume's settings diff) are the one rule.
The run's identity still sees a changed secret: ``digest_secrets`` replaces such a value by
``*** pbkdf2:<16 hex>`` (``secret_digest``), which both functions keep; the value itself is never
stored nor printed.

The known secrets of a run (the API key read from the environment, a header value given in
--request-extra) are registered at its start (``register_secret``, ``register_secrets_in``): every
text ``redact_text`` returns has each occurrence of them masked, wherever it appears (an error body
that echoes the key, a diff, a message), and the terminal escaper (chexpercept.escape) redacts all it
prints.

Every writer of a command line or of settings (run.json, ``RunMetadata.to_json``) and every message
that quotes an endpoint goes through these functions. The secret itself belongs in an environment
variable (``--api-key-env``), which nothing records.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: what hidden parts are replaced with
MASK = "***"
#: a name holds a secret when one of its words (split at ``_``, ``-``, ``.``, white space and lower to
#: upper case) is one of these ...
_SECRET_WORDS = frozenset(
    {
        "key", "apikey", "token", "secret", "password", "passwd", "passphrase", "pass", "pwd", "sig",
        "signature", "credential", "credentials", "auth", "authorization", "bearer", "cookie",
    }
)  # fmt: skip
#: ... or, read whole, ends in one of these (``accesstoken``, ``clientsecret``, ``xapikey``) ...
_SECRET_ENDINGS = ("token", "apikey", "secret", "password", "passwd")
#: ... unless its last word says it names or counts something (``key_id``, ``api_key_env``,
#: ``max_tokens`` has no secret word at all)
_NOT_SECRET_LAST = frozenset(
    {
        "id",
        "ids",
        "env",
        "file",
        "path",
        "name",
        "names",
        "count",
        "length",
        "limit",
        "header",
        "kind",
        "type",
    }
)
_WORD_SPLIT = re.compile(r"[_\-.\s]+|(?<=[a-z])(?=[A-Z])")
#: a URL inside a text: a scheme, ``://``, then everything up to white space or a quote
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
#: ``name = value`` / ``name: value`` / ``"name": "value"`` in a text; the value is quoted, a scheme
#: word and its credential (``Bearer abc``), or a run of characters up to white space or punctuation
_NAME_SEP = re.compile(r"""(?P<name>["']?[A-Za-z][A-Za-z0-9_.-]{0,63}["']?)[ \t]*[:=][ \t]*""")
_VALUE = re.compile(
    r"""\\"[^\n]*?\\"|"[^"\n]*"|'[^'\n]*'|(?i:bearer|basic|token|digest)[ \t]+[^\s"',;&]+|[^\s"',;&)}\]]+"""
)
#: a credential after its scheme word anywhere (``Authorization: Bearer ...`` split over a header dump)
_SCHEME_CREDENTIAL = re.compile(r"\b(?P<scheme>(?i:bearer|basic))[ \t]+(?P<value>[A-Za-z0-9._~+/=-]{8,})")
#: a cheap first look: a text without any of these has nothing to hide
_MAYBE = (
    "://",
    "key",
    "token",
    "secret",
    "pass",
    "pwd",
    "sig",
    "credential",
    "auth",
    "bearer",
    "basic",
    "cookie",
)


def _secret_name(name: str) -> bool:
    """Whether the parameter, field or header called ``name`` holds a secret (see ``_SECRET_WORDS``)."""
    words = [w.lower() for w in _WORD_SPLIT.split(name.strip("\"'")) if w]
    if not words or words[-1] in _NOT_SECRET_LAST:
        return False
    whole = "".join(words)
    return any(w in _SECRET_WORDS for w in words) or whole.endswith(_SECRET_ENDINGS)


def secret_key(name: str) -> bool:
    """Whether a JSON key, header, parameter or field called ``name`` holds a secret (``x-api-key``,
    ``Authorization``, ``token``, ``client_secret``, ``password``...; not ``api_key_env``,
    ``key_id``, ``max_tokens``)."""
    return isinstance(name, str) and _secret_name(name)


#: the known secret values of this run (``register_secret``), and one pattern matching any of them
_KNOWN: set[str] = set()
_KNOWN_PATTERN: re.Pattern[str] | None = None
_KNOWN_LOCK = threading.Lock()
#: shorter values are not registered (masking every "abc" in every text would hide words)
MIN_SECRET_LENGTH = 6


def register_secret(value: Any) -> None:
    """Mask every later occurrence of ``value`` (a string of at least ``MIN_SECRET_LENGTH``
    characters; others are ignored) in each text ``redact_text`` returns, for the rest of the
    process: the run's API key, a header value given. Every form it travels in is masked too
    (``secret_forms``: a key with a space pasted after it travels without it, a password in a URL
    travels percent-decoded; red team, stop 45: a server's echo of either showed it whole)."""
    global _KNOWN_PATTERN
    if not isinstance(value, str):
        return
    forms = {f for f in secret_forms(value) if len(f.strip()) >= MIN_SECRET_LENGTH and f != MASK}
    if not forms:
        return
    with _KNOWN_LOCK:
        if forms <= _KNOWN:
            return
        _KNOWN.update(forms)
        ordered = sorted(_KNOWN, key=len, reverse=True)  # the longest first: no part of one left shown
        _KNOWN_PATTERN = re.compile("|".join(re.escape(v) for v in ordered))


def secret_forms(value: str) -> set[str]:
    """The forms a secret given as ``value`` may travel and come back in: itself, without the
    whitespace around it (HTTP header values are trimmed), and percent-decoded (a URL's userinfo)."""
    from urllib.parse import unquote

    return {form for v in (value, unquote(value)) for form in (v, v.strip())}


def register_secrets_in(value: Any) -> None:
    """``register_secret`` every string under a secret key (``secret_key``) of a JSON value
    (``--request-extra``'s ``extra_headers``: ``{"x-api-key": "..."}``)."""
    for secret in _values_under_secret_keys(value, False):
        register_secret(secret)


def _values_under_secret_keys(value: Any, under: bool) -> Iterable[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _values_under_secret_keys(v, under or secret_key(k))
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _values_under_secret_keys(v, under)
    elif under and isinstance(value, str):
        yield value


#: how ``secret_digest`` starts: a value in this form is a digest, never the secret itself
DIGEST_PREFIX = MASK + " pbkdf2:"
#: what earlier versions wrote (a plain SHA-256): still recognised as a digest, never digested again
_OLD_DIGEST_PREFIX = MASK + " sha256:"
#: PBKDF2-HMAC-SHA256 iterations: about 0.1 s per secret here, so that a short secret cannot be
#: found again from its digest by trying candidates (run.json is private, but it may be shared)
DIGEST_ITERATIONS = 200_000
_DIGEST_SALT = b"chexpercept secret digest v2"


def secret_digest(value: Any) -> str:
    """``*** pbkdf2:<16 hex>``: stands for a secret value in a run's identity, so that a changed
    secret still counts as a change while the value is neither stored nor printed. A slow key
    derivation (``DIGEST_ITERATIONS`` rounds of PBKDF2-HMAC-SHA256), not a plain hash: the same
    value always gives the same digest (a resume compares them), and trying candidate values
    against it costs as much per candidate."""
    if _is_digest(value):
        return value
    return DIGEST_PREFIX + _slow_digest(json.dumps(value, sort_keys=True, ensure_ascii=False, default=str))


@functools.lru_cache(maxsize=64)
def _slow_digest(data: str) -> str:
    return hashlib.pbkdf2_hmac("sha256", data.encode(), _DIGEST_SALT, DIGEST_ITERATIONS).hex()[:16]


def _is_digest(value: Any) -> bool:
    return (
        isinstance(value, str)
        and value.startswith((DIGEST_PREFIX, _OLD_DIGEST_PREFIX))
        and len(value) == len(DIGEST_PREFIX) + 16
    )


def digest_secrets(value: Any) -> Any:
    """A copy of a JSON value with every value under a secret key (``secret_key``) replaced by its
    ``secret_digest`` (None kept): what a run's identity (run.json ``settings``) holds."""
    if isinstance(value, dict):
        return {
            k: (secret_digest(v) if v is not None else None) if secret_key(k) else digest_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [digest_secrets(v) for v in value]
    return value


def redact_field(name: Any, value: Any) -> Any:
    """The value of field ``name`` as it may be written or printed: under a secret key (``secret_key``)
    ``***`` (a ``secret_digest`` and None are kept), else ``redact_json(value)``."""
    if secret_key(name):
        return value if value is None or _is_digest(value) else MASK
    return redact_json(value)


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


def _mask_assignments(text: str) -> str:
    """Every value after a secret name and its ``=`` or ``:`` replaced by MASK (its quotes kept). Each
    name is looked at on its own: a value that is not a secret's is read past, never skipped whole
    (so ``"error": "... api_key = \\"K\\""`` still hides K)."""
    out, last = [], 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < last or not _secret_name(m.group("name")):
            continue
        value = _VALUE.match(text, m.end())
        if value is None or value.group(0).strip("\\\"'") in ("", MASK):
            continue
        quote = next((q for q in ('\\"', '"', "'") if value.group(0).startswith(q)), "")
        out += [text[last : m.end()], quote, MASK, quote]
        last = value.end()
    return "".join(out) + text[last:] if out else text


def redact_text(text: str) -> str:
    """``text`` with every secret in it hidden: for messages, command lines and error bodies.

    The forms (``tests/test_redaction.py::test_every_form_of_secret_is_hidden`` has the table): a URL's
    userinfo and secret query parameters (``redact_url``); ``name=value``, ``name = value``,
    ``name: value``, ``"name": "value"`` and ``'name': 'value'`` where the name holds a secret word
    (``api_key``, ``apikey``, ``X-Api-Key``, ``token``, ``secret``, ``password``, ``passwd``, ``pass``,
    ``pwd``, ``Authorization``, ...; not ``key_id``, ``max_tokens``, ``api_key_env``); and a credential
    after ``Bearer`` or ``Basic`` anywhere; and every occurrence of a registered secret
    (``register_secret``)."""
    known = _KNOWN_PATTERN
    if known is not None:
        text = known.sub(MASK, text)
    low = text.lower()
    if not any(word in low for word in _MAYBE):  # substring scans in C: the usual text costs ~1 us
        return text
    if "://" in text:
        text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    text = _mask_assignments(text)
    return _SCHEME_CREDENTIAL.sub(lambda m: f"{m.group('scheme')} {MASK}", text)


def redact_json(value: Any) -> Any:
    """A copy of a JSON value with every value under a secret key hidden whole (``redact_field``) and
    every other string redacted (``redact_text``); keys are kept."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_field(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(v) for v in value]
    return value
