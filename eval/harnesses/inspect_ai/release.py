"""The release a task runs on: read and validated once per process for the task and its solver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from chexpercept.case import Case
from chexpercept.errors import ReleaseNotFoundError

NO_DATA_DIR = (
    "no data_dir: pass -T data_dir=DIR, the folder of the CheXpercept release (the one holding "
    "chexpercept.json and chexpercept/), e.g. -T data_dir=physionet.org/files/chexpercept/1.0.0"
)


@dataclass(frozen=True)
class Release:
    """The selected cases of a release, by key_id, in release order, and the folder they are in."""

    root: str
    cases: dict[str, Case]
    #: what identifies the release's questions and images (chexpercept.json's sha256 and every
    #: image file's, as a run's identity holds them: chexpercept.bundle), one fingerprint
    fingerprint: str = ""


def selection(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """A task parameter naming several things (``-T paths=RR,RF`` or a YAML list) as a tuple."""
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(i).strip() for i in items if str(i).strip())


@lru_cache(maxsize=4)
def load_release(
    data_dir: str | None, lesions: tuple[str, ...] | None = None, paths: tuple[str, ...] | None = None
) -> Release:
    """The release at ``data_dir`` (validated, images checked), only ``lesions`` and ``paths``.
    Raises ReleaseNotFoundError (no data_dir, no such folder, not a release) or
    BundleValidationError naming the case and the file."""
    from chexpercept.bundle import read_bundle

    if data_dir is None or str(data_dir).strip() == "":
        raise ReleaseNotFoundError(data_dir, NO_DATA_DIR)
    bundle = read_bundle(
        data_dir, lesions=list(lesions) if lesions else None, paths=list(paths) if paths else None
    )
    if not bundle.cases:
        raise ReleaseNotFoundError(
            data_dir, f"data_dir {data_dir}: no case matches the selection", instructions=False
        )
    from chexpercept.bundle import images_fingerprint
    from chexpercept.results import settings_fingerprint

    made_on = {"questions": bundle.fingerprint(), "images": images_fingerprint(bundle.root)}
    return Release(
        root=str(bundle.root),
        cases={c.key_id: c for c in bundle.cases},
        fingerprint=settings_fingerprint(made_on),
    )
