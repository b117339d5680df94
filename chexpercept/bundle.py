"""Reading and validating a release bundle: ``chexpercept.json`` plus ``chexpercept/<key_id>/...`` images.

The same format is shipped by PhysioNet and written by our generator, so this reader is the one
gate every consumer (datasets builder, runner, scorer) goes through. Problems are collected over
the whole bundle and raised together, each naming the key_id and the field or file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any, BinaryIO, Literal, get_args

from PIL import Image

from .case import Case
from .containment import Tree, image_format, resolve_inside
from .errors import WHERE_TO_GET, BundleValidationError, Problem, ReleaseNotFoundError, no_such_path
from .file_digest import DigestCache
from .fileio import write_atomic
from .input_files import (
    BUNDLE_JSON,
    IMAGE,
    TEXT_FILE,
    InputFileError,
    Limit,
    open_input,
    read_input_text,
    stat_problem,
)
from .input_json import JsonInputError
from .jsonstream import Span, iter_object_items, read_span
from .os_errors import explain_os_error
from .tree_walk import walk_files
from .validate import validate_entry
from .vocab import LESIONS, Path, parse_lesion, parse_path

JSON_NAME = "chexpercept.json"
IMAGES_DIR = "chexpercept"
CHECKSUMS_NAME = "SHA256SUMS.txt"
ImageCheck = Literal["none", "exists", "basic", "full"]
IMAGE_CHECKS: tuple[str, ...] = get_args(ImageCheck)

_PNG_TRAILER = b"\x00\x00\x00\x00IEND\xaeB`\x82"
#: Pillow modes whose pixels ``Image.convert("RGB")`` clips to 0..255 (what the transformers
#: backend, vLLM and most processors do to an image): 16- and 32-bit grey and float images
UNSAFE_MODES: dict[str, str] = {
    "I;16": "16-bit grey",
    "I;16B": "16-bit grey, big-endian",
    "I;16L": "16-bit grey, little-endian",
    "I;16N": "16-bit grey, native order",
    "I": "32-bit integer grey",
    "F": "32-bit float grey",
}
_JPEG_TRAILER = b"\xff\xd9"
#: the EXIF tag browsers rotate an image by (Pillow, and so every backend, ignores it)
EXIF_ORIENTATION = 0x0112


@dataclass
class Bundle:
    """A validated bundle: its folder and its cases in file order."""

    root: FsPath
    cases: list[Case]

    def __len__(self) -> int:
        return len(self.cases)

    def __iter__(self):
        return iter(self.cases)

    def abspath(self, relative: str) -> str:
        """The file of a bundle-relative path, resolved inside the bundle (ContainmentError otherwise)."""
        return str(resolve_inside(self.root, relative, what="bundle path"))

    @property
    def synthetic(self) -> bool:
        """True when the bundle was generated from phantom (synthetic) sources."""
        return any(bool(c.extra.get("provenance", {}).get("synthetic")) for c in self.cases)

    def fingerprint(self) -> str:
        return fingerprint(self.root)

    def images_fingerprint(self, cache: DigestCache | None = None) -> str:
        """``images_fingerprint(self.root)``: part of a run's identity (eval/runner/identity.py)."""
        return images_fingerprint(self.root, cache)


def fingerprint(data_dir: str | os.PathLike[str]) -> str:
    """sha256 of chexpercept.json: identifies the questions and answers a run was made on."""
    return _sha256(FsPath(data_dir) / JSON_NAME, BUNDLE_JSON)


def images_fingerprint(data_dir: str | os.PathLike[str], cache: DigestCache | None = None) -> str:
    """``sha256:`` over every file under the bundle's ``chexpercept/`` folder (the images, masks
    and overlays its conversations show) and its whole-file sha256 (chexpercept/file_digest.py:
    each file read once, then known by its device, inode, size and times): an image changed,
    replaced, added or removed in place changes it. A link is hashed as its target's text and
    content; a linked folder is entered, its files hashed like any other (chexpercept/tree_walk.py).
    Part of a run's identity (eval/runner/identity.py); cost in bench/RESULTS.md."""
    own = cache is None
    cache = cache or DigestCache()
    h = hashlib.sha256()
    try:
        images = os.path.join(os.fspath(data_dir), IMAGES_DIR)
        for rel in walk_files(images):  # linked folders entered (chexpercept/tree_walk.py)
            path = os.path.join(images, rel)
            if os.path.islink(path):
                target = os.readlink(path)
                try:
                    digest = f"link:{target}:{cache.digest(path)}"
                except OSError:
                    digest = f"link:{target}:absent"
            else:
                digest = cache.digest(path)
            h.update(f"{rel}\0{digest}\n".encode())
    finally:
        if own:
            cache.save()
    return "sha256:" + h.hexdigest()


def _sha256(path: FsPath, limit: Limit = BUNDLE_JSON) -> str:
    """sha256 of a regular file within ``limit`` (chexpercept.input_files), read in chunks."""
    h = hashlib.sha256()
    with open_input(path, limit, what=path.name) as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_fingerprint(data_dir: str | os.PathLike[str]) -> str:
    """A cheap fingerprint of the bundle's image files: sha256 over every file's path, size and
    modification time under ``chexpercept/`` (stat calls only, nothing read): a replaced, truncated,
    added or removed image changes it. About 50 ms for the 10,400 files of the release."""
    h = hashlib.sha256()
    entries: list[tuple[str, int, int]] = []
    images = os.path.join(os.fspath(data_dir), IMAGES_DIR)
    for rel in walk_files(images):  # linked folders entered (chexpercept/tree_walk.py)
        st = os.stat(os.path.join(images, rel))
        entries.append((rel, st.st_size, st.st_mtime_ns))
    for rel, size, mtime in sorted(entries):
        h.update(f"{rel}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()


def check_release_dir(data_dir: str | os.PathLike[str] | None) -> FsPath:
    """Resolve data_dir or raise ReleaseNotFoundError saying what the folder must contain."""
    if data_dir is None or str(data_dir).strip() == "":
        raise ReleaseNotFoundError(data_dir, "No data_dir given: pass the folder of the CheXpercept release.")
    root = FsPath(os.path.expanduser(str(data_dir))).resolve()
    if not root.exists():
        missing = no_such_path(data_dir)
        # a typo gets the folders it may have meant; only a folder with no near name gets where releases come from
        where = "" if "(did you mean" in missing else f" {WHERE_TO_GET}"
        raise ReleaseNotFoundError(root, f"data_dir {missing}.{where}", instructions=False)
    if not root.is_dir():
        hint = f"its folder {root.parent}" if root.name == JSON_NAME else f"the folder that holds {JSON_NAME}"
        raise ReleaseNotFoundError(
            root, f"data_dir {root} is a file, not a folder: pass {hint}.", instructions=False
        )
    if not any(root.iterdir()):
        raise ReleaseNotFoundError(root, f"data_dir {root} is empty.")
    if not (root / JSON_NAME).exists():  # a FIFO or a folder by that name is refused when it is read
        found = find_releases(root)
        if found:
            shown = " or ".join(str(f) for f in found[:3])
            more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
            raise ReleaseNotFoundError(
                root,
                f"data_dir {root} is not the release's folder, but {JSON_NAME} is in {shown}{more}: pass "
                f"that folder as data_dir (--data-dir {found[0]}).",
                instructions=False,
            )
        raise ReleaseNotFoundError(
            root, f"data_dir {root} is not a CheXpercept release: it has no {JSON_NAME}."
        )
    return root


#: how far ``find_releases`` looks below a folder, and how many folder entries it reads at most
FIND_DEPTH = 5
FIND_ENTRIES = 20000


def find_releases(folder: FsPath) -> list[FsPath]:
    """Release folders (holding chexpercept.json) near ``folder``, nearest first: the folders above
    it (a case folder or ``chexpercept/`` passed by mistake) and below it, up to FIND_DEPTH levels
    (PhysioNet's download lands in ``physionet.org/files/<project>/<version>/``). Hidden folders and
    links are not entered; at most FIND_ENTRIES entries are read, so a huge tree costs little."""
    above = [p for p in folder.parents[:3] if (p / JSON_NAME).is_file()]
    below: list[FsPath] = []
    budget = FIND_ENTRIES
    level = [folder]
    for _depth in range(FIND_DEPTH):
        next_level = []
        for current in level:
            try:
                with os.scandir(current) as entries:
                    for entry in entries:
                        budget -= 1
                        if budget < 0:
                            return above + sorted(below)
                        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                            continue
                        path = FsPath(entry.path)
                        if (path / JSON_NAME).is_file():
                            below.append(path)  # a release: its case folders are not searched
                        else:
                            next_level.append(path)
            except OSError:
                continue
        level = next_level
        if not level:
            break
    return above + sorted(below)


def iter_entries(root: FsPath) -> Iterator[tuple[str, Any, Span]]:
    """Stream (key_id, entry, byte span) from chexpercept.json, with errors naming the file: not a
    regular file, over its size limit (chexpercept.input_files.BUNDLE_JSON), not valid JSON, nested
    too deeply (chexpercept.input_json.MAX_DEPTH), not an object, a key_id twice."""
    path = root / JSON_NAME
    seen: dict[str, int] = {}
    try:
        with open_input(path, BUNDLE_JSON, what=JSON_NAME) as f:
            for n, (key_id, entry, span) in enumerate(iter_object_items(f, source=JSON_NAME), start=1):
                if key_id in seen:  # json.loads would keep the last silently; a case must be one entry
                    raise BundleValidationError(
                        root,
                        [
                            Problem(
                                key_id,
                                JSON_NAME,
                                f"key_id appears twice: entries {seen[key_id]} and {n} of the top-level "
                                f"object (the second at byte {span.start}); a case is one entry",
                            )
                        ],
                    )
                seen[key_id] = n
                yield key_id, entry, span
    except json.JSONDecodeError as e:
        raise BundleValidationError(root, [Problem("-", JSON_NAME, f"not valid JSON: {e}")]) from e
    except (InputFileError, JsonInputError) as e:
        raise BundleValidationError(root, [Problem("-", JSON_NAME, e.reason)]) from None
    except TypeError as e:
        raise BundleValidationError(
            root, [Problem("-", JSON_NAME, f"top level must be an object keyed by key_id, got {e}")]
        ) from e


@dataclass(frozen=True)
class CaseRef:
    """A validated case as a few bytes: enough to shard it and re-read it later."""

    key_id: str
    span: Span


def read_case(f: BinaryIO, ref: CaseRef) -> Case:
    """Re-read one case by its byte span from ``f``, the bundle's chexpercept.json opened in binary
    (``chexpercept.input_files.open_input(path, BUNDLE_JSON)``)."""
    return Case.from_entry(ref.key_id, read_span(f, ref.span, source=JSON_NAME), copy=False)


def read_bundle(
    data_dir: str | os.PathLike[str] | None,
    *,
    lesions: Sequence[str] | None = None,
    paths: Sequence[str | Path] | None = None,
    check_images: ImageCheck = "basic",
    verify_checksums: bool = False,
    workers: int = 8,
) -> Bundle:
    """Read, validate and filter a bundle, keeping every case in memory.

    check_images: ``none``; ``exists``; ``basic`` (default: exists, a PNG or JPEG whose header
    parses, file not truncated); ``full`` (every image is decoded). Whatever the mode, every path the
    bundle names must resolve inside ``data_dir`` (links followed; chexpercept.containment), or the
    case is refused. verify_checksums compares files against PhysioNet's SHA256SUMS.txt when the
    folder has one.
    """
    root = check_release_dir(data_dir)
    cases: list[Case] = []
    scan_bundle(
        root,
        lesions=lesions,
        paths=paths,
        check_images=check_images,
        verify_checksums=verify_checksums,
        workers=workers,
        keep=cases,
    )
    return Bundle(root=root, cases=cases)


def scan_bundle(
    root: FsPath,
    *,
    lesions: Sequence[str] | None = None,
    paths: Sequence[str | Path] | None = None,
    check_images: ImageCheck = "basic",
    verify_checksums: bool = False,
    workers: int = 8,
    keep: list[Case] | None = None,
) -> list[CaseRef]:
    """Validate a bundle entry by entry, in constant memory, and return references to the cases.

    Every problem of every case is collected and raised together as BundleValidationError. Cases
    passing the filters are appended to ``keep`` when a list is given.
    """
    if check_images not in IMAGE_CHECKS:
        raise ValueError(f"check_images must be one of {', '.join(IMAGE_CHECKS)}, got {check_images!r}")
    lesion_set = set(LESIONS) if not lesions else {parse_lesion(x) for x in lesions}
    path_set = set(Path) if not paths else {parse_path(p) for p in paths}
    problems: list[Problem] = []
    refs: list[CaseRef] = []
    pending: list[Case] = []

    def flush() -> None:
        if pending:  # containment is checked whatever check_images says
            problems.extend(check_case_images(root, pending, mode=check_images, workers=workers))
        pending.clear()

    entries = 0
    for key_id, entry, span in iter_entries(root):
        entries += 1
        entry_problems = validate_entry(key_id, entry)
        if entry_problems:
            problems.extend(entry_problems)
            # its images are checked as well where the entry still names them (a wrong answer_index
            # hid a missing or truncated image until the JSON was fixed; red team, stop 44)
            problems.extend(_images_of_a_faulty_entry(root, key_id, entry, check_images, workers))
            continue
        case = Case.from_entry(key_id, entry, copy=False)
        if case.lesion not in lesion_set or case.path not in path_set:
            continue
        refs.append(CaseRef(key_id, span))
        if keep is not None:
            keep.append(case)
        pending.append(case)
        if len(pending) >= 256:
            flush()
    flush()
    if not entries:  # red team, stop 48: "{}" passed as "OK: 0 cases", and load_dataset failed in datasets
        problems.append(
            Problem("(none)", JSON_NAME, "holds no cases (an empty object): not a release's file")
        )
    if verify_checksums:
        problems.extend(verify_sha256sums(root))
    if problems:
        raise BundleValidationError(root, problems)
    return refs


def _images_of_a_faulty_entry(
    root: FsPath, key_id: str, entry: Any, mode: ImageCheck, workers: int
) -> list[Problem]:
    """``check_case_images`` of an entry that has problems of its own, where its turns' images can
    still be told (its structure is whole: a value out of range, a missing text); else nothing."""
    # a broken structure: its images cannot be told, and the entry's problems say why
    try:
        case = Case.from_entry(key_id, entry, copy=False)
        case.turns  # noqa: B018 (its images, from every QA of its route)
    except Exception:
        return []
    return check_case_images(root, [case], mode=mode, workers=workers)


def check_case_images(
    root: FsPath, cases: Sequence[Case], *, mode: ImageCheck = "basic", workers: int = 8
) -> list[Problem]:
    """Every image each case's turns need must resolve inside the bundle folder, links followed
    (always, whatever ``mode``: see chexpercept.containment), and exist (and, by mode, parse or
    decode as PNG or JPEG)."""
    jobs = [(c.key_id, rel) for c in cases for t in c.turns for rel in t.images]
    if not jobs:
        return []
    tree = Tree(root)

    def one(job: tuple[str, str]) -> Problem | None:
        key_id, rel = job
        outside = tree.problem(rel)
        if outside:
            return Problem(key_id, rel, f"refused: {outside}")
        if mode == "none":
            return None
        message = check_image_file(tree.root / rel, mode)
        return Problem(key_id, rel, message) if message else None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return [p for p in pool.map(one, jobs, chunksize=64) if p is not None]


def check_image_file(path: FsPath, mode: ImageCheck = "basic") -> str | None:
    """None if the image is fine, else what is wrong with it. Whatever the mode, it must be a regular
    file within chexpercept.input_files.IMAGE (a FIFO or a device is refused, never opened for
    reading). ``basic`` and ``full`` accept only the formats chexpercept.containment allows (PNG,
    JPEG), recognised by their first bytes, and read the file once through one descriptor."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return "image file is missing"
    except OSError as e:
        return f"image file cannot be read: {explain_os_error(e).what}"
    problem = stat_problem(st, IMAGE)
    if problem:
        return f"image file {problem}"
    if mode in ("exists", "none"):
        return None
    if st.st_size == 0:
        return "image file is empty"
    try:
        with open_input(path, IMAGE, what="image") as f:
            return _check_image_bytes(f, st.st_size, mode)
    except InputFileError as e:
        return f"image file {e.reason}"
    except OSError as e:
        return f"image file cannot be read: {explain_os_error(e).what}"


def _check_image_bytes(f: BinaryIO, size: int, mode: ImageCheck) -> str | None:
    """check_image_file's checks of the bytes of an opened image file."""
    try:
        head = f.read(16)
        fmt = image_format(head)
        if fmt is None:
            return f"image does not decode as PNG or JPEG: the file starts with {head[:8]!r}"
        f.seek(0)
        with Image.open(f, formats=[fmt]) as im:
            image_mode = im.mode
            if mode == "full":
                im.load()
            orientation = im.getexif().get(EXIF_ORIENTATION, 1)
    except InputFileError:
        raise
    except OSError as e:
        if e.errno is not None:  # the system's (permissions, a folder, a failing disk), not the bytes'
            return f"image file cannot be read: {explain_os_error(e).what}"
        return f"image does not decode: {e}"
    except Exception as e:  # PIL raises many types for bad files
        return f"image does not decode: {e}"
    if orientation != 1:
        return (
            f"image carries EXIF orientation {orientation}: browsers (the report's case viewer, the review "
            "page) rotate it while models and masks use the stored pixels; store it without EXIF "
            "(chexpercept generate writes none)"
        )
    if image_mode in UNSAFE_MODES:
        return (
            f"image mode {image_mode} ({UNSAFE_MODES[image_mode]}) does not survive the conversion to "
            "RGB that model backends make (values above 255 are clipped: a model would see a white "
            "image); store 8-bit RGB, e.g. regenerate with chexpercept generate, which converts it"
        )
    trailer = _PNG_TRAILER if fmt == "PNG" else _JPEG_TRAILER
    f.seek(max(0, size - 64))
    tail = f.read()
    if trailer not in tail:
        return f"image is truncated (no {fmt} end marker)"
    return None


def read_sha256sums(root: FsPath) -> dict[str, str]:
    """Parse PhysioNet's ``SHA256SUMS.txt`` (``<hex>  <relative path>`` per line): a regular file within
    chexpercept.input_files.TEXT_FILE (InputFileError otherwise)."""
    sums: dict[str, str] = {}
    text = read_input_text(root / CHECKSUMS_NAME, TEXT_FILE, what=CHECKSUMS_NAME)
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        digest, _, name = line.partition(" ")
        name = name.strip().lstrip("*")
        if name.startswith("./"):
            name = name[2:]
        sums[name] = digest.lower()
    return sums


def verify_sha256sums(root: FsPath) -> list[Problem]:
    """Compare files against SHA256SUMS.txt if the release has one; nothing to do otherwise."""
    if not (root / CHECKSUMS_NAME).exists():
        return []
    problems = []
    tree = Tree(root)
    try:
        sums = read_sha256sums(root)
    except InputFileError as e:
        return [Problem("-", CHECKSUMS_NAME, e.reason)]
    for name, digest in sums.items():
        outside = tree.problem(name)
        if outside:
            problems.append(
                Problem(_key_of(name), f"{CHECKSUMS_NAME}: {name}", f"refused: {name!r} {outside}")
            )
            continue
        path = tree.root / name
        if not path.exists():
            problems.append(Problem(_key_of(name), name, "listed in SHA256SUMS.txt but missing"))
            continue
        try:
            actual = _sha256(path)
        except InputFileError as e:
            problems.append(Problem(_key_of(name), name, e.reason))
            continue
        if actual != digest:
            problems.append(Problem(_key_of(name), name, "sha256 does not match SHA256SUMS.txt"))
    return problems


def write_sha256sums(root: str | os.PathLike[str]) -> FsPath:
    """Write SHA256SUMS.txt over chexpercept.json and every image, as PhysioNet ships it."""
    root = FsPath(root)
    lines = []
    # the one walker of a tree (chexpercept.tree_walk): a linked case folder's images are listed too
    files = [root / JSON_NAME, *(root / IMAGES_DIR / name for name in walk_files(root / IMAGES_DIR))]
    for path in files:
        if path.is_file():
            digest = _sha256(path)
            lines.append(f"{digest}  {path.relative_to(root).as_posix()}")
    return write_atomic(root / CHECKSUMS_NAME, "\n".join(lines) + "\n")


def _key_of(relative: str) -> str:
    parts = relative.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == IMAGES_DIR else "-"
