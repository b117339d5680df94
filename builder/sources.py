"""Readers for the generation inputs: CXR images, MIMIC-ILS, anatomy masks (folders, CheXmask CSV, CXAS),
ROSALIA predictions and expert review sheets (reference spec 5.1, 5.2).

Every mask is brought to the 1024 x 1024 frame the reference works in by nearest-neighbour scaling of
x and y independently; CXR images are scaled the same way (see ``load_cxr``), so masks drawn on the
original image, on a 512 x 512 copy (MIMIC-ILS) or on the 1024 x 1024 copy stay aligned.

Missing global inputs raise ``SourceError`` before any work starts; a missing or unreadable file of one
case raises ``CaseInputError`` naming the file, and only that case fails. Every file named by a source
(an ``image_path``, a ``seg_mask_path``, a ``dicom_id`` or ``pair_id`` used as a folder or file name)
must resolve inside its source folder, links followed (chexpercept.containment, ``source_file``);
``builder.source_paths.check_candidates`` refuses the candidates that do not before any work starts.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path as FsPath

import numpy as np
from PIL import Image, UnidentifiedImageError

from chexpercept.containment import ContainmentError, check_name, resolve_inside
from chexpercept.fileio import atomic_file
from chexpercept.input_files import IMAGE, SOURCE_TABLE, InputFileError, Limit, open_input, read_input
from chexpercept.input_json import loads, read_json
from chexpercept.os_errors import explain_os_error

from .render import encode_png

IMAGE_SIZE = 1024
ILS_JSON = "mimic_ils_instruction_answer.json"
ILS_MASK_DIR = "lesion_mask"
CHEX_FILES = {"right": "right_lung.png", "left": "left_lung.png"}
CXAS_FILES = {"right": "right lung.png", "left": "left lung.png"}
CHEXMASK_COLUMNS = {"right": "Right Lung", "left": "Left Lung"}
PHANTOM_MARKER = "PHANTOM_DATA.txt"


class SourceError(Exception):
    """A generation input as a whole is missing or malformed (reported before any case runs)."""


class CaseInputError(Exception):
    """A file one case needs is missing or unreadable; the message names the file."""


class OutsideSourceError(CaseInputError):
    """A source names a file outside its source folder (or a name unfit for a path); the message
    names the value, the field and the folder."""


def source_file(root: str | os.PathLike[str], relative: str, what: str) -> FsPath:
    """``root/relative`` resolved inside the source folder ``root`` (links followed), else
    OutsideSourceError naming ``what`` (the option or field the path came from)."""
    try:
        return resolve_inside(root, relative, what=what)
    except ContainmentError as e:
        raise OutsideSourceError(f"{e} (source folder {root})") from e


def source_name(value: str, what: str) -> str:
    """``value`` when it can be one part of a source path (a dicom_id, pair_id, ...), else
    OutsideSourceError naming ``what``."""
    try:
        return check_name(value, what)
    except ContainmentError as e:
        raise OutsideSourceError(str(e)) from e


def _read_source(path: FsPath, limit: Limit, what: str) -> bytes:
    """The bytes of one case's source file, a regular file within ``limit`` (chexpercept.input_files);
    CaseInputError naming the file otherwise (that case fails, named)."""
    try:
        return read_input(path, limit, what=what)
    except FileNotFoundError as e:
        raise CaseInputError(f"missing {what} {path}") from e
    except InputFileError as e:
        raise CaseInputError(str(e)) from None
    except OSError as e:
        raise CaseInputError(f"unreadable {what} {path}: {explain_os_error(e).what}") from e


def _open_image(path: FsPath) -> Image.Image:
    raw = _read_source(path, IMAGE, "file")
    try:
        im = Image.open(io.BytesIO(raw))
        im.load()
        return im
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise CaseInputError(f"unreadable image {path}: {e}") from e


def load_mask(path: str | os.PathLike[str], size: int = IMAGE_SIZE) -> np.ndarray:
    """A binary mask (any non-zero pixel) scaled to size x size by nearest neighbour."""
    im = _open_image(FsPath(path)).convert("L")
    if im.size != (size, size):
        im = im.resize((size, size), Image.Resampling.NEAREST)
    return np.asarray(im) > 0


def resize_mask(mask: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    if mask.shape == (size, size):
        return mask.astype(bool)
    im = Image.fromarray(mask.astype(np.uint8) * 255).resize((size, size), Image.Resampling.NEAREST)
    return np.asarray(im) > 0


@dataclass
class Cxr:
    """A CXR in the 1024 x 1024 frame: RGB pixels (None when not decoded), the PNG bytes to copy when
    the file passes through unchanged, and the size of the file it came from."""

    rgb: np.ndarray | None
    png_bytes: bytes | None
    original_size: tuple[int, int]  # (width, height)

    def png(self) -> bytes:
        """The CXR as the bundle stores it: the file's own bytes when it passes through, else encoded."""
        if self.png_bytes is not None:
            return self.png_bytes
        assert self.rgb is not None
        return encode_png(self.rgb)


def png_is_8bit_rgb(data: bytes) -> bool:
    """True when PNG ``data`` (its IHDR chunk) holds 8-bit RGB without alpha."""
    return len(data) > 25 and data[12:16] == b"IHDR" and data[24] == 8 and data[25] == 2


def png_has_exif(data: bytes) -> bool:
    """True when PNG ``data`` has an ``eXIf`` chunk (anywhere: the chunks are walked, not searched).

    Browsers apply its orientation, Pillow (and so every model backend and mask) does not, so such a
    file is re-encoded from its pixels rather than copied."""
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind == b"eXIf":
            return True
        if kind == b"IEND":
            return False
        pos += 12 + length
    return False


def load_cxr(path: str | os.PathLike[str], size: int = IMAGE_SIZE, *, decode: bool = True) -> Cxr:
    """Read a CXR. A size x size 8-bit RGB PNG without EXIF passes through byte for byte (and is not
    decoded unless ``decode``; its header and end marker are checked); anything else (MIMIC-CXR-JPG, a
    16-bit or grey PNG, a PNG with an ``eXIf`` chunk) is converted once, its EXIF orientation ignored
    as Pillow and every model backend ignore it, and written without metadata: 8-bit grey (16-bit grey stretched from its own minimum to maximum),
    scaled to size x size with Lanczos (x and y independently, no padding), RGB, as the reference's
    flat folder of 1024 x 1024 PNGs holds."""
    path = FsPath(path)
    raw = _read_source(path, IMAGE, "CXR image")
    try:
        im = Image.open(io.BytesIO(raw))
        original = im.size
        # the copy-as-is shortcut: only what the release holds (8-bit RGB PNG at size x size); a
        # 16-bit or grey PNG is converted like a JPG, or models would see 16-bit grey as white
        passthrough = (
            im.format == "PNG" and im.size == (size, size) and png_is_8bit_rgb(raw) and not png_has_exif(raw)
        )
        if passthrough and b"IEND\xaeB`\x82" not in raw[-64:]:
            raise CaseInputError(f"truncated CXR image {path} (no PNG end marker)")
        if passthrough and not decode:
            return Cxr(rgb=None, png_bytes=raw, original_size=original)
        im.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise CaseInputError(f"unreadable CXR image {path}: {e}") from e
    if im.mode not in ("L", "RGB"):
        if im.mode.startswith("I"):  # 16-bit grey: stretch to 8 bit
            arr = np.asarray(im, dtype=np.float64)
            arr = (arr - arr.min()) / max(1.0, float(arr.max() - arr.min())) * 255.0
            im = Image.fromarray(arr.round().astype(np.uint8))
        else:
            im = im.convert("L")
    if im.size != (size, size):
        im = im.resize((size, size), Image.Resampling.LANCZOS)
    rgb = np.asarray(im.convert("RGB"))
    return Cxr(rgb=rgb, png_bytes=raw if passthrough else None, original_size=original)


# ---------------------------------------------------------------------------------------------- CXR
@dataclass(frozen=True)
class CxrTree:
    """MIMIC-CXR-JPG (``files/pXX/pXXXXXXXX/sXXXXXXXX/<dicom_id>.jpg``) or a flat ``<dicom_id>.png`` folder."""

    root: str
    flat: bool

    @classmethod
    def jpg_tree(cls, root: str | os.PathLike[str]) -> CxrTree:
        r = FsPath(root)
        if not r.is_dir():
            raise SourceError(f"--mimic-cxr-jpg: folder {r} does not exist")
        if not (r / "files").is_dir():
            raise SourceError(
                f"--mimic-cxr-jpg: {r} has no files/ folder (expected files/pXX/pXXXXXXXX/sXXXXXXXX/*.jpg)"
            )
        return cls(str(r), flat=False)

    @classmethod
    def png_folder(cls, root: str | os.PathLike[str]) -> CxrTree:
        r = FsPath(root)
        if not r.is_dir():
            raise SourceError(f"--cxr-png: folder {r} does not exist")
        return cls(str(r), flat=True)

    def path(self, dicom_id: str, subject_id: str, study_id: str, image_path: str | None) -> FsPath:
        """Where the CXR is, resolved inside the tree; OutsideSourceError when a value would leave it."""
        if self.flat:
            what = "--cxr-png: dicom_id"
            return source_file(self.root, f"{source_name(dicom_id, what)}.png", what)
        files = FsPath(self.root) / "files"  # the image tree (it may itself be a link to another disk)
        if image_path:
            rel = image_path[len("files/") :] if image_path.startswith("files/") else image_path
            return source_file(files, rel, "MIMIC-ILS image_path")
        subject = source_name(subject_id if subject_id.startswith("p") else f"p{subject_id}", "subject_id")
        study = source_name(study_id if study_id.startswith("s") else f"s{study_id}", "study id")
        dicom = source_name(dicom_id, "MIMIC-ILS dicom_id")
        return source_file(files, f"{subject[:3]}/{subject}/{study}/{dicom}.jpg", "MIMIC-ILS ids")


# ---------------------------------------------------------------------------------------- MIMIC-ILS
def load_ils(root: str | os.PathLike[str]) -> dict:
    """The MIMIC-ILS instruction/answer JSON (``{"train": {study: {...}}, "val": ..., "test": ...}``)."""
    r = FsPath(root)
    path = r / ILS_JSON if r.is_dir() else r
    if not path.exists():
        raise SourceError(f"--mimic-ils: {path} does not exist (expected {ILS_JSON} in the MIMIC-ILS folder)")
    try:
        data = read_json(path, limit=SOURCE_TABLE, what="--mimic-ils")
    except (OSError, ValueError) as e:  # not a regular file, too large or deep, not JSON
        raise SourceError(f"--mimic-ils: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("train"), dict):
        raise SourceError(f"--mimic-ils: {path} has no 'train' object of studies")
    return data


# -------------------------------------------------------------------------------------- anatomy masks
def rle_decode(rle: str, height: int, width: int) -> np.ndarray:
    """CheXmask run-length encoding: 'start length ...' pairs, starts 1-based, row-major."""
    values = np.array(rle.split(), dtype=np.int64)
    if values.size % 2:
        raise ValueError("odd number of run-length values")
    starts = values[0::2] - 1
    ends = starts + values[1::2]
    if values.size and (starts.min() < 0 or ends.max() > height * width):
        raise ValueError(f"runs fall outside a {height} x {width} mask")
    delta = np.zeros(height * width + 1, dtype=np.int32)
    np.add.at(delta, starts, 1)
    np.add.at(delta, ends, -1)
    return (np.cumsum(delta[:-1]) > 0).reshape(height, width)


def rle_encode(mask: np.ndarray) -> str:
    """Inverse of ``rle_decode`` (for tests and phantom CheXmask tables)."""
    flat = np.concatenate([[0], mask.astype(np.int8).ravel(), [0]])
    runs = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs[1::2] -= runs[0::2]
    return " ".join(str(int(v)) for v in runs)


def _open_text(path: FsPath, what: str = "source table") -> io.TextIOBase:
    """A source table (a CSV, maybe gzipped) as text, from a regular file within
    chexpercept.input_files.SOURCE_TABLE (SourceError naming the file otherwise)."""
    try:
        raw = open_input(path, SOURCE_TABLE, what=what)
    except InputFileError as e:
        raise SourceError(str(e)) from None
    except OSError as e:
        raise SourceError(f"{what} {path} cannot be read: {e}") from e
    if path.suffix != ".gz":
        return io.TextIOWrapper(raw, encoding="utf-8", newline="")
    unzipped = gzip.GzipFile(fileobj=raw, mode="rb")
    unzipped.myfileobj = raw  # closed with it (as gzip.open(path) closes the file it opened)
    return io.TextIOWrapper(unzipped, encoding="utf-8", newline="")


def find_chexmask_csv(path: str | os.PathLike[str]) -> FsPath | None:
    """The CheXmask table given as a file, or the MIMIC-CXR-JPG table inside a CheXmask download folder."""
    p = FsPath(path)
    if p.is_file():
        return p
    if p.is_dir():
        for name in ("MIMIC-CXR-JPG.csv", "MIMIC-CXR-JPG.csv.gz"):
            for cand in (p / name, p / "OriginalResolution" / name):
                if cand.is_file():
                    return cand
    return None


def extract_chexmask_rows(csv_path: FsPath, dicom_ids: Iterable[str], out_path: FsPath) -> dict[str, int]:
    """Copy the rows of the needed images from the (huge) CheXmask table into a JSON-lines file.

    Returns dicom_id -> byte offset of its line, so workers read one line each instead of the table.
    """
    csv.field_size_limit(1 << 30)
    wanted = set(dicom_ids)
    offsets: dict[str, int] = {}
    with _open_text(csv_path) as f, atomic_file(out_path, "wb") as out:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration as e:
            raise SourceError(f"CheXmask table {csv_path} is empty") from e
        id_col = "dicom_id" if "dicom_id" in header else header[0]
        need = [id_col, "Height", "Width", *CHEXMASK_COLUMNS.values()]
        missing = [c for c in need if c not in header]
        if missing:
            raise SourceError(f"CheXmask table {csv_path} lacks column(s) {', '.join(missing)}")
        idx = {c: header.index(c) for c in need}
        for row in reader:
            if not row:
                continue
            dicom = row[idx[id_col]]
            if dicom not in wanted or dicom in offsets:
                continue
            record = {c: row[idx[c]] for c in need}
            record["dicom_id"] = dicom
            offsets[dicom] = out.tell()
            out.write(json.dumps(record).encode("utf-8") + b"\n")
    return offsets


@dataclass(frozen=True)
class Anatomy:
    """Where a case's lung masks come from: per-image folders, or rows extracted from the CheXmask table."""

    folder: str | None = None
    chexmask_rows: str | None = None
    chexmask_offsets: dict[str, int] | None = None
    cxas: str | None = None

    def chex_lungs(
        self, dicom_id: str, original_size: tuple[int, int] | None = None
    ) -> dict[str, np.ndarray]:
        """{'right': mask, 'left': mask} from CheXmask(-U), in the 1024 frame."""
        if self.folder is not None:
            name = source_name(dicom_id, "--anatomy: dicom_id")
            return {
                side: load_mask(source_file(self.folder, f"{name}/{file}", "--anatomy mask"))
                for side, file in CHEX_FILES.items()
            }
        assert self.chexmask_rows is not None and self.chexmask_offsets is not None
        if dicom_id not in self.chexmask_offsets:
            raise CaseInputError(f"image {dicom_id} has no row in the CheXmask table")
        with open_input(self.chexmask_rows, SOURCE_TABLE, what="CheXmask rows") as f:
            f.seek(self.chexmask_offsets[dicom_id])
            record = loads(f.readline(), source=f"{self.chexmask_rows} (row of {dicom_id})")
        try:
            h, w = int(float(record["Height"])), int(float(record["Width"]))
        except ValueError as e:
            raise CaseInputError(f"CheXmask row of {dicom_id}: bad Height/Width") from e
        if (
            original_size is not None
            and (w, h) != tuple(original_size)
            and original_size != (IMAGE_SIZE, IMAGE_SIZE)
        ):
            raise CaseInputError(
                f"CheXmask masks of {dicom_id} are {w}x{h} but its image is {original_size[0]}x{original_size[1]}; "
                "use the OriginalResolution table (OriginalResolution/MIMIC-CXR-JPG.csv)"
            )
        out = {}
        for side, col in CHEXMASK_COLUMNS.items():
            try:
                out[side] = resize_mask(rle_decode(record[col], h, w))
            except ValueError as e:
                raise CaseInputError(f"CheXmask row of {dicom_id}, column {col!r}: {e}") from e
        return out

    def cxas_lungs(self, dicom_id: str) -> dict[str, np.ndarray] | None:
        if self.cxas is None:
            return None
        name = source_name(dicom_id, "--cxas: dicom_id")
        return {
            side: load_mask(source_file(self.cxas, f"{name}/{file}", "--cxas mask"))
            for side, file in CXAS_FILES.items()
        }


def check_anatomy_folder(path: str | os.PathLike[str], what: str) -> None:
    if not FsPath(path).is_dir():
        raise SourceError(f"{what}: folder {path} does not exist")


# ------------------------------------------------------------------------------------ review sheets
def read_review_sheets(paths: Iterable[str | os.PathLike[str]]) -> dict[str, bool]:
    """key_id -> accepted, from expert sheets with ``key_id`` and ``optimal?`` (or ``optimal``) columns.

    Any non-empty value accepts (spec 5.2); a key accepted by any sheet is accepted.
    """
    verdicts: dict[str, bool] = {}
    for p in paths:
        path = FsPath(p)
        if not path.exists():
            raise SourceError(f"--review: sheet {path} does not exist")
        with _open_text(path, "--review sheet") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            column = "optimal" if "optimal" in fields else "optimal?" if "optimal?" in fields else None
            if "key_id" not in fields or column is None:
                raise SourceError(
                    f"--review: sheet {path} needs columns key_id and optimal? (has {', '.join(fields)})"
                )
            for row in reader:
                key = (row.get("key_id") or "").strip()
                if not key:
                    continue
                ok = bool((row.get(column) or "").strip())
                verdicts[key] = verdicts.get(key, False) or ok
    return verdicts


def iter_studies(ils: dict) -> Iterator[tuple[str, dict]]:
    """(study_id, study) of the train split, in file order (only train is used, as in the reference)."""
    yield from ils["train"].items()


def is_phantom(*folders: str | os.PathLike[str] | None) -> bool:
    """Whether any source folder carries the phantom-data marker written by ``synth-sources``."""
    for folder in folders:
        if folder is None:
            continue
        if (FsPath(folder) / PHANTOM_MARKER).is_file():
            return True
    return False
