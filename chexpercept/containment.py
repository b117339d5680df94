"""Containment: the one rule for every path taken from a bundle or a source tree, every image handed
to a model, and every file written under a folder the user named.

The data is credentialed (PhysioNet data use agreement), and a bundle or a source tree may have been
tampered with. Every consumer (bundle validation, the datasets builder, every model backend, the
report, generate's source readers, the review app) goes through the functions below, so that the rule
is written once:

1. **Names.** A value used as one path part (a key_id, a pair_id, a dicom_id, a study or subject id)
   must be a single component of portable characters: ASCII letters, digits, ``_``, ``-``, ``.`` and
   inner spaces, starting with a letter, a digit or ``_`` (so never ``.``, ``..``, a hidden name or an
   option-like ``-x``), at most 255 bytes. Refused: separators (``/``, ``\\``), NUL and other control
   characters, ``%`` (percent-encoded forms are never decoded, so they are refused rather than
   guessed at), any non-ASCII character (fullwidth dots and other look-alikes), empty values.
2. **Relative paths** (``contour_eval_qa.relative_path``, the options' ``relative_path``, MIMIC-ILS
   ``image_path`` and ``seg_mask_path``, lines of ``SHA256SUMS.txt``): one or more names joined by
   ``/``; never absolute, never a drive (``C:``), never ``~``, never an empty, ``.`` or ``..`` part.
3. **Resolution.** ``root/relative`` with every link followed (``os.path.realpath``) must lie inside
   the real ``root``: a file or folder link that points out of the tree is refused. The root itself
   may be a link (a bundle kept on another disk); a link inside the tree pointing elsewhere is not.
4. **Images.** What a backend sends or decodes must be a PNG or a JPEG: its magic bytes say so and
   Pillow parses its header as that format (never an arbitrary file behind an image extension); the
   MIME type comes from the bytes, never from the file name.
5. **Writes.** A file written under an output folder is ``out/relative`` with ``relative`` a safe
   relative path, and nothing on the way (an existing folder or the file itself) may be a link that
   leads out of ``out``.
6. **Files.** Every file read is a regular file within the size limit of its kind, checked on the
   opened descriptor before a byte is read (``chexpercept.input_files``): a FIFO, a device or an
   oversized file where an image should be is refused, never waited on or read without end.

Every refusal raises ``ContainmentError`` (a ``ValueError``; defined in ``chexpercept.errors``) whose message names the value and why;
``name_problem`` and ``relative_problem`` return the reason instead, for validators that collect every
problem of a bundle before raising.
"""

from __future__ import annotations

import functools
import io
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import TYPE_CHECKING

from .errors import ContainmentError
from .input_files import IMAGE, check_input_stat, open_input, read_input

__all__ = ["ContainmentError"]

if TYPE_CHECKING:
    from PIL import Image

#: the image formats a backend may send: Pillow format name -> MIME type
ALLOWED_IMAGE_FORMATS: dict[str, str] = {"PNG": "image/png", "JPEG": "image/jpeg"}
_MAGIC: tuple[tuple[bytes, str], ...] = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"))
#: bytes read from a file to identify its format and parse its header
HEADER_BYTES = 64 * 1024
MAX_NAME_BYTES = 255
_NAME_RE = r"[A-Za-z0-9_](?:[A-Za-z0-9._ -]{0,253}[A-Za-z0-9._-])?"
_NAME = re.compile(_NAME_RE)
#: the common case in one match: a relative path of safe ASCII names (the detailed reason otherwise)
_RELATIVE = re.compile(rf"{_NAME_RE}(?:/{_NAME_RE})*")
_DRIVE = re.compile(r"^[A-Za-z]:")


# ------------------------------------------------------------------------------------------ names
def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" {name}" if name else "")


def name_problem(value: object) -> str | None:
    """Why ``value`` cannot be used as one path part (a key_id, pair_id, dicom_id...), or None.

    See rule 1 of the module docstring. The reason is a phrase such as ``"contains '/' (a path
    separator)"``; callers prefix the field it came from.
    """
    if isinstance(value, str) and _NAME.fullmatch(value):
        return None
    if not isinstance(value, str):
        return f"expected a string, got {'null' if value is None else type(value).__name__}"
    if value == "":
        return "is empty"
    if value in (".", ".."):
        return f"is {value!r} (a folder reference, not a name)"
    for ch in value:
        if ch == "\x00":
            return "contains a NUL byte"
        if ch == "/":
            return "contains '/' (a path separator)"
        if ch == "\\":
            return "contains '\\' (a backslash: a path separator on Windows)"
        if ch == "%":
            return "contains '%' (percent-encoded names are not decoded; use the plain name)"
        if ord(ch) < 32 or ord(ch) == 127:
            return f"contains the control character {_describe(ch)}"
        if ord(ch) > 127:
            return f"contains the non-ASCII character {_describe(ch)} (only ASCII names are allowed)"
    if len(value) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    bad = sorted({ch for ch in value if not (ch.isalnum() or ch in "._- ")})
    if bad:
        return f"contains {', '.join(repr(c) for c in bad)} (allowed: letters, digits, '_', '-', '.', inner spaces)"
    if value.endswith(" "):
        return "ends with a space"
    return (
        f"starts with {value[0]!r} (a name starts with a letter, a digit or '_': never hidden or option-like)"
    )


def relative_problem(value: object) -> str | None:
    """Why ``value`` cannot be used as a path relative to its tree (rule 2), or None."""
    if isinstance(value, str) and _RELATIVE.fullmatch(value):
        return None
    if not isinstance(value, str):
        return f"expected a string, got {'null' if value is None else type(value).__name__}"
    if value == "":
        return "is empty"
    if "\x00" in value:
        return "contains a NUL byte"
    if value.startswith("/"):
        return "is an absolute path (it must be relative to its folder)"
    if value.startswith("~"):
        return "starts with '~' (a home folder; it must be relative to its folder)"
    if _DRIVE.match(value):
        return "starts with a drive letter (it must be relative to its folder)"
    parts = value.split("/")
    for part in parts:
        if part == "":
            return "has an empty part ('//' or a trailing '/')"
        if part in (".", ".."):
            return f"has a {part!r} part (it must not step out of or around its folder)"
        problem = name_problem(part)
        if problem:
            return f"part {part!r} {problem}"
    return None


def check_name(value: object, what: str) -> str:
    """``value`` when it is a safe single path part, else ContainmentError naming ``what``."""
    problem = name_problem(value)
    if problem:
        raise ContainmentError(f"{what} {value!r} {problem}")
    assert isinstance(value, str)
    return value


def check_relative(value: object, what: str) -> str:
    """``value`` when it is a safe relative path, else ContainmentError naming ``what``."""
    problem = relative_problem(value)
    if problem:
        raise ContainmentError(f"{what} {value!r} {problem}")
    assert isinstance(value, str)
    return value


# -------------------------------------------------------------------------------------- resolving
def real_root(root: str | os.PathLike[str]) -> FsPath:
    """The folder with every link resolved (the reference point of rule 3)."""
    return FsPath(os.path.realpath(os.fspath(root)))


def is_inside(root: FsPath, path: str | os.PathLike[str]) -> bool:
    """Whether the real path ``path`` is ``root`` or lies under it (both already resolved)."""
    r, p = os.fspath(root), os.fspath(path)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def _resolve_under(base: str, relative: str) -> str:
    """``os.path.realpath(base/relative)`` for a real ``base`` and a lexically safe ``relative``, in a
    few ``lstat`` calls: when no part of ``relative`` is a link the answer is ``base/relative`` (no
    ``..`` can occur), and realpath itself is asked only when one is."""
    path = base
    for part in relative.split("/"):
        path = f"{path}{os.sep}{part}"
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return os.path.join(base, relative)  # nothing beyond a missing part can be a link
        except OSError:
            break
        if stat.S_ISLNK(mode):
            break
    else:
        return path
    return os.path.realpath(os.path.join(base, relative))


class Tree:
    """A folder that relative paths are resolved in (rules 2 and 3); its real path is computed once,
    so checking every image of a release costs a few ``lstat`` calls per image."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = real_root(root)
        self._base = os.fspath(self.root)

    def problem(self, relative: str) -> str | None:
        """Why ``root/relative``, links followed, is not inside the folder, or None (the file need
        not exist: the existing part of the path is resolved)."""
        problem = relative_problem(relative)
        if problem:
            return problem
        target = _resolve_under(self._base, relative)
        if not is_inside(self.root, target):
            return (
                f"resolves to {target}, outside {self.root} (links are followed; link the whole folder "
                "instead)"
            )
        return None

    def resolve(self, relative: str, *, what: str = "path") -> FsPath:
        """``root/relative`` with links resolved, when it lies inside the folder; else ContainmentError.

        what: the field or file the path came from, for the message (e.g. ``"image_path"``)."""
        problem = self.problem(relative)
        if problem:
            raise ContainmentError(f"{what} {relative!r} {problem}")
        return FsPath(_resolve_under(self._base, relative))


#: a folder, or a Tree made of it once (cheaper when many paths are resolved in the same folder)
Root = str | os.PathLike[str] | Tree


def tree_of(root: Root) -> Tree:
    return root if isinstance(root, Tree) else Tree(root)


def outside_problem(root: Root, relative: str) -> str | None:
    """``Tree(root).problem(relative)``: why ``root/relative`` leaves ``root``, or None."""
    return tree_of(root).problem(relative)


def resolve_inside(root: Root, relative: str, *, what: str = "path") -> FsPath:
    """``Tree(root).resolve(relative)``: ``root/relative`` with links resolved, inside ``root``, or
    ContainmentError naming ``what``."""
    return tree_of(root).resolve(relative, what=what)


def output_path(out_dir: str | os.PathLike[str], relative: str, *, what: str = "output file") -> FsPath:
    """Where to write ``relative`` under ``out_dir`` (rule 5): ``out_dir/relative``, refused with
    ContainmentError when ``relative`` is not a safe relative path or an existing folder or file on
    the way is a link out of ``out_dir``. Folders are not created."""
    check_relative(relative, what)
    base = real_root(out_dir)
    target = base / relative
    resolved = os.path.realpath(target)
    if not is_inside(base, resolved):
        raise ContainmentError(
            f"{what} {relative!r} would be written at {resolved}, outside the output folder {base} "
            "(a link on the way leads out of it)"
        )
    return target


# ----------------------------------------------------------------------------------------- images
def image_format(head: bytes) -> str | None:
    """The allowed format (``"PNG"`` or ``"JPEG"``) that ``head``, a file's first bytes, starts with, or None."""
    for magic, fmt in _MAGIC:
        if head.startswith(magic):
            return fmt
    return None


def image_problem(head: bytes) -> str | None:
    """Why ``head`` (a file's first bytes, at least its header; the whole file will do) is not a PNG
    or JPEG whose header parses, or None (rule 4)."""
    fmt = image_format(head)
    if fmt is None:
        return f"is not a PNG or JPEG image (it starts with {head[:8]!r})"
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(head), formats=[fmt]) as im:
            width, height = im.size
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return f"starts like a {fmt} image but its header does not parse: {e}"
    if width <= 0 or height <= 0:
        return f"is a {fmt} image of size {width}x{height}"
    return None


@dataclass(frozen=True)
class ImageBytes:
    """An image file checked by rule 4: its bytes, its format and the MIME type of that format."""

    path: FsPath
    data: bytes
    format: str

    @property
    def mime(self) -> str:
        return ALLOWED_IMAGE_FORMATS[self.format]

    def base64(self) -> bytes:
        """The image's bytes in standard base64 (RFC 4648, padded), as ASCII bytes: 4/3 of the size.
        pybase64's SIMD encoder gives the very bytes of ``base64.b64encode`` at about 3.5x its speed
        (0.7 vs 2.6 ms for a 720 KB radiograph here: bench/runner_overlap.py --api)."""
        import pybase64

        return pybase64.b64encode(self.data)

    def data_url(self) -> str:
        """``data:<mime>;base64,...`` as OpenAI-compatible APIs take an image."""
        return f"data:{self.mime};base64," + self.base64().decode("ascii")


def _checked(path: FsPath, head: bytes, what: str) -> str:
    problem = image_problem(head)
    if problem:
        raise ContainmentError(f"{what} {path} {problem}")
    fmt = image_format(head)
    assert fmt is not None
    return fmt


def read_image(root: Root, relative: str, *, what: str = "image") -> ImageBytes:
    """The bytes of the image ``root/relative`` (rules 2 to 4, and 6: a regular file within
    ``chexpercept.input_files.IMAGE``), for a backend that sends them.

    Raises ContainmentError (outside the tree, not a regular file, too large, not a PNG/JPEG) or
    OSError (missing, unreadable).
    """
    path = resolve_inside(root, relative, what=what)
    data = read_input(path, IMAGE, what=what)
    return ImageBytes(path, data, _checked(path, data, what))


def image_file(root: Root, relative: str, *, what: str = "image") -> FsPath:
    """The resolved path of the image ``root/relative`` (rules 2 to 4 and 6), for a backend that hands
    an engine the file itself. Only the header is read, once per file version (path, size, modification
    time, inode): a conversation that re-sends its earlier images costs a ``stat`` each, which also
    refuses a file replaced by a FIFO, a device or a file over the size limit."""
    path = resolve_inside(root, relative, what=what)
    st = path.stat()
    check_input_stat(path, st, IMAGE, what=what)
    _header_format(os.fspath(path), st.st_size, st.st_mtime_ns, st.st_ino, what)
    return path


@functools.lru_cache(maxsize=1 << 16)
def _header_format(path: str, size: int, mtime_ns: int, inode: int, what: str) -> str:
    """The checked format of a file version (the cache keeps successes only: a refusal raises)."""
    with open_input(path, IMAGE, what=what) as f:
        head = f.read(HEADER_BYTES)
        if len(head) == HEADER_BYTES and image_problem(head):  # a JPEG whose header runs past it
            head += f.read()
    return _checked(FsPath(path), head, what)


def image_data_url(root: Root, relative: str) -> str:
    """``read_image(root, relative).data_url()``: the image as an OpenAI-compatible ``data:`` URL."""
    return read_image(root, relative).data_url()


def open_image(root: Root, relative: str, *, what: str = "image") -> Image.Image:
    """The image ``root/relative`` opened with Pillow restricted to its checked format (rules 2 to 4
    and 6), for a backend that decodes it; use as a context manager. Pixels are decoded on
    ``load``/``convert``."""
    from PIL import Image

    path = resolve_inside(root, relative, what=what)
    data = read_input(path, IMAGE, what=what)
    fmt = _checked(path, data, what)
    return Image.open(io.BytesIO(data), formats=[fmt])
