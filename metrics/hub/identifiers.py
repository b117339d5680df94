"""The bundle's own case identifiers, and finding them in text in any case or common encoding.

``Identifiers.from_bundle(DIR)`` reads ``chexpercept.json`` (spec/reference.md section 1): every
key_id, its pair id, the MIMIC study id inside the pair id (``s<digits>``, also as bare digits), the
dicom id and its parts, and the value of every other field of an entry whose name ends in ``_id`` or
``_ids`` (subject ids, study ids where a bundle carries them). ``find(text)`` says whether any of them
appears in ``text``:

- in any case, with separators changed or removed (``EDEMA-S50000720 POSITIVE.0``), with Unicode
  look-alikes folded (NFKC) and invisible characters dropped;
- percent-encoded, as HTML entities, as backslash escapes, as hex (with or without separators) and as
  base64 or base64url (at any alignment), and one such encoding inside another;
- split over neighbouring cells (the check reads the whole text with separators removed).

Identifiers made only of digits (study and subject ids) are matched against runs of digits, so that
numbers printed side by side cannot join into one by accident; scores are written with at most six
decimals, so a score never holds an eight-digit run.
"""

from __future__ import annotations

import base64
import binascii
import html
import os
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any
from urllib.parse import unquote_plus

from chexpercept.input_files import BUNDLE_JSON
from chexpercept.input_json import read_json
from chexpercept.os_errors import explain_os_error

#: shortest identifier form looked for (after folding): shorter ones are too common to mean a case
MIN_LENGTH = 6
#: a part of an identifier (between separators) is looked for on its own from this length on
MIN_PART = 8
_KEEP = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_PREFIXED_DIGITS = re.compile(r"^([a-z])(\d{6,})$")
_PREFIX_KIND = {"s": "study id", "p": "subject id"}
_DIGIT_RUN = re.compile(r"\d+(?:[-_ /]\d+)*")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")
_HEX_RUN = re.compile(r"(?:[0-9A-Fa-f]{2}[ :-]?){6,}")
_DEPTH = 2
#: a word that may be a number written in another base (a study id 50000720 is 2faf350 in base 16,
#: trosw in base 36): letters and digits, at least one letter
_NUMBER_WORD = re.compile(r"(?<![0-9A-Za-z])(?=[0-9]*[A-Za-z])[0-9A-Za-z]{3,16}(?![0-9A-Za-z])")
#: the bases such a word is read in (Python's alphabets: 0-9 then a-z)
_NUMBER_BASES = (16, 32, 36)


def fold(text: str) -> str:
    """``text`` as compared: NFKC, lower case, letters and digits only (ASCII)."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).lower() if c in _KEEP)


@dataclass(frozen=True)
class Found:
    """An identifier found in a text: what kind, its value in the bundle, how it was encoded."""

    kind: str
    value: str
    encoding: str = "text"

    def __str__(self) -> str:
        how = "" if self.encoding == "text" else f", {self.encoding}"
        return f"a {self.kind} of the bundle ({self.value!r}{how})"


class Identifiers:
    """A set of case identifiers; ``find`` looks for them in text (see the module docstring)."""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self._letters: dict[str, tuple[str, str]] = {}
        self._digits: dict[str, tuple[str, str]] = {}
        self._heads: dict[str, list[str]] = {}
        self._digit_lengths: list[int] = []

    def __len__(self) -> int:
        return len(self._letters) + len(self._digits)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_bundle(cls, data_dir: str | os.PathLike[str]) -> Identifiers:
        """The identifiers of the bundle at ``data_dir`` (its ``chexpercept.json``).

        Raises FileNotFoundError when there is no chexpercept.json, ValueError when it is not a JSON
        object of entries."""
        path = FsPath(data_dir) / "chexpercept.json"
        if not path.exists():
            raise FileNotFoundError(
                f"{path} not found: the bundle's identifiers are needed to check an upload"
            )
        try:
            entries = read_json(path, limit=BUNDLE_JSON, what="chexpercept.json")
        except OSError as e:
            raise ValueError(f"cannot read {path}: {explain_os_error(e).what}") from e
        except ValueError as e:
            raise ValueError(f"{path}: not readable JSON ({e})") from e
        if not isinstance(entries, dict):
            raise ValueError(f"{path}: expected a JSON object of entries keyed by key_id")
        return cls.from_entries(entries, source=str(path))

    @classmethod
    def from_entries(cls, entries: Mapping[str, Any], *, source: str = "") -> Identifiers:
        """The identifiers of ``chexpercept.json``'s entries (key_id -> entry)."""
        ids = cls(source)
        for key_id, entry in entries.items():
            ids.add("key_id", str(key_id))
            if isinstance(entry, Mapping):
                ids.add("pair_id", str(entry.get("pair_id") or str(key_id).split("_", 1)[-1]))
                ids._add_fields(entry)
        return ids

    def _add_fields(self, value: Any, depth: int = 0) -> None:
        """Fields named ``*_id`` / ``*_ids`` anywhere in an entry (not inside the questions' texts)."""
        if depth > 6 or not isinstance(value, Mapping):
            return
        for k, v in value.items():
            name = str(k)
            if name.endswith(("_id", "_ids")) and name != "task_id":
                for item in v if isinstance(v, list) else [v]:
                    if isinstance(item, (str, int)) and not isinstance(item, bool):
                        self.add(name, str(item))
            elif isinstance(v, Mapping):
                self._add_fields(v, depth + 1)

    def add(self, kind: str, value: str) -> None:
        """One identifier and its parts between separators: a study or subject id part by its digits
        (``s50000720`` -> ``50000720``), any other part from MIN_PART characters that holds a digit."""
        whole = fold(value)
        m = _PREFIXED_DIGITS.match(whole)
        if m:  # p10000032, s50000720: by their digits, matched as a run of digits wherever they stand
            self._add_form(m.group(2), kind, value)
            return
        self._add_form(whole, kind, value)
        for part in re.split(r"[^0-9A-Za-z]+", value):
            low = part.lower()
            m = _PREFIXED_DIGITS.match(low)
            if m:
                self._add_form(m.group(2), _PREFIX_KIND.get(m.group(1), f"part of a {kind}"), part)
            elif len(low) >= MIN_PART and any(c.isdigit() for c in low) and low != whole:
                self._add_form(low, f"part of a {kind}", value)

    def _add_form(self, form: str, kind: str, value: str) -> None:
        if len(form) < MIN_LENGTH:
            return
        if form.isdigit():
            self._digits.setdefault(form, (kind, value))
            if len(form) not in self._digit_lengths:
                self._digit_lengths = sorted([*self._digit_lengths, len(form)])
            return
        if form not in self._letters:
            self._letters[form] = (kind, value)
            self._heads.setdefault(form[:MIN_LENGTH], []).append(form)

    # ------------------------------------------------------------------ finding
    def find(self, text: str) -> Found | None:
        """The first identifier in ``text`` (see the module docstring), or None."""
        if not self:
            return None
        for encoding, candidate in decodings(text):
            hit = self._scan(candidate)
            if hit is not None:
                return Found(hit[0], hit[1], encoding)
        return self._number_in_another_base(text)

    def _number_in_another_base(self, text: str) -> Found | None:
        """A study or subject id written as a number in base 16, 32 or 36 (50000720 as ``2faf350``
        or ``trosw``): each word of letters and digits read in each base, matched whole (a part of a
        long number would match some id by chance)."""
        for m in _NUMBER_WORD.finditer(text):
            for base in _NUMBER_BASES:
                try:
                    value = str(int(m.group(0), base))
                except ValueError:  # not a numeral of that base
                    continue
                hit = self._digits.get(value)
                if hit is not None:
                    return Found(hit[0], hit[1], f"a number in base {base}")
        return None

    def find_number(self, number: float) -> Found | None:
        """A study or subject id written as a number (``50000720``), or None."""
        if isinstance(number, bool):
            return None
        return self.find(str(number))

    def _scan(self, text: str) -> tuple[str, str] | None:
        folded = fold(text)
        heads = self._heads
        for i in range(len(folded) - MIN_LENGTH + 1):
            for form in heads.get(folded[i : i + MIN_LENGTH], ()):
                if folded.startswith(form, i):
                    return self._letters[form]
        if self._digits:
            lengths = self._digit_lengths
            for m in _DIGIT_RUN.finditer(unicodedata.normalize("NFKC", text)):
                run = re.sub(r"\D", "", m.group(0))
                for n in lengths:
                    for i in range(len(run) - n + 1):
                        hit = self._digits.get(run[i : i + n])
                        if hit is not None:
                            return hit
        return None


def for_runs(
    data_dir: str | os.PathLike[str] | None,
    recorded: Sequence[tuple[str | None, str | None, str | None]],
) -> Identifiers:
    """The identifiers of the bundle some runs were made on: ``data_dir``, else the first folder their
    run.json names that is on this disk. ``recorded``: (run.json bundle.path, bundle.fingerprint,
    settings.bundle_images) per run.

    Raises ValueError when no bundle is found, or its fingerprint or its images' differ from the runs'."""
    from chexpercept.bundle import fingerprint, images_fingerprint

    candidates = [str(data_dir)] if data_dir else [p for p, _, _ in recorded if p]
    root = next((p for p in candidates if (FsPath(p) / "chexpercept.json").exists()), None)
    if root is None:
        named = f" (run.json names {candidates[0]})" if candidates and not data_dir else ""
        where = f" at {data_dir}" if data_dir else named
        raise ValueError(
            f"the bundle the runs were made on is not on this disk{where}: the upload is checked against its "
            "case identifiers; pass --data-dir DIR"
        )
    actual = fingerprint(root)
    for _, fp, _ in recorded:
        if fp and fp != actual:
            raise ValueError(
                f"the bundle at {root} is not the one the runs were made on (fingerprint {actual[:12]}..., "
                f"run.json says {fp[:12]}...): pass the bundle they were made on with --data-dir"
            )
    images = {value for _, _, value in recorded if isinstance(value, str) and value}
    if images:
        actual_images = images_fingerprint(root)
        other = sorted(images - {actual_images})
        if other:
            raise ValueError(
                f"the images of the bundle at {root} are not the ones the runs were made on (images "
                f"{actual_images.removeprefix('sha256:')[:12]}..., run.json's settings.bundle_images "
                f"{other[0].removeprefix('sha256:')[:12]}...): pass the bundle they were made on with --data-dir"
            )
    return Identifiers.from_bundle(root)


# ------------------------------------------------------------------------------------ encodings
def decodings(text: str, depth: int = _DEPTH) -> Iterator[tuple[str, str]]:
    """``("text", text)`` then every decoding worth a look: percent-encoding, HTML entities,
    backslash escapes, hex runs, base64 and base64url runs (each alignment), nested ``depth`` deep.
    (A study or subject id written as a number in another base is ``Identifiers.find``'s.)"""
    yield "text", text
    if depth <= 0:
        return
    for encoding, decoded in _decoded(text):
        if decoded and decoded != text:
            for inner, more in decodings(decoded, depth - 1):
                yield (encoding if inner == "text" else f"{inner} inside {encoding}"), more


def _decoded(text: str) -> Iterator[tuple[str, str]]:
    if "%" in text or "+" in text:
        yield "percent-encoded", unquote_plus(text)
    if "&" in text:
        yield "as HTML entities", html.unescape(text)
    if "\\" in text:
        unescaped = _unescape(text)
        if unescaped is not None:
            yield "as backslash escapes", unescaped
    for m in _HEX_RUN.finditer(text):
        digits = re.sub(r"[ :-]", "", m.group(0))
        for start in (0, 1):
            chunk = digits[start:]
            yield "hex-encoded", bytes.fromhex(chunk[: len(chunk) // 2 * 2]).decode("latin-1")
    for m in _BASE64_RUN.finditer(text):
        run = m.group(0).rstrip("=").replace("-", "+").replace("_", "/")
        for start in range(4):
            raw = decode_base64(run[start:])
            if raw:
                yield "base64-encoded", raw.decode("latin-1")


_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|x([0-9A-Fa-f]{2})|N\{[^}]*\})")


def _unescape(text: str) -> str | None:
    """``\\uXXXX``, ``\\UXXXXXXXX`` and ``\\xXX`` escapes decoded; None when there are none."""
    if not _ESCAPE.search(text):
        return None

    def one(m: re.Match[str]) -> str:
        digits = m.group(1) or m.group(2) or m.group(3)
        return chr(int(digits, 16)) if digits and int(digits, 16) <= 0x10FFFF else ""

    return _ESCAPE.sub(one, text)


def decode_base64(run: str) -> bytes:
    """The bytes of a base64 or base64url run (padding added, a trailing partial quantum dropped);
    b"" when it does not decode."""
    run = run.replace("-", "+").replace("_", "/").rstrip("=")
    run = run[: len(run) - (len(run) % 4 == 1)]
    try:
        return base64.b64decode(run + "=" * (-len(run) % 4), validate=True)
    except (binascii.Error, ValueError):
        return b""
