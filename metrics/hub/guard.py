"""The upload guard: an allow-list. Only files a stager wrote go, each as its schema allows.

A stager writes every file through a ``Manifest`` (``manifest.write(rel, text, schema)``), which keeps
its sha256, size and schema. ``manifest.verify()`` runs right before an upload and returns the bytes
that may go; it refuses, naming each file and the reason:

- anything in the staging folder the stager did not write (a file added later, a link, a folder
  link, a device or pipe), a staged file that is missing or changed since it was written;
- a file its schema does not allow. Schemas (below) know every key, every table header and every
  line a stager writes: numbers must be numbers (at most six decimals), strings must come from a
  fixed vocabulary, a strict pattern (a fingerprint, a date, a version) or the upload's names
  (``Context.names``: each from the model registry, a baseline, or a label the user gave on the
  command line, checked by ``names.check_names`` when the context is made; never free text from a
  run folder, see ``chexpercept.metrics.hub.names``); JSON and YAML must be written exactly as the
  stager writes them (no comments, no duplicate keys, no other layout); every folder of a staged
  file is a fixed one or a name;
- any string or number, and the file's whole text, that holds one of the bundle's own case
  identifiers in any case or common encoding (``identifiers.Identifiers``), and embedded image bytes.

The bytes ``verify`` returns are the ones uploaded, so nothing can change between check and upload.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from chexpercept.errors import Refused
from chexpercept.fileio import private_dir, write_new
from chexpercept.input_files import TEXT_FILE, read_input

from .identifiers import Identifiers, decode_base64
from .names import check_names
from .numbers import RANGES, number_problem

AGREEMENT = (
    "CheXpercept is built from MIMIC-CXR, credentialed data under the PhysioNet Credentialed Health Data "
    "Use Agreement: images, per-case results, conversations, raw responses and case ids (key_ids) may "
    "not be shared; only aggregate scores are published"
)
#: raw image and DICOM signatures
IMAGE_MAGIC: dict[bytes, str] = {
    b"\x89PNG": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF8": "GIF",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
    b"RIFF": "RIFF (WebP)",
    b"\x00\x00\x00\x0cjP": "JPEG 2000",
    b"\x93NUMPY": "NumPy array",
    b"PK\x03\x04": "zip archive",
}
_SAFE_REL = re.compile(r"^(?:\.?[A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_BLOB = re.compile(r"[A-Za-z0-9+/_-]{24,}={0,2}")
_MAX_DECIMALS = 6
#: the folders stagers write files in, besides a model's own (named by one of the upload's names)
STAGER_FOLDERS = frozenset({"models", "tables", ".eval_results"})


class PushRefused(Refused, ValueError):
    """What is about to be uploaded is not what the stager wrote, or not what its schema allows."""


@dataclass(frozen=True)
class Context:
    """What a schema checks strings against.

    ``names``: the models' names the upload may carry (``Text(names=True)``); each must be a name of
    the registry or a baseline, or a label (``names.check_names``: NameRefused otherwise), so a
    context, and so a schema, can never let free text through."""

    identifiers: Identifiers
    names: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", check_names(self.names))


# ------------------------------------------------------------------------------------ values
def image_kind(data: bytes) -> str | None:
    """The kind of image (or binary array) ``data`` starts with, or None."""
    if data[128:132] == b"DICM":
        return "DICOM"
    if data[:2] == b"BM" and data[6:10] == b"\x00\x00\x00\x00":  # two magic bytes: the reserved zeros too
        return "BMP"
    return next((kind for magic, kind in IMAGE_MAGIC.items() if data.startswith(magic)), None)


def embedded_image(text: str) -> str | None:
    """'<kind> image in base64' when a base64 or base64url run of ``text`` decodes to image bytes."""
    if "data:image/" in text:
        return "a data:image URI"
    for m in _BLOB.finditer(text):
        for start in range(4):
            kind = image_kind(decode_base64(m.group(0)[start:])[:140])
            if kind:
                return f"{kind} bytes in base64"
    return None


def check_string(value: str, where: str, ctx: Context) -> list[str]:
    """Identifiers and embedded images in one string."""
    found = ctx.identifiers.find(value)
    if found is not None:
        return [f"{where}: {found}"]
    image = embedded_image(value)
    return [f"{where}: {image}"] if image else []


def check_number(value: Any, where: str, ctx: Context, *, field: str) -> list[str]:
    """A number within the declared range of ``field`` (``numbers.RANGES``: finite, never a bool, an
    integer for a count), at most six decimals, that is no identifier."""
    problem = number_problem(value, field)
    out = [f"{where}: {problem}"] if problem else []
    if problem and (isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) >= 10**30):
        return out  # not a number, or too long to search
    if isinstance(value, float) and not math.isfinite(value):
        return out
    if isinstance(value, float) and round(value, _MAX_DECIMALS) != value:
        out.append(f"{where}: more than {_MAX_DECIMALS} decimals")
    found = ctx.identifiers.find_number(value)
    return out + ([f"{where}: the number is {found}"] if found else [])


def round_floats(value: Any, decimals: int = _MAX_DECIMALS) -> Any:
    """``value`` with every float rounded to ``decimals`` (what stagers write; what numbers may carry)."""
    if isinstance(value, float):
        return round(value, decimals) if math.isfinite(value) else value
    if isinstance(value, Mapping):
        return {k: round_floats(v, decimals) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(round_floats(v, decimals) for v in value)
    return value


# ------------------------------------------------------------------------------------ JSON-like specs
class Spec:
    """What one JSON or YAML value may be; ``check`` lists what is wrong with a value."""

    nullable: bool = False

    def check(self, value: Any, where: str, ctx: Context) -> list[str]:
        if value is None:
            return [] if self.nullable else [f"{where}: null where a value is required"]
        return self._check(value, where, ctx)

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        raise NotImplementedError

    def project(self, value: Any) -> Any:
        """``value`` reduced to what this spec knows (unknown keys dropped), for a stager to write."""
        return value


@dataclass
class Number(Spec):
    """A number of the declared field ``field`` (``numbers.RANGES``: its range, whether a count)."""

    field: str
    nullable: bool = True

    def __post_init__(self) -> None:
        if self.field not in RANGES:
            raise KeyError(f"Number({self.field!r}): no such field in numbers.RANGES")

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        return check_number(value, where, ctx, field=self.field)


@dataclass
class Boolean(Spec):
    nullable: bool = True

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        return [] if isinstance(value, bool) else [f"{where}: expected true or false"]


@dataclass
class Text(Spec):
    """A string from ``choices``, matching ``pattern``, or (``names``) one of the upload's names."""

    choices: Iterable[str] = ()
    pattern: str | None = None
    names: bool = False
    nullable: bool = False

    def __post_init__(self) -> None:
        self.choices = frozenset(self.choices)
        self._re = re.compile(self.pattern) if self.pattern else None

    def allows(self, value: str, ctx: Context) -> bool:
        return (
            value in self.choices
            or (self._re is not None and self._re.fullmatch(value) is not None)
            or (self.names and value in ctx.names)
        )

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        if not isinstance(value, str):
            return [f"{where}: expected a string, got {type(value).__name__}"]
        found = check_string(value, where, ctx)
        if found:
            return found
        if not self.allows(value, ctx):
            return [f"{where}: a string the stager does not write ({_short(value)})"]
        return []


@dataclass
class ListOf(Spec):
    item: Spec
    nullable: bool = True

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        if not isinstance(value, list):
            return [f"{where}: expected a list"]
        return [p for i, v in enumerate(value) for p in self.item.check(v, f"{where}[{i}]", ctx)]

    def project(self, value: Any) -> Any:
        return [self.item.project(v) for v in value] if isinstance(value, list) else value


@dataclass
class Obj(Spec):
    """An object with known keys only (``required`` must be there)."""

    fields: Mapping[str, Spec]
    required: Iterable[str] = ()
    nullable: bool = True

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        out = [f"{where}: missing {k!r}" for k in self.required if k not in value]
        for k, v in value.items():
            spec = self.fields.get(k)
            if spec is None:
                out.append(f"{_join(where, k)}: a key the stager does not write")
            else:
                out += spec.check(v, _join(where, k), ctx)
        return out

    def project(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: self.fields[k].project(v) for k, v in value.items() if k in self.fields}


@dataclass
class MapOf(Spec):
    """An object whose keys are any strings ``key`` allows."""

    key: Text
    value: Spec
    nullable: bool = True

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        if not isinstance(value, dict):
            return [f"{where}: expected an object"]
        out = []
        for k, v in value.items():
            out += [p.replace(": a string", ": a key", 1) for p in self.key.check(k, _join(where, k), ctx)]
            out += self.value.check(v, _join(where, k), ctx)
        return out

    def project(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: self.value.project(v) for k, v in value.items()}


@dataclass
class AnyOf(Spec):
    options: Sequence[Spec]
    nullable: bool = True

    def _check(self, value: Any, where: str, ctx: Context) -> list[str]:
        problems: list[str] = []
        for spec in self.options:
            found = spec.check(value, where, ctx)
            if not found:
                return []
            problems = problems or found
        return problems


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else str(key)


def _short(value: str, n: int = 60) -> str:
    return repr(value if len(value) <= n else value[:n] + "...")


# ------------------------------------------------------------------------------------ file schemas
@dataclass
class Schema:
    """How one staged file may look. ``suffix``: the only file ending allowed for it."""

    suffix: str

    def check(self, text: str, ctx: Context) -> list[str]:
        raise NotImplementedError


def json_text(data: Any) -> str:
    """JSON as every stager writes it (and JsonSchema expects it)."""
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise ValueError(f"the key {dup!r} appears twice")
    return dict(pairs)


@dataclass
class JsonSchema(Schema):
    spec: Spec = field(default_factory=lambda: Obj({}))
    suffix: str = ".json"

    def check(self, text: str, ctx: Context) -> list[str]:
        try:
            data = json.loads(text, object_pairs_hook=_no_duplicates)
        except ValueError as e:
            return [f"not the JSON the stager writes ({e})"]
        if json_text(data) != text:
            return ["not laid out as the stager writes JSON (edited after staging?)"]
        return self.spec.check(data, "", ctx)


@dataclass
class YamlSchema(Schema):
    spec: Spec = field(default_factory=lambda: Obj({}))
    dump: Callable[[Any], str] = field(default=lambda data: yaml_text(data))
    suffix: str = ".yaml"

    def check(self, text: str, ctx: Context) -> list[str]:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            return [f"not the YAML the stager writes ({str(e).splitlines()[0]})"]
        if self.dump(data) != text:
            return ["not laid out as the stager writes YAML (comments, other keys or an edit after staging)"]
        return self.spec.check(data, "", ctx)


def yaml_text(data: Any) -> str:
    """YAML as every stager writes it (and YamlSchema expects it): block style, keys in order."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000)


Cell = Text  #: a table cell is a string spec (choices, a pattern, or the upload's names)

NUMBER_CELL = Text(pattern=r"(–|-?\d{1,6}\.\d{1,2})")  #: 12.3 / 1.25 / –
EMPTY_OR_NUMBER = Text(pattern=r"(-?\d{1,8}(\.\d{1,6})?)?")  #: CSV: empty or a number
PCT_CELL = Text(pattern=r"–|-?\d{1,6}\.\d( \([+-]\d{1,6}\.\d\))?( \[-?\d{1,6}\.\d, -?\d{1,6}\.\d\])?")
NUM_CELL = Text(pattern=r"–|-?\d{1,6}\.\d{2}( \[-?\d{1,6}\.\d{2}, -?\d{1,6}\.\d{2}\])?")
SIGNED_CELL = Text(pattern=r"–|[+-]\d{1,6}\.\d( \[[+-]\d{1,6}\.\d, [+-]\d{1,6}\.\d\])?")
NAME_CELL = Text(names=True)
RANK_CELL = Text(pattern=r"–|\d{1,6}")


@dataclass
class TableShape:
    """A table a stager writes: its header and a cell spec per column."""

    header: tuple[str, ...]
    cells: tuple[Cell, ...]

    def check_row(self, row: Sequence[str], where: str, ctx: Context) -> list[str]:
        if len(row) != len(self.header):
            return [f"{where}: {len(row)} cells where the table has {len(self.header)}"]
        out = []
        for name, cell, value in zip(self.header, self.cells, row):
            out += cell.check(value, f"{where}, column {name!r}", ctx)
        return out


def _shapes(tables: Iterable[TableShape]) -> dict[tuple[str, ...], TableShape]:
    return {t.header: t for t in tables}


@dataclass
class CsvSchema(Schema):
    tables: Sequence[TableShape] = ()
    suffix: str = ".csv"

    def check(self, text: str, ctx: Context) -> list[str]:
        rows = list(csv.reader(io.StringIO(text)))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        if buf.getvalue() != text:
            return ["not laid out as the stager writes CSV"]
        if not rows:
            return ["an empty table"]
        shape = _shapes(self.tables).get(tuple(rows[0]))
        if shape is None:
            return [f"a table header the stager does not write ({_short(','.join(rows[0]))})"]
        return [p for i, row in enumerate(rows[1:], start=2) for p in shape.check_row(row, f"row {i}", ctx)]


def _cells(line: str) -> list[str]:
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") else inner
    return [c.strip() for c in inner.split("|")]


@dataclass
class MarkdownSchema(Schema):
    """Markdown of known lines (exact, or matching a pattern) and known tables."""

    lines: Iterable[str] = ()
    patterns: Iterable[str] = ()
    tables: Sequence[TableShape] = ()
    suffix: str = ".md"

    def __post_init__(self) -> None:
        self.lines = frozenset(self.lines)
        self._patterns = [re.compile(p) for p in self.patterns]

    def check(self, text: str, ctx: Context) -> list[str]:
        shapes = _shapes(self.tables)
        out: list[str] = []
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line.startswith("|"):
                if line not in self.lines and not any(p.fullmatch(line) for p in self._patterns):
                    out.append(f"line {i + 1}: a line the stager does not write ({_short(line)})")
                else:
                    out += check_string(line, f"line {i + 1}", ctx)
                i += 1
                continue
            start = i
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            out += self._table(lines[start:i], start + 1, shapes, ctx)
        return out

    def _table(
        self, block: list[str], first: int, shapes: Mapping[tuple[str, ...], TableShape], ctx: Context
    ) -> list[str]:
        header = tuple(_cells(block[0]))
        shape = shapes.get(header)
        if shape is None:
            return [f"line {first}: a table header the stager does not write ({_short(block[0])})"]
        if len(block) < 2 or block[1] != "|" + "|".join(" --- " for _ in header) + "|":
            return [f"line {first + 1}: not the table layout the stager writes"]
        return [
            p
            for j, row in enumerate(block[2:], start=first + 2)
            for p in shape.check_row(_cells(row), f"line {j}", ctx)
        ]


@dataclass
class ExactSchema(Schema):
    """A document rendered from a fixed template: the file must be exactly ``text``."""

    text: str = ""
    suffix: str = ".md"

    def check(self, text: str, ctx: Context) -> list[str]:
        if text == self.text:
            return []
        a, b = text.split("\n"), self.text.split("\n")
        line = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return [f"line {line + 1}: differs from the document the stager renders"]


# ------------------------------------------------------------------------------------ the manifest
@dataclass(frozen=True)
class StagedFile:
    """One file a stager wrote: where (relative, POSIX), its sha256 and size, its schema."""

    rel: str
    sha256: str
    size: int
    schema: Schema


class Manifest:
    """What a stager wrote into ``root`` (a new or empty folder), and the check before an upload."""

    def __init__(self, root: str | os.PathLike[str], context: Context) -> None:
        self.root = FsPath(root)
        if self.root.is_symlink():
            raise ValueError(f"{self.root}: the staging folder is a link")
        if self.root.exists() and any(self.root.iterdir()):
            raise ValueError(f"{self.root} is not empty: staging needs a new or empty folder")
        private_dir(self.root)
        self.context = context
        self.staged: dict[str, StagedFile] = {}

    @property
    def files(self) -> list[str]:
        return sorted(self.staged)

    def write(self, rel: str, text: str, schema: Schema) -> str:
        """Write ``text`` to ``root/rel`` and record it; returns ``rel``. Its folders must be fixed ones
        (``STAGER_FOLDERS``) or names of the upload (a model's folder): a path is published too."""
        if not _SAFE_REL.fullmatch(rel) or ".." in rel.split("/"):
            raise ValueError(f"{rel!r}: not a file name a stager writes")
        folders = rel.split("/")[:-1]
        if any(f not in STAGER_FOLDERS and f not in self.context.names for f in folders):
            raise ValueError(f"{rel!r}: a folder a stager does not write (not a fixed folder nor a name)")
        if not rel.endswith(schema.suffix):
            raise ValueError(f"{rel}: its schema allows only {schema.suffix} files")
        if rel in self.staged:
            raise ValueError(f"{rel} is staged twice")
        data = text.encode("utf-8")
        write_new(self.root / rel, data)
        self.staged[rel] = StagedFile(rel, hashlib.sha256(data).hexdigest(), len(data), schema)
        return rel

    def verify(self) -> dict[str, bytes]:
        """The staged files' bytes (relative path -> bytes, sorted) when every check passes; otherwise
        PushRefused naming each file and reason (see the module docstring)."""
        problems: list[str] = []
        found: dict[str, bytes] = {}
        seen: set[str] = set()
        for rel, what in self._walk():
            seen.add(rel)
            if what is not None:
                problems.append(f"{rel}: {what}")
                continue
            staged = self.staged.get(rel)
            if staged is None:
                problems.append(f"{rel}: not written by the stager (added to the staging folder)")
                continue
            data = _read_regular(self.root / rel)
            if len(data) != staged.size or hashlib.sha256(data).hexdigest() != staged.sha256:
                problems.append(f"{rel}: changed after staging (its sha256 differs from the manifest's)")
                continue
            found[rel] = data
        problems += [f"{rel}: staged but missing" for rel in self.files if rel not in seen]
        for rel, data in sorted(found.items()):
            problems += [f"{rel}: {p}" for p in check_file(data, self.staged[rel].schema, self.context)]
        if problems:
            raise PushRefused(
                "refusing to upload:\n  "
                + "\n  ".join(problems)
                + f"\n{AGREEMENT} (PhysioNet data use agreement)."
            )
        return dict(sorted(found.items()))

    def _walk(self) -> Iterable[tuple[str, str | None]]:
        """(relative path, None for a plain file or what else it is) for everything under root."""
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            base = FsPath(dirpath)
            for name in sorted(dirnames):
                if (base / name).is_symlink():
                    yield (base / name).relative_to(self.root).as_posix(), "a link to a folder"
            for name in sorted(filenames):
                path = base / name
                mode = os.lstat(path).st_mode
                rel = path.relative_to(self.root).as_posix()
                if stat.S_ISLNK(mode):
                    yield rel, "a link, not a file the stager wrote"
                elif not stat.S_ISREG(mode):
                    yield rel, "not a plain file"
                else:
                    yield rel, None


def _read_regular(path: FsPath) -> bytes:
    """A staged file's bytes: not through a link (O_NOFOLLOW), and a regular file within the limit of
    a staged text (chexpercept.input_files; a FIFO swapped in after the walk is refused, not waited on)."""
    return read_input(path, TEXT_FILE, what="staged file", follow_links=False)


def check_file(data: bytes, schema: Schema, ctx: Context) -> list[str]:
    """Why ``data`` may not go as a file of ``schema`` (empty when it may)."""
    kind = image_kind(data)
    if kind:
        return [f"{kind} bytes, not a {schema.suffix} file the stager writes"]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ["binary content, not UTF-8 text"]
    problems = schema.check(text, ctx)
    if not any("of the bundle" in p for p in problems):
        found = ctx.identifiers.find(text)
        if found is not None:
            problems.append(f"the text holds {found}")
    if not any("base64" in p or "data:image" in p for p in problems):
        image = embedded_image(text)
        if image:
            problems.append(f"the text holds {image}")
    return problems
