"""The CheXpercept datasets builder: a local, credentialed release folder -> ``datasets.Dataset``.

``import chexpercept`` registers this builder under the name ``chexpercept`` (datasets 5.x has no
loading scripts), so that ``load_dataset("chexpercept", data_dir=...)`` works. Rows reference the
image files of the release instead of copying them (no second copy of credentialed data, nothing
decoded or re-encoded); ``embed_images=True`` stores the bytes for a portable copy.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any

import datasets

from chexpercept.bundle import IMAGE_CHECKS, JSON_NAME, CaseRef, check_release_dir, read_case, scan_bundle
from chexpercept.case import Turn
from chexpercept.containment import Root, Tree, read_image, resolve_inside
from chexpercept.fileio import PrivacyError, no_open_way, private_dir
from chexpercept.input_files import BUNDLE_JSON, IMAGE, check_input_stat, open_input
from chexpercept.vocab import LESIONS, PATHS

_DESCRIPTION = (
    "CheXpercept: a multi-stage benchmark of lesion perception on chest X-rays (detection, contour "
    "evaluation, contour revision, attribute extraction), built from MIMIC-CXR-JPG and MIMIC-ILS."
)
_CITATION = """\
@article{chexpercept2026,
  title   = {CheXpercept: A Benchmark for Evaluating Expert-Level Lesion Perception in Chest X-rays},
  journal = {arXiv preprint arXiv:2606.21020},
  year    = {2026}
}"""
_HOMEPAGE = "https://physionet.org/"
_LICENSE = "PhysioNet Credentialed Health Data License 1.5.0"
VERSION = datasets.Version("1.0.0")
#: number of row shards handed to workers; num_proc splits these
NUM_SHARDS = 16


def _turn_features() -> dict[str, Any]:
    return {
        "stage": datasets.Value("int8"),
        "task": datasets.Value("string"),
        "text": datasets.Value("string"),
        "images": datasets.List(datasets.Image()),
        "options": datasets.List(datasets.Value("string")),
        "answer_index": datasets.List(datasets.Value("int32")),
        "answer": datasets.Value("string"),
        "multi_select": datasets.Value("bool"),
    }


def _case_features() -> dict[str, Any]:
    return {
        "key_id": datasets.Value("string"),
        "lesion": datasets.ClassLabel(names=list(LESIONS)),
        "path": datasets.ClassLabel(names=[p.value for p in PATHS]),
    }


#: how to move the datasets cache, for the refusals that name it
CACHE_REMEDY = (
    "set HF_DATASETS_CACHE (or HF_HOME) to a folder of your own, or pass cache_dir= to load_dataset"
)


def private_lock(path: FsPath) -> None:
    """The lock file at ``path`` made, or kept, owner-only (0600) before datasets takes it: datasets
    makes it under the umask (0644) in the cache root, and another account that opened it and held a
    ``flock`` on it made every ``load_dataset`` of this release wait for ever, a cached one too (red
    team, stop 48). One that belongs to another account is refused (PrivacyError); a cache that
    cannot be written to is left to datasets' own error."""
    import stat

    try:
        os.makedirs(path.parent, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PrivacyError(
                f"{path} (datasets' lock of this release's cache) belongs to another account, which can "
                f"hold it and stop every load: {CACHE_REMEDY}"
            )
        if stat.S_IMODE(info.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


@dataclass
class ChexperceptConfig(datasets.BuilderConfig):
    """``sequences`` (one row per case) or ``items`` (one row per question), with case filters."""

    lesions: list[str] | None = None
    paths: list[str] | None = None
    embed_images: bool = False
    #: image check while building: none, exists, basic (default) or full (decode every image)
    check_images: str = "basic"
    #: set by load_dataset: sizes and modification times of the image files (part of the cache key)
    files_fingerprint: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check()

    def check(self) -> None:
        """ValueError naming the option that holds a value of the wrong kind; run at creation and
        again before a build (datasets sets load_dataset's keyword arguments on a copy of a named
        config without creating it anew, so ``embed_images="no"`` and ``lesions=[]`` got through)."""
        if self.check_images not in IMAGE_CHECKS:
            raise ValueError(
                f"check_images must be one of {', '.join(IMAGE_CHECKS)}, got {self.check_images!r}"
            )
        for name, known in (("lesions", LESIONS), ("paths", [p.value for p in PATHS])):
            values = getattr(self, name)
            if values is not None and (isinstance(values, str) or not isinstance(values, (list, tuple))):
                raise ValueError(f"{name} must be a list, e.g. {name}=[{known[0]!r}], got {values!r}")
            if values is not None and not values:  # [] selected every case (red team, stop 48)
                raise ValueError(f"{name}=[] selects nothing: name at least one, or leave {name} out for all")
        if not isinstance(self.embed_images, bool):  # "no" embedded the images (red team, stop 48)
            raise ValueError(f"embed_images must be True or False, got {self.embed_images!r}")


_CACHE_WARNED: set[str] = set()


def _warn_cache_once(reason: str) -> None:
    """Say once per process that the datasets cache could not be made private, and how to move it."""
    if reason in _CACHE_WARNED:
        return
    _CACHE_WARNED.add(reason)
    warnings.warn(
        f"the CheXpercept rows cached by datasets may be readable by other accounts ({reason}); set "
        "HF_DATASETS_CACHE (or HF_HOME) to a folder of your own, or pass cache_dir= to load_dataset",
        stacklevel=3,
    )


def _all_checks(mode: Any) -> bool:
    return str(mode) in ("all_checks", "VerificationMode.ALL_CHECKS")


class Chexpercept(datasets.GeneratorBasedBuilder):
    """CheXpercept release -> RR / RF / LF case sequences (or single question items) with Image features."""

    BUILDER_CONFIG_CLASS = ChexperceptConfig
    BUILDER_CONFIGS = [
        ChexperceptConfig(name="sequences", version=VERSION, description="One row per case: ordered turns."),
        ChexperceptConfig(name="items", version=VERSION, description="One row per question turn."),
    ]
    DEFAULT_CONFIG_NAME = "sequences"

    def _info(self) -> datasets.DatasetInfo:
        case = _case_features()
        if self.config.name == "items":
            features = {**case, "turn_index": datasets.Value("int32"), **_turn_features()}
        else:
            features = {
                **case,
                "dicom_id": datasets.Value("string"),
                "image": datasets.Image(),
                "turns": datasets.List(_turn_features()),
            }
        return datasets.DatasetInfo(
            description=_DESCRIPTION,
            features=datasets.Features(features),
            homepage=_HOMEPAGE,
            license=_LICENSE,
            citation=_CITATION,
        )

    def _build_cache_dir(self) -> str:
        """datasets' cache folder of this builder; first, the lock file datasets takes in the cache
        root before it looks at its cache (``DatasetBuilder.__init__``) is made this account's alone
        (``private_lock``)."""
        cache_dir = super()._build_cache_dir()
        root = str(self._cache_dir_root)
        if "://" not in root:
            # the root closed to other accounts' writes first, or the lock could be swapped between
            # its check and datasets' open (round 2: 4 of 6 loads hung on another account's lock)
            if os.path.isdir(root):
                no_open_way(root, remedy=CACHE_REMEDY)
            private_lock(FsPath(root) / (FsPath(cache_dir).as_posix().replace("/", "_") + ".lock"))
        return cache_dir

    def download_and_prepare(self, *args: Any, verification_mode: Any = None, **kwargs: Any) -> None:
        """As datasets', and ``verification_mode="all_checks"`` checks the release even when the
        dataset is already cached (every image decoded, SHA256SUMS.txt verified); a problem raises
        BundleValidationError naming the case and file."""
        self.config.check()
        # kept for _split_generators, which datasets does not hand the verification mode
        self._all_checks = _all_checks(verification_mode)
        self._protect_cache(kwargs.get("output_dir") or (args[0] if args else None))
        if self._all_checks and self._cached():
            self._scan(check_release_dir(self.config.data_dir))
        return super().download_and_prepare(*args, verification_mode=verification_mode, **kwargs)

    def _protect_cache(self, output_dir: str | None) -> None:
        """The folder this builder's Arrow files go to (``<datasets cache>/chexpercept``, or the
        ``output_dir`` given) is made owner-only before anything is written there: the files hold
        dicom ids, key_ids and, with ``embed_images``, the pixels (chexpercept/fileio.py). A folder
        that belongs to another account is refused (PrivacyError naming the folder, its owner and the
        variables that move the cache): its owner could read the rows whatever its mode. Where the
        cache is not a local folder (a remote file system), a warning says so once."""
        remedy = CACHE_REMEDY
        try:
            if output_dir:
                private_dir(output_dir, own=True, remedy=remedy)
                no_open_way(output_dir, remedy=remedy)
                return
            root = FsPath(self._cache_dir_root)
            relative = FsPath(self._cache_dir).relative_to(root)
            private_dir(root / relative.parts[0], own=True, remedy=remedy)
            # datasets writes below it by name, unchecked: no other account may swap a folder on the way
            no_open_way(root / relative.parts[0], remedy=remedy)
        except PrivacyError:
            raise
        except (OSError, ValueError) as e:
            _warn_cache_once(f"{e}")

    def _scan(self, root: FsPath) -> list[CaseRef]:
        """Validate the release (all_checks: every image decoded, SHA256SUMS.txt verified) and return
        the selected cases. Validation streams the JSON; only small references to the cases are
        kept, so memory stays flat whatever the bundle size (each shard re-reads its cases by byte
        span)."""
        all_checks = getattr(self, "_all_checks", False)
        return scan_bundle(
            root,
            lesions=self.config.lesions,
            paths=self.config.paths,
            check_images="full" if all_checks else self.config.check_images,
            verify_checksums=all_checks,
        )

    def _cached(self) -> bool:
        return bool(self._fs.exists(f"{self._output_dir}/{datasets.config.DATASET_INFO_FILENAME}"))

    def _split_generators(self, dl_manager: datasets.DownloadManager) -> list[datasets.SplitGenerator]:
        root = check_release_dir(self.config.data_dir)
        refs = self._scan(root)
        n = max(1, min(NUM_SHARDS, len(refs)))
        bounds = [round(i * len(refs) / n) for i in range(n + 1)]
        shards = [refs[bounds[i] : bounds[i + 1]] for i in range(n)]  # contiguous: row order = file order
        return [
            datasets.SplitGenerator(
                name=datasets.Split.TRAIN, gen_kwargs={"shards": shards, "root": str(root)}
            )
        ]

    def _image(self, root: Root, relative: str) -> dict[str, Any]:
        """An Image feature value; the path must resolve inside the release (validated before, checked
        again here, chexpercept.containment), and embedded bytes must be a PNG or JPEG."""
        if self.config.embed_images:
            return {"bytes": read_image(root, relative).data, "path": relative.rsplit("/", 1)[-1]}
        path = resolve_inside(root, relative)  # datasets opens it later: a regular file of bounded size
        check_input_stat(path, path.stat(), IMAGE, what="image")
        return {"bytes": None, "path": str(path)}

    def _turn_row(self, root: Root, turn: Turn) -> dict[str, Any]:
        row = turn.as_dict()
        row["images"] = [self._image(root, rel) for rel in turn.images]
        return row

    def _generate_examples(
        self, shards: list[list[CaseRef]], root: str
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        items = self.config.name == "items"
        root_path = FsPath(root)
        tree = Tree(root)
        for shard in shards:
            with open_input(root_path / JSON_NAME, BUNDLE_JSON, what=JSON_NAME) as f:
                cases = [read_case(f, ref) for ref in shard]
            for case in cases:
                head = {"key_id": case.key_id, "lesion": case.lesion, "path": case.path.value}
                turns = case.turns
                if items:
                    for i, turn in enumerate(turns):
                        yield f"{case.key_id}/{i}", {**head, "turn_index": i, **self._turn_row(tree, turn)}
                else:
                    yield (
                        case.key_id,
                        {
                            **head,
                            "dicom_id": case.dicom_id,
                            "image": self._image(tree, case.cxr_image),
                            "turns": [self._turn_row(tree, t) for t in turns],
                        },
                    )
