"""Per-annotator credentials of the review app: one secret token per annotator, kept in
``<review dir>/access.json`` (owner-only, mode 0600, in a folder of mode 0700).

The server binds 127.0.0.1 only, but on a shared GPU server every local account can reach that
address. So every route but the static files asks for the annotator's credential: the link printed at
start (``/annotate/<A>?token=<token>``) sets a cookie (HttpOnly, SameSite=Strict, Path scoped to
``/annotate/<A>``) and redirects to the page without the token in its address; every request then
carries the cookie, and one annotator's cookie opens only that annotator's cases. Tokens are 256-bit
random (``secrets.token_urlsafe(32)``) and compared in constant time. They survive restarts (an open
tab keeps working and sends what it holds); delete ``access.json`` to issue new ones.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path as FsPath

from chexpercept.fileio import write_json_atomic
from chexpercept.input_json import read_json

from ..sources import SourceError

ACCESS_FILE = "access.json"
ACCESS_VERSION = 1
COOKIE_PREFIX = "chexpercept_review_"
#: how long the browser keeps the cookie (seconds); the token itself does not expire
COOKIE_MAX_AGE = 30 * 24 * 3600


def annotator_path(annotator: str) -> str:
    """The URL path every route of one annotator lives under (the cookie's Path)."""
    return f"/annotate/{annotator}"


def cookie_name(annotator: str) -> str:
    return f"{COOKIE_PREFIX}{annotator}"


def set_cookie(annotator: str, token: str) -> str:
    """The ``Set-Cookie`` value that carries an annotator's token (HttpOnly, SameSite=Strict, scoped)."""
    return (
        f"{cookie_name(annotator)}={token}; Path={annotator_path(annotator)}; HttpOnly; "
        f"SameSite=Strict; Max-Age={COOKIE_MAX_AGE}"
    )


def restrict_folder(folder: FsPath) -> bool:
    """Make ``folder`` owner-only (0700) when others could read it; True when its mode was changed."""
    mode = stat.S_IMODE(folder.stat().st_mode)
    if mode & 0o077:
        folder.chmod(0o700)
        return True
    return False


def _check_private(path: FsPath) -> None:
    st = path.stat()
    if st.st_uid != os.getuid():
        raise SourceError(f"{path} belongs to another user (uid {st.st_uid}); refusing its tokens")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise SourceError(
            f"{path} is readable by other users (mode {stat.S_IMODE(st.st_mode):04o}): its tokens may be "
            "known; delete it to issue new ones (chexpercept review writes it with mode 0600)"
        )


class Access:
    """The tokens of one review folder; ``check`` says whether a presented token is an annotator's."""

    def __init__(self, path: FsPath, tokens: dict[str, str]):
        self.path = path
        self.tokens = tokens

    @classmethod
    def load_or_create(cls, review_dir: str | os.PathLike[str], annotators: list[str]) -> Access:
        """The folder's tokens, adding one for each annotator that has none (SourceError when the file
        is not owner-only or not readable)."""
        path = FsPath(review_dir) / ACCESS_FILE
        tokens: dict[str, str] = {}
        if path.exists():
            _check_private(path)
            try:
                data = read_json(path, what=ACCESS_FILE)
                tokens = dict(data["tokens"])
            except (OSError, KeyError, TypeError, ValueError) as e:
                raise SourceError(
                    f"{path} is not a review access file ({e}); delete it for new tokens"
                ) from e
        missing = [a for a in annotators if not isinstance(tokens.get(a), str) or len(tokens[a]) < 32]
        if missing or not path.exists():
            for a in missing:
                tokens[a] = secrets.token_urlsafe(32)
            write_json_atomic(path, {"version": ACCESS_VERSION, "tokens": tokens}, indent=1)
        return cls(path, {a: tokens[a] for a in annotators})

    def check(self, annotator: str, token: str | None) -> bool:
        """Whether ``token`` is ``annotator``'s (constant time; False for unknown annotators)."""
        expected = self.tokens.get(annotator)
        if expected is None or not token:
            return False
        return hmac.compare_digest(expected.encode(), token.encode("utf-8", "replace"))

    def link(self, base: str, annotator: str) -> str:
        """The link to give an annotator: ``<base>/annotate/<A>?token=<token>``."""
        return f"{base}{annotator_path(annotator)}?token={self.tokens[annotator]}"
