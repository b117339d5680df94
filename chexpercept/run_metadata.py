"""run.json as one typed record: what the runner writes and what the scorer and the report read.

``RunMetadata.from_json(path_or_dict, source=...)`` validates on read: a field of the wrong type is an
error naming the file and the field (``runs/x/oracle_none/run.json: field 'sampling.temperature' must
be a number, got 'hot'``). Every field may be missing (older runs, the reference's results, which
have no run.json): it is then None. Keys this record does not know are kept (``extra``).

Format fields are validated by their shape (``GIT_COMMIT``, ``ISO_TIME``, ``PEP440``): ``git_commit``
is 40 hex digits (``-dirty`` allowed), ``started``/``finished``/``resumed`` ISO times, ``versions``
package names and PEP 440 versions, ``weights.commit`` 40 hex digits. A tampered run.json cannot
carry text into a report or a card through them: it is refused, naming the file and the field.

``to_json()`` gives the dict the runner writes: the known keys in the order below, then unknown ones.
A field that is None is left out, except those the runner writes as null on purpose (``finished``
while a run is going, ``git_commit`` outside a checkout, ``sampling.temperature`` left to the server,
the selection's unset filters).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path as FsPath
from typing import Any, ClassVar

from .escape import terminal
from .input_files import InputFileError
from .input_json import JsonInputError, read_json
from .redaction import digest_secrets, redact_json

#: the shapes of run.json's format fields: what the runner writes there, and nothing else is read
#: (a tampered run.json would otherwise carry free text into reports and cards)
GIT_COMMIT = r"[0-9a-f]{40}(-dirty)?"
ISO_TIME = r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?"
#: a PEP 440 version (release, pre-, post-, dev-release, local label), at most 64 characters
PEP440 = (
    r"(?i:v?(\d{1,6}!)?\d{1,6}(\.\d{1,6}){0,5}((a|b|c|rc|alpha|beta|pre|preview)\d{0,6})?"
    r"(\.?post\d{0,6})?(\.?dev\d{0,6})?(\+[a-z0-9]{1,20}([._-][a-z0-9]{1,20}){0,4})?)"
)
PACKAGE_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"


def _shape(pattern: str, limit: int = 64) -> Any:
    compiled = re.compile(pattern)
    return lambda v: isinstance(v, str) and len(v) <= limit and compiled.fullmatch(v) is not None


_is_commit, _is_time = _shape(GIT_COMMIT), _shape(ISO_TIME)
_is_version, _is_package = _shape(PEP440), _shape(PACKAGE_NAME)

#: (check, description) per kind of value
_KINDS: dict[str, tuple[Any, str]] = {
    "commit": (_is_commit, "a git commit (40 lower-case hex digits, optionally '-dirty')"),
    "time": (_is_time, "an ISO 8601 time (2026-01-31T12:00:00+0000)"),
    "time_list": (lambda v: isinstance(v, list) and all(_is_time(x) for x in v), "a list of ISO 8601 times"),
    "versions": (
        lambda v: (
            isinstance(v, dict)
            and all(_is_package(k) and (x is None or _is_version(x)) for k, x in v.items())
        ),
        "an object of package names and PEP 440 versions",
    ),
    "weights": (
        lambda v: isinstance(v, dict) and (v.get("commit") is None or _is_commit(v["commit"])),
        "a JSON object whose 'commit' is a git commit (40 lower-case hex digits)",
    ),
    "str": (lambda v: isinstance(v, str), "a string"),
    # read to choose how a run is scored (metrics/model_scores.py: run_parse_mode; red team, stop 48)
    "parse_mode": (lambda v: v in ("reference", "strict"), "'reference' or 'strict'"),
    # every whole number run.json holds is a count or a seed (n_results -3 was read as "24 more than
    # the run wrote"; red team, stop 44)
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number from 0"),
    "number": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "str_list": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
}


def _kind(kind: str, *, always: bool = False) -> dict[str, Any]:
    """A field's metadata: the kind of its value; ``always``: written even when None."""
    return {"kind": kind, "always": always}


def _short(value: Any, n: int = 80) -> str:
    """``repr(value)``, cut to ``n`` characters (a tampered field can be long)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a number too long to show"
    return text if len(text) <= n else text[:n] + "..."


class RunMetadataError(ValueError):
    """run.json (or a dict standing for it) holds a field of the wrong type."""


@dataclass
class _Record:
    #: keys this record does not know, kept as read (written after the known ones)
    extra: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)

    NESTED: ClassVar[dict[str, type[_Record]]] = {}

    @classmethod
    def _known(cls) -> list[Any]:
        return [f for f in fields(cls) if f.name != "extra"]

    @classmethod
    def _parse(cls, data: Any, source: str, prefix: str = "") -> Any:
        if not isinstance(data, dict):
            where = f"field '{prefix[:-1]}'" if prefix else "the top level"
            raise RunMetadataError(f"{source}: {where} must be a JSON object, got {data!r}")
        values: dict[str, Any] = {}
        known = cls._known()
        for f in known:
            if f.name not in data or data[f.name] is None:
                continue
            value = data[f.name]
            nested = cls.NESTED.get(f.name)
            if nested is not None:
                values[f.name] = nested._parse(value, source, f"{prefix}{f.name}.")
                continue
            check, what = _KINDS[f.metadata["kind"]]
            if not check(value):
                raise RunMetadataError(
                    f"{source}: field '{prefix}{f.name}' must be {what}, got {terminal(_short(value))}"
                )
            values[f.name] = value
        names = {f.name for f in known}
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**values, extra=extra)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in self._known():
            value = getattr(self, f.name)
            if value is None and not f.metadata["always"]:
                continue
            out[f.name] = value.to_json() if isinstance(value, _Record) else value
        out.update(self.extra)
        return out


@dataclass
class SamplingInfo(_Record):
    """How the model decoded (``sampling`` in run.json)."""

    temperature: float | None = field(default=None, metadata=_kind("number", always=True))
    top_p: float | None = field(default=None, metadata=_kind("number", always=True))
    max_tokens: int | None = field(default=None, metadata=_kind("int", always=True))
    #: True when a response is a deterministic function of the conversation
    greedy: bool | None = field(default=None, metadata=_kind("bool", always=True))


@dataclass
class BundleInfo(_Record):
    """The bundle a run was made on (``bundle`` in run.json)."""

    path: str | None = field(default=None, metadata=_kind("str"))
    fingerprint: str | None = field(default=None, metadata=_kind("str"))
    synthetic: bool | None = field(default=None, metadata=_kind("bool"))
    n_cases: int | None = field(default=None, metadata=_kind("int"))


@dataclass
class Selection(_Record):
    """Which of the bundle's cases were run (``selection``; None = no such filter)."""

    lesions: list[str] | None = field(default=None, metadata=_kind("str_list", always=True))
    paths: list[str] | None = field(default=None, metadata=_kind("str_list", always=True))
    per_cell: int | None = field(default=None, metadata=_kind("int", always=True))
    limit: int | None = field(default=None, metadata=_kind("int", always=True))
    n_selected: int | None = field(default=None, metadata=_kind("int", always=True))


@dataclass
class RunMetadata(_Record):
    """One run's run.json (see the module docstring); the runner writes the fields in this order."""

    model: str | None = field(default=None, metadata=_kind("str"))
    display_name: str | None = field(default=None, metadata=_kind("str"))
    model_id: str | None = field(default=None, metadata=_kind("str"))
    backend: str | None = field(default=None, metadata=_kind("str"))
    oracle: str | None = field(default=None, metadata=_kind("str"))
    parse_mode: str | None = field(default=None, metadata=_kind("parse_mode"))
    sampling: SamplingInfo | None = field(default=None, metadata=_kind("object"))
    seed: int | None = field(default=None, metadata=_kind("int"))
    chat_template_kwargs: dict[str, Any] | None = field(default=None, metadata=_kind("object"))
    bundle: BundleInfo | None = field(default=None, metadata=_kind("object"))
    selection: Selection | None = field(default=None, metadata=_kind("object"))
    #: the weights a local engine loaded: model id, requested revision, resolved commit, source, size
    weights: dict[str, Any] | None = field(default=None, metadata=_kind("weights"))
    batch_size: int | None = field(default=None, metadata=_kind("int"))
    num_processes: int | None = field(default=None, metadata=_kind("int"))
    versions: dict[str, Any] | None = field(default=None, metadata=_kind("versions"))
    git_commit: str | None = field(default=None, metadata=_kind("commit", always=True))
    command: list[str] | None = field(default=None, metadata=_kind("str_list"))
    started: str | None = field(default=None, metadata=_kind("time"))
    #: what must match for a rerun to continue the run (eval/runner/store.py compares it)
    settings: dict[str, Any] | None = field(default=None, metadata=_kind("object"))
    #: start times of the sessions that continued the run
    resumed: list[str] | None = field(default=None, metadata=_kind("time_list"))
    #: every session's settings that are not part of the identity (command, batch size, processes,
    #: the backend's options, versions), oldest first: what each part of the run was made with
    sessions: list[dict[str, Any]] | None = field(default=None, metadata=_kind("list"))
    #: None until every selected case has a result
    finished: str | None = field(default=None, metadata=_kind("time", always=True))
    unfinished_cases: int | None = field(default=None, metadata=_kind("int"))
    backend_settings: dict[str, Any] | None = field(default=None, metadata=_kind("object"))
    n_results: int | None = field(default=None, metadata=_kind("int"))
    last_session: dict[str, Any] | None = field(default=None, metadata=_kind("object"))
    #: the estimator's tokens and cost for the conversations this run had, beside what the API
    #: reported (eval/estimate/count.py; runs whose backend reports usage)
    estimate: dict[str, Any] | None = field(default=None, metadata=_kind("object"))
    #: not written by the runner: the reference layout's provider, and where the record came from
    provider: str | None = field(default=None, metadata=_kind("str"))
    source: str | None = field(default=None, metadata=_kind("str"))

    NESTED: ClassVar[dict[str, type[_Record]]] = {
        "sampling": SamplingInfo,
        "bundle": BundleInfo,
        "selection": Selection,
    }

    @property
    def images_fingerprint(self) -> str | None:
        """The fingerprint of the bundle's images the run was made on (its identity's
        ``bundle_images``: chexpercept.bundle.images_fingerprint); None where not recorded."""
        value = (self.settings or {}).get("bundle_images")
        return value if isinstance(value, str) else None

    @classmethod
    def from_json(
        cls, data: str | os.PathLike[str] | dict[str, Any] | RunMetadata, source: str | None = None
    ) -> RunMetadata:
        """A run.json file (errors name it), or its dict (errors name ``source``, default run.json)."""
        if isinstance(data, RunMetadata):
            return data
        if not isinstance(data, dict):
            path = FsPath(data)
            source = source or str(path)
            try:
                data = read_json(path, what="run.json")
            except (JsonInputError, InputFileError) as e:
                raise RunMetadataError(f"{source}: {e.reason}") from None
        return cls._parse(data, source or "run.json")

    def to_json(self) -> dict[str, Any]:
        """The dict the runner writes, every field through ``chexpercept.redaction.redact_json``: a
        secret a URL or a text carries hidden, a value under a secret key hidden whole; ``settings``
        (compared exactly on a resume) through ``digest_secrets``: a value under a secret key held as
        its digest (a changed secret is still a change), every other value as it is."""
        out = super().to_json()
        return {k: digest_secrets(v) if k == "settings" else redact_json(v) for k, v in out.items()}
